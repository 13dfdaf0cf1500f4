package labagents

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsbinding"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// hypervisor is the lab's Nova os-interface over the real Neutron: the
// simulated VMs are namespaces, so no Nova (whose virt driver here is
// fake) could plug a NIC into one. Attaching a port does what Nova and
// the hypervisor do: the port is claimed for the server and bound to the
// agents' host, and a NIC with the port's MAC is hot-plugged into the VM
// — down, without addresses — as the peer of tap<port-id[:11]>, which the
// linuxbridge agent then wires and guards with the port's security
// groups, exactly as it does the VM's own port. Detaching unplugs it and
// frees the port. The state is Neutron's (device_id): nothing here
// remembers a port.
type hypervisor struct {
	w  *world
	mu sync.Mutex // one attach or detach at a time, like Nova's instance lock
	// servers are the VMs by server ID (the VM port's device_id).
	servers map[string]*vm
	l       net.Listener
}

const computePrefix = "/compute/v2.1"

// startHypervisor serves os-interface for the VMs on a loopback port of
// its own; its URL is what vpcnid's computeEndpoint names.
func startHypervisor(w *world, vms ...*vm) (*hypervisor, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hypervisor{w: w, servers: map[string]*vm{}, l: l}
	for _, v := range vms {
		h.servers[prefix+"-"+v.name] = v
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+computePrefix+"/servers/{id}/os-interface", h.list)
	mux.HandleFunc("POST "+computePrefix+"/servers/{id}/os-interface", h.attach)
	mux.HandleFunc("GET "+computePrefix+"/servers/{id}/os-interface/{port}", h.get)
	mux.HandleFunc("DELETE "+computePrefix+"/servers/{id}/os-interface/{port}", h.detach)
	go http.Serve(l, mux)
	return h, nil
}

func (h *hypervisor) URL() string { return "http://" + h.l.Addr().String() + computePrefix + "/" }

func (h *hypervisor) Close() error { return h.l.Close() }

type attachment struct {
	PortState string     `json:"port_state"`
	FixedIPs  []ports.IP `json:"fixed_ips"`
	PortID    string     `json:"port_id"`
	NetID     string     `json:"net_id"`
	MACAddr   string     `json:"mac_addr"`
}

func attachmentOf(p ports.Port) attachment {
	return attachment{PortState: p.Status, FixedIPs: p.FixedIPs, PortID: p.ID, NetID: p.NetworkID, MACAddr: p.MACAddress}
}

func novaError(w http.ResponseWriter, status int, msg string) {
	key := map[int]string{400: "badRequest", 404: "itemNotFound", 409: "conflictingRequest"}[status]
	if key == "" {
		key = "computeFault"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{key: map[string]any{"code": status, "message": msg}})
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// server is the VM a request names, or a 404 answered.
func (h *hypervisor) server(w http.ResponseWriter, r *http.Request) (string, *vm) {
	id := r.PathValue("id")
	v := h.servers[id]
	if v == nil {
		novaError(w, http.StatusNotFound, fmt.Sprintf("Instance %s could not be found.", id))
	}
	return id, v
}

// portsOf lists the ports Neutron shows on the server.
func (h *hypervisor) portsOf(r *http.Request, id string) ([]ports.Port, error) {
	pages, err := ports.List(h.w.nc, ports.ListOpts{DeviceID: id}).AllPages(r.Context())
	if err != nil {
		return nil, err
	}
	return ports.ExtractPorts(pages)
}

func (h *hypervisor) list(w http.ResponseWriter, r *http.Request) {
	id, v := h.server(w, r)
	if v == nil {
		return
	}
	all, err := h.portsOf(r, id)
	if err != nil {
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := make([]attachment, 0, len(all))
	for _, p := range all {
		out = append(out, attachmentOf(p))
	}
	reply(w, http.StatusOK, map[string]any{"interfaceAttachments": out})
}

func (h *hypervisor) get(w http.ResponseWriter, r *http.Request) {
	id, v := h.server(w, r)
	if v == nil {
		return
	}
	p, err := ports.Get(r.Context(), h.w.nc, r.PathValue("port")).Extract()
	if err != nil || p.DeviceID != id {
		novaError(w, http.StatusNotFound, fmt.Sprintf("Port %s is not attached", r.PathValue("port")))
		return
	}
	reply(w, http.StatusOK, map[string]any{"interfaceAttachment": attachmentOf(*p)})
}

// bind claims a port for a server on the agents' host, or frees it (id "").
func (h *hypervisor) bind(r *http.Request, portID, id string) (*ports.Port, error) {
	owner, host := "vpcni-e2e:vm", h.w.host
	if id == "" {
		owner, host = "", ""
	}
	return ports.Update(r.Context(), h.w.nc, portID, portsbinding.UpdateOptsExt{
		UpdateOptsBuilder: ports.UpdateOpts{DeviceID: &id, DeviceOwner: &owner}, HostID: &host}).Extract()
}

func (h *hypervisor) attach(w http.ResponseWriter, r *http.Request) {
	id, v := h.server(w, r)
	if v == nil {
		return
	}
	var body struct {
		A struct {
			PortID string `json:"port_id"`
		} `json:"interfaceAttachment"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.A.PortID == "" {
		novaError(w, http.StatusBadRequest, "an interfaceAttachment with a port_id is needed")
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p, err := ports.Get(r.Context(), h.w.nc, body.A.PortID).Extract()
	switch {
	case gophercloud.ResponseCodeIs(err, http.StatusNotFound):
		novaError(w, http.StatusNotFound, fmt.Sprintf("Port %s could not be found.", body.A.PortID))
		return
	case err != nil:
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	case p.DeviceID != "":
		novaError(w, http.StatusConflict, fmt.Sprintf("Port %s is still in use.", p.ID))
		return
	}
	if p, err = h.bind(r, p.ID, id); err != nil {
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// The hot-plugged NIC: down and bare, as a guest sees a new one.
	tap, mtu := "tap"+p.ID[:11], fmt.Sprint(h.w.mtu)
	if err := run("ip", "link", "add", tap, "mtu", mtu, "type", "veth", "peer", "name", "nic"+p.ID[:8], "netns", v.ns, "address", p.MACAddress, "mtu", mtu); err != nil {
		_, _ = h.bind(r, p.ID, "")
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if err := run("ip", "link", "set", tap, "up"); err != nil {
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	reply(w, http.StatusOK, map[string]any{"interfaceAttachment": attachmentOf(*p)})
}

func (h *hypervisor) detach(w http.ResponseWriter, r *http.Request) {
	id, v := h.server(w, r)
	if v == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p, err := ports.Get(r.Context(), h.w.nc, r.PathValue("port")).Extract()
	if err != nil || p.DeviceID != id {
		novaError(w, http.StatusNotFound, fmt.Sprintf("Port %s is not attached", r.PathValue("port")))
		return
	}
	// The NIC goes with its tap (a veth pair).
	_ = netnsutil.Exec(v.ns, "ip", "link", "del", "nic"+p.ID[:8])
	_ = run("ip", "link", "del", "tap"+p.ID[:11])
	if _, err := h.bind(r, p.ID, ""); err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		novaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.WriteHeader(http.StatusAccepted)
}
