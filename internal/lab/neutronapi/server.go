package neutronapi

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Server is the endpoint. Every request runs under one lock: a write is
// checked and applied in one step (If-Match is a real compare-and-swap).
type Server struct {
	mu       sync.Mutex
	networks map[string]*Network
	subnets  map[string]*Subnet
	ports    map[string]*Port
	routers  map[string]*Router
	fips     map[string]*FloatingIP
	journal  []Event // see Events
	// MaxPairs is max_allowed_address_pair (10, like Neutron's default).
	MaxPairs int
	// MaxRoutes is max_routes (30, like Neutron's default).
	MaxRoutes int
	// OnChange, if set, runs after every successful write, under the lock
	// (the lab programs its fabric from it).
	OnChange func(*Server)
}

const project = "lab-project"

// New returns an empty endpoint.
func New() *Server {
	return &Server{networks: map[string]*Network{}, subnets: map[string]*Subnet{}, ports: map[string]*Port{},
		routers: map[string]*Router{}, fips: map[string]*FloatingIP{}, MaxPairs: 10, MaxRoutes: 30}
}

// Lock and Unlock hold the endpoint still (OnChange runs with it held).
func (s *Server) Lock()   { s.mu.Lock() }
func (s *Server) Unlock() { s.mu.Unlock() }

// Ports returns a copy of every port (for the fabric and for tests); call
// it with the endpoint held.
func (s *Server) Ports() []Port {
	out := make([]Port, 0, len(s.ports))
	for _, p := range s.ports {
		c := *p
		c.FixedIPs, c.Pairs = slices.Clone(p.FixedIPs), slices.Clone(p.Pairs)
		out = append(out, c)
	}
	return out
}

// Serve answers on l until it is closed.
func (s *Server) Serve(l net.Listener) error { return http.Serve(l, s.Handler()) }

// Handler routes the Neutron API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2.0/networks", s.locked(s.listNetworks))
	mux.HandleFunc("POST /v2.0/networks", s.locked(s.createNetwork))
	mux.HandleFunc("GET /v2.0/networks/{id}", s.locked(s.getNetwork))
	mux.HandleFunc("DELETE /v2.0/networks/{id}", s.locked(s.deleteNetwork))
	mux.HandleFunc("POST /v2.0/subnets", s.locked(s.createSubnet))
	mux.HandleFunc("GET /v2.0/subnets/{id}", s.locked(s.getSubnet))
	mux.HandleFunc("GET /v2.0/ports", s.locked(s.listPorts))
	mux.HandleFunc("POST /v2.0/ports", s.locked(s.createPorts))
	mux.HandleFunc("GET /v2.0/ports/{id}", s.locked(s.getPort))
	mux.HandleFunc("PUT /v2.0/ports/{id}", s.locked(s.updatePort))
	mux.HandleFunc("DELETE /v2.0/ports/{id}", s.locked(s.deletePort))
	mux.HandleFunc("PUT /v2.0/ports/{id}/tags/{tag}", s.locked(s.tagPort))
	s.routeRouters(mux)
	return mux
}

type handler func(r *http.Request, body []byte) (status int, out any, err *apiError)

func (s *Server) locked(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			writeJSON(w, 400, neutronError(errorf(400, "BadRequest", "%v", err)))
			return
		}
		s.mu.Lock()
		status, out, aerr := h(r, body)
		if aerr == nil && r.Method != http.MethodGet && s.OnChange != nil {
			s.OnChange(s)
		}
		// out may point into the state (a port): encoded under the lock,
		// before the next write changes it.
		var data []byte
		if aerr == nil && out != nil {
			data, _ = json.Marshal(out)
		}
		s.mu.Unlock()
		if aerr != nil {
			writeJSON(w, aerr.status, neutronError(aerr))
			return
		}
		if out == nil {
			w.WriteHeader(status)
			return
		}
		writeData(w, status, data)
	}
}

