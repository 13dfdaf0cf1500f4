// Package novaapi is the lab's stand-in for Nova's os-interface API: it
// attaches a Neutron port of the lab's endpoint to a server (a node
// namespace) by claiming the port and hot-plugging a NIC with the port's
// MAC into the node, down and without addresses, as a hypervisor does;
// detach unplugs it and frees the port. It passes the same os-interface
// contract as a real Nova (neutrontest.RunOSInterface): attach is
// synchronous, detach answers 202, a port claimed elsewhere is refused
// with 409 "Port … is still in use.".
package novaapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
)

// Prefix is where the API is served beside the Neutron API; a client's
// endpoint is <base>/compute/v2.1/.
const Prefix = "/compute/v2.1"

// Server is the endpoint.
type Server struct {
	neutron *neutronapi.Server
	// mu serialises attaches and detaches, like Nova's instance lock.
	mu      sync.Mutex
	servers map[string]bool
	// Plug hot-plugs the NIC of port into server; Unplug removes it. Nil
	// hooks plug nothing (the contract tests without namespaces).
	Plug   func(server string, port neutronapi.Port) error
	Unplug func(server string, port neutronapi.Port) error
}

// New serves os-interface over a lab Neutron endpoint.
func New(neutron *neutronapi.Server) *Server {
	return &Server{neutron: neutron, servers: map[string]bool{}}
}

// AddServer makes a server known (a node of the lab).
func (s *Server) AddServer(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servers[id] = true
}

// Handler routes the os-interface API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix+"/servers/{id}/os-interface", s.onServer(s.list))
	mux.HandleFunc("POST "+Prefix+"/servers/{id}/os-interface", s.onServer(s.attach))
	mux.HandleFunc("GET "+Prefix+"/servers/{id}/os-interface/{port}", s.onServer(s.get))
	mux.HandleFunc("DELETE "+Prefix+"/servers/{id}/os-interface/{port}", s.onServer(s.detach))
	return mux
}

// attachment is one interface as Nova shows it.
type attachment struct {
	PortState string               `json:"port_state"`
	FixedIPs  []neutronapi.FixedIP `json:"fixed_ips"`
	PortID    string               `json:"port_id"`
	NetID     string               `json:"net_id"`
	MACAddr   string               `json:"mac_addr"`
	Tag       *string              `json:"tag"`
}

func attachmentOf(p neutronapi.Port) attachment {
	return attachment{PortState: p.Status, FixedIPs: p.FixedIPs, PortID: p.ID, NetID: p.NetworkID, MACAddr: p.MACAddress}
}

// fail answers with Nova's error body.
func fail(w http.ResponseWriter, status int, msg string) {
	key := map[int]string{400: "badRequest", 404: "itemNotFound", 409: "conflictingRequest"}[status]
	if key == "" {
		key = "computeFault"
	}
	writeJSON(w, status, map[string]any{key: map[string]any{"code": status, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// onServer runs h under the instance lock for a server that exists.
func (s *Server) onServer(h func(w http.ResponseWriter, r *http.Request, id string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		id := r.PathValue("id")
		if !s.servers[id] {
			fail(w, 404, fmt.Sprintf("Instance %s could not be found.", id))
			return
		}
		h(w, r, id)
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, id string) {
	ports := s.neutron.PortsOf(id)
	sort.Slice(ports, func(i, j int) bool { return ports[i].ID < ports[j].ID })
	out := []attachment{}
	for _, p := range ports {
		out = append(out, attachmentOf(p))
	}
	writeJSON(w, 200, map[string]any{"interfaceAttachments": out})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, id string) {
	p, found := s.neutron.Port(r.PathValue("port"))
	if !found || p.DeviceID != id {
		fail(w, 404, fmt.Sprintf("Network interface %s could not be found.", r.PathValue("port")))
		return
	}
	writeJSON(w, 200, map[string]any{"interfaceAttachment": attachmentOf(p)})
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request, id string) {
	var body struct {
		Attachment struct {
			PortID string `json:"port_id"`
			NetID  string `json:"net_id"`
		} `json:"interfaceAttachment"`
	}
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(data, &body); err != nil || body.Attachment.PortID == "" {
		fail(w, 400, "The lab's Nova attaches by port_id only (interfaceAttachment.port_id).")
		return
	}
	port, found := s.neutron.Port(body.Attachment.PortID)
	if !found {
		fail(w, 404, fmt.Sprintf("Port %s could not be found.", body.Attachment.PortID))
		return
	}
	if port.DeviceID != "" {
		// What Bind would refuse, refused before anything is plugged.
		_, err := s.neutron.Bind(port.ID, id)
		var be *neutronapi.BindError
		switch {
		case errors.As(err, &be):
			fail(w, be.Status, err.Error())
		case err == nil:
			// Freed meanwhile and now bound by this call: undo it; the
			// caller retries as it would after Nova's "still in use".
			_, _ = s.neutron.Unbind(port.ID, id)
			fail(w, 409, fmt.Sprintf("Port %s is still in use.", port.ID))
		default:
			fail(w, 500, err.Error())
		}
		return
	}
	if s.Plug != nil {
		if err := s.Plug(id, port); err != nil {
			fail(w, 500, fmt.Sprintf("Failed to attach network adapter device to %s: %v", id, err))
			return
		}
	}
	bound, err := s.neutron.Bind(port.ID, id)
	if err != nil {
		if s.Unplug != nil {
			_ = s.Unplug(id, port)
		}
		be, _ := err.(*neutronapi.BindError)
		if be == nil {
			be = &neutronapi.BindError{Status: 500, Msg: err.Error()}
		}
		fail(w, be.Status, be.Msg)
		return
	}
	writeJSON(w, 200, map[string]any{"interfaceAttachment": attachmentOf(bound)})
}

func (s *Server) detach(w http.ResponseWriter, r *http.Request, id string) {
	port, found := s.neutron.Port(r.PathValue("port"))
	if !found || port.DeviceID != id {
		// Nova Zed accepts the detach of a port it does not list and
		// does nothing in the background: so does the stand-in.
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if s.Unplug != nil {
		if err := s.Unplug(id, port); err != nil {
			fail(w, 500, fmt.Sprintf("Failed to detach network adapter device from %s: %v", id, err))
			return
		}
	}
	if _, err := s.neutron.Unbind(port.ID, id); err != nil {
		fail(w, 404, err.Error())
		return
	}
	w.WriteHeader(http.StatusAccepted)
}