func neutronError(e *apiError) any {
	return map[string]any{"NeutronError": map[string]string{"type": e.typ, "message": e.msg, "detail": ""}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	writeData(w, status, data)
}

func writeData(w http.ResponseWriter, status int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func decode(body []byte, key string, into any) *apiError {
	var wrapper map[string]json.RawMessage
	if err := json.Unmarshal(body, &wrapper); err != nil {
		return errorf(400, "BadRequest", "Malformed request body: %v", err)
	}
	raw, ok := wrapper[key]
	if !ok {
		return errorf(400, "BadRequest", "Resource body required: %s", key)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return errorf(400, "BadRequest", "Invalid %s: %v", key, err)
	}
	return nil
}

func (s *Server) listNetworks(r *http.Request, _ []byte) (int, any, *apiError) {
	out := []*Network{}
	for _, n := range s.networks {
		if name := r.URL.Query().Get("name"); name == "" || n.Name == name {
			out = append(out, n)
		}
	}
	return 200, map[string]any{"networks": out}, nil
}

func (s *Server) createNetwork(_ *http.Request, body []byte) (int, any, *apiError) {
	n := &Network{}
	if err := decode(body, "network", n); err != nil {
		return 0, nil, err
	}
	n.ID, n.ProjectID, n.TenantID, n.Status, n.AdminUp, n.Revision, n.Subnets = newID(), project, project, "ACTIVE", true, 1, []string{}
	s.networks[n.ID] = n
	return 201, map[string]any{"network": n}, nil
}

func (s *Server) getNetwork(r *http.Request, _ []byte) (int, any, *apiError) {
	n, ok := s.networks[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "NetworkNotFound", "Network %s could not be found.", r.PathValue("id"))
	}
	return 200, map[string]any{"network": n}, nil
}

func (s *Server) deleteNetwork(r *http.Request, _ []byte) (int, any, *apiError) {
	id := r.PathValue("id")
	n, ok := s.networks[id]
	if !ok {
		return 0, nil, errorf(404, "NetworkNotFound", "Network %s could not be found.", id)
	}
	for _, p := range s.ports {
		if p.NetworkID == id {
			return 0, nil, errorf(409, "NetworkInUse", "Unable to complete operation on network %s. There are one or more ports still in use on the network.", id)
		}
	}
	for _, sid := range n.Subnets {
		delete(s.subnets, sid)
	}
	delete(s.networks, id)
	return 204, nil, nil
}

func (s *Server) createSubnet(_ *http.Request, body []byte) (int, any, *apiError) {
	sn := &Subnet{}
	if err := decode(body, "subnet", sn); err != nil {
		return 0, nil, err
	}
	n, ok := s.networks[sn.NetworkID]
	if !ok {
		return 0, nil, errorf(404, "NetworkNotFound", "Network %s could not be found.", sn.NetworkID)
	}
	if err := newSubnet(sn); err != nil {
		return 0, nil, err
	}
	sn.ID, sn.ProjectID, sn.TenantID, sn.Revision = newID(), project, project, 1
	s.subnets[sn.ID] = sn
	n.Subnets = append(n.Subnets, sn.ID)
	return 201, map[string]any{"subnet": sn}, nil
}

func (s *Server) getSubnet(r *http.Request, _ []byte) (int, any, *apiError) {
	sn, ok := s.subnets[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "SubnetNotFound", "Subnet %s could not be found.", r.PathValue("id"))
	}
	return 200, map[string]any{"subnet": sn}, nil
}

func (s *Server) listPorts(r *http.Request, _ []byte) (int, any, *apiError) {
	q := map[string][]string{}
	for k, v := range r.URL.Query() {
		if k != "fields" {
			q[k] = v
		}
	}
	out := []*Port{}
	for _, p := range s.ports {
		if p.matches(q) {
			out = append(out, p)
		}
	}
	return 200, map[string]any{"ports": out}, nil
}

// tagPort adds a tag to a port (Neutron answers 201 with no body, and a
// tag the port has already changes nothing).
func (s *Server) tagPort(r *http.Request, _ []byte) (int, any, *apiError) {
	p, ok := s.ports[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "PortNotFound", "Port %s could not be found.", r.PathValue("id"))
	}
	if tag := r.PathValue("tag"); !slices.Contains(p.Tags, tag) {
		p.Tags = append(p.Tags, tag)
		p.Revision++
	}
	return 201, nil, nil
}

func (s *Server) getPort(r *http.Request, _ []byte) (int, any, *apiError) {
	p, ok := s.ports[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "PortNotFound", "Port %s could not be found.", r.PathValue("id"))
	}
	return 200, map[string]any{"port": p}, nil
}

// portBody is what a create or update may set; nil fields are left alone.
type portBody struct {
	NetworkID    *string    `json:"network_id"`
	Name         *string    `json:"name"`
	Description  *string    `json:"description"`
	DeviceOwner  *string    `json:"device_owner"`
	DeviceID     *string    `json:"device_id"`
	FixedIPs     *[]FixedIP `json:"fixed_ips"`
	Pairs        *[]Pair    `json:"allowed_address_pairs"`
	PortSecurity *bool      `json:"port_security_enabled"`
}

// createPorts handles {"port": …} and the all-or-nothing bulk {"ports": […]}.
func (s *Server) createPorts(_ *http.Request, body []byte) (int, any, *apiError) {
	var bodies []portBody
	bulk := strings.Contains(string(body[:min(len(body), 16)]), `"ports"`)
	if bulk {
		if err := decode(body, "ports", &bodies); err != nil {
			return 0, nil, err
		}
	} else {
		var one portBody
		if err := decode(body, "port", &one); err != nil {
			return 0, nil, err
		}
		bodies = []portBody{one}
	}
	var made []*Port
	for _, b := range bodies {
		p, err := s.createPort(b)
		if err != nil {
			for _, m := range made { // all or nothing
				s.release(m, m.FixedIPs)
				delete(s.ports, m.ID)
			}
			return 0, nil, err
		}
		made = append(made, p)
	}
	if bulk {
		return 201, map[string]any{"ports": made}, nil
	}
	return 201, map[string]any{"port": made[0]}, nil
}

func (s *Server) createPort(b portBody) (*Port, *apiError) {
	if b.NetworkID == nil || s.networks[*b.NetworkID] == nil {
		return nil, errorf(404, "NetworkNotFound", "Network could not be found.")
	}
	p := &Port{ID: newID(), NetworkID: *b.NetworkID, MACAddress: newMAC(), PortSecurity: true, AdminUp: true, Tags: []string{},
		Status: "DOWN", ProjectID: project, TenantID: project, Revision: 1, FixedIPs: []FixedIP{}, Pairs: []Pair{}}
	s.ports[p.ID] = p
	want := s.defaultFixedIPs(p.NetworkID)
	if b.FixedIPs != nil {
		want = *b.FixedIPs
	}
	if err := s.setFixedIPs(p, want); err != nil {
		delete(s.ports, p.ID)
		return nil, err
	}
	if err := s.apply(p, b, false); err != nil {
		s.release(p, p.FixedIPs)
		delete(s.ports, p.ID)
		return nil, err
	}
	return p, nil
}

func (s *Server) updatePort(r *http.Request, body []byte) (int, any, *apiError) {
	p, ok := s.ports[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "PortNotFound", "Port %s could not be found.", r.PathValue("id"))
	}
	if m := r.Header.Get("If-Match"); strings.HasPrefix(m, "revision_number=") {
		want, err := strconv.Atoi(strings.TrimPrefix(m, "revision_number="))
		if err == nil && want != p.Revision {
			return 0, nil, errorf(412, "RevisionNumberConstraintFailed", "Constrained to %d, but current revision is %d", want, p.Revision)
		}
	}
	var b portBody
	if err := decode(body, "port", &b); err != nil {
		return 0, nil, err
	}
	before := *p
	before.FixedIPs, before.Pairs = slices.Clone(p.FixedIPs), slices.Clone(p.Pairs)
	if b.FixedIPs != nil {
		if err := s.setFixedIPs(p, *b.FixedIPs); err != nil {
			return 0, nil, err
		}
	}
	if err := s.apply(p, b, true); err != nil {
		s.setFixedIPs(p, before.FixedIPs) // back to what it was
		return 0, nil, err
	}
	p.Revision += revisionMoves(&before, p)
	return 200, map[string]any{"port": p}, nil
}

// revisionMoves is how far a port update moves the revision, as on
// Neutron Zed (measured): once for the port's addresses (fixed IPs or
// allowed address pairs) changing, once more for its own fields
// (description, name…) changing. Neutron bumps a write that changes
// nothing once after its answer; the lab does so at once.
func revisionMoves(before, after *Port) int {
	n := 0
	same := func(a, b []FixedIP) bool {
		return len(a) == len(b) && !slices.ContainsFunc(a, func(f FixedIP) bool { return !slices.Contains(b, f) })
	}
	if !same(before.FixedIPs, after.FixedIPs) || !slices.Equal(before.Pairs, after.Pairs) {
		n++
	}
	if before.Name != after.Name || before.Description != after.Description || before.DeviceOwner != after.DeviceOwner ||
		before.DeviceID != after.DeviceID || before.PortSecurity != after.PortSecurity {
		n++
	}
	return max(n, 1)
}

// apply sets the simple fields and the address pairs.
func (s *Server) apply(p *Port, b portBody, update bool) *apiError {
	if b.PortSecurity != nil {
		p.PortSecurity = *b.PortSecurity
	}
	if b.Pairs != nil {
		if len(*b.Pairs) > 0 && !p.PortSecurity {
			return errorf(409, "AddressPairAndPortSecurityRequired", "Port Security must be enabled in order to have allowed address pairs on a port.")
		}
		if len(*b.Pairs) > s.MaxPairs {
			return errorf(400, "AllowedAddressPairExhausted", "The number of allowed address pair exceeds the maximum %d.", s.MaxPairs)
		}
		seen := map[string]bool{}
		pairs := []Pair{}
		for _, ap := range *b.Pairs {
			if _, err := netip.ParsePrefix(ap.IPAddress); err != nil {
				if _, err := netip.ParseAddr(ap.IPAddress); err != nil {
					return errorf(400, "InvalidInput", "Invalid input for allowed_address_pairs: %q", ap.IPAddress)
				}
			}
			if ap.MACAddress == "" {
				ap.MACAddress = p.MACAddress
			}
			key := ap.IPAddress + "/" + ap.MACAddress
			if seen[key] {
				return errorf(400, "DuplicateAddressPairInRequest", "Request contains duplicate address pair: mac_address %s ip_address %s.", ap.MACAddress, ap.IPAddress)
			}
			seen[key] = true
			pairs = append(pairs, ap)
		}
		p.Pairs = pairs
	}
	for _, f := range []struct {
		v   *string
		dst *string
	}{{b.Name, &p.Name}, {b.Description, &p.Description}, {b.DeviceOwner, &p.DeviceOwner}, {b.DeviceID, &p.DeviceID}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if len(p.Description) > 255 {
		return errorf(400, "InvalidInput", "Invalid input for description: longer than 255")
	}
	return nil
}

// setFixedIPs replaces a port's addresses: every new one is checked before
// any is taken, so a failing request changes nothing.
func (s *Server) setFixedIPs(p *Port, want []FixedIP) *apiError {
	keep := map[netip.Addr]bool{}
	for _, f := range p.FixedIPs {
		keep[netip.MustParseAddr(f.IPAddress)] = false
	}
	var next []FixedIP
	taken := map[netip.Addr]bool{}
	type pending struct {
		sn *Subnet
		at int
	}
	var auto []pending
	for _, f := range want {
		sn := s.subnetFor(p.NetworkID, f)
		if sn == nil {
			return errorf(404, "SubnetNotFound", "Subnet %s could not be found.", f.SubnetID)
		}
		if sn.auto() {
			// Added below, whatever the request says of it.
			if mine, _ := eui64(sn.prefix, p.MACAddress); f.IPAddress != "" && f.IPAddress != mine.String() {
				return errorf(400, "AllocationOnAutoAddressSubnet", "IPv6 address %s cannot be directly assigned to a port on subnet %s as the subnet is configured for automatic addresses", f.IPAddress, sn.ID)
			}
			continue
		}
		if f.IPAddress == "" {
			auto = append(auto, pending{sn, len(next)})
			next = append(next, FixedIP{SubnetID: sn.ID})
			continue
		}
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil || !sn.prefix.Contains(a) {
			return errorf(400, "InvalidIpForSubnet", "IP address %s is not a valid IP for the specified subnet.", f.IPAddress)
		}
		if owner, used := sn.used[a]; used && owner != p.ID || taken[a] {
			return errorf(409, "IpAddressAlreadyAllocated", "IP address %s already allocated in subnet %s", a, sn.ID)
		}
		taken[a] = true
		if _, had := keep[a]; had {
			keep[a] = true
		}
		next = append(next, FixedIP{SubnetID: sn.ID, IPAddress: a.String()})
	}
	for _, pd := range auto {
		a, ok := pd.sn.firstFree(taken)
		if !ok {
			return errorf(409, "IpAddressGenerationFailure", "No more IP addresses available on network %s.", p.NetworkID)
		}
		taken[a] = true
		next[pd.at].IPAddress = a.String()
	}
	// Every port of a network with an automatic-address subnet holds its
	// EUI-64 address there, asked for or not, and keeps it through any
	// update.
	if n := s.networks[p.NetworkID]; n != nil {
		for _, id := range n.Subnets {
			if sn := s.subnets[id]; sn.auto() {
				a, _ := eui64(sn.prefix, p.MACAddress)
				taken[a] = true
				if _, had := keep[a]; had {
					keep[a] = true
				}
				next = append(next, FixedIP{SubnetID: sn.ID, IPAddress: a.String()})
			}
		}
	}
	var gone []FixedIP
	for _, f := range p.FixedIPs {
		if !keep[netip.MustParseAddr(f.IPAddress)] {
			gone = append(gone, f)
		}
	}
	s.release(p, gone)
	for _, f := range gone {
		s.note(Event{Kind: "fixed-ip-removed", Port: p.ID, Address: f.IPAddress})
	}
	for _, f := range next {
		s.subnets[f.SubnetID].used[netip.MustParseAddr(f.IPAddress)] = p.ID
	}
	slices.SortFunc(next, func(a, b FixedIP) int { return strings.Compare(a.IPAddress, b.IPAddress) })
	p.FixedIPs = next
	return nil
}

// defaultFixedIPs is what a port gets when its create names no fixed
// IPs: an address of the network's first IPv4 subnet and of its first
// IPv6 subnet whose addresses Neutron hands out (setFixedIPs adds those of
// automatic-address subnets).
func (s *Server) defaultFixedIPs(networkID string) []FixedIP {
	n := s.networks[networkID]
	if n == nil {
		return []FixedIP{{}}
	}
	var out []FixedIP
	for _, v := range []int{4, 6} {
		for _, id := range n.Subnets {
			if sn := s.subnets[id]; sn.IPVersion == v && !sn.auto() {
				out = append(out, FixedIP{SubnetID: id})
				break
			}
		}
	}
	if len(out) == 0 {
		return []FixedIP{{}}
	}
	return out
}

func (s *Server) subnetFor(networkID string, f FixedIP) *Subnet {
	if f.SubnetID != "" {
		if sn := s.subnets[f.SubnetID]; sn != nil && sn.NetworkID == networkID {
			return sn
		}
		return nil
	}
	if n := s.networks[networkID]; n != nil && len(n.Subnets) > 0 {
		if f.IPAddress != "" {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				for _, id := range n.Subnets {
					if s.subnets[id].prefix.Contains(a) {
						return s.subnets[id]
					}
				}
			}
		}
		return s.subnets[n.Subnets[0]]
	}
	return nil
}

func (s *Server) release(p *Port, ips []FixedIP) {
	for _, f := range ips {
		if sn := s.subnets[f.SubnetID]; sn != nil {
			a := netip.MustParseAddr(f.IPAddress)
			if sn.used[a] == p.ID {
				delete(sn.used, a)
			}
		}
	}
}

func (s *Server) deletePort(r *http.Request, _ []byte) (int, any, *apiError) {
	p, ok := s.ports[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "PortNotFound", "Port %s could not be found.", r.PathValue("id"))
	}
	s.release(p, p.FixedIPs)
	delete(s.ports, p.ID)
	s.portGone(p)
	return 204, nil, nil
}
