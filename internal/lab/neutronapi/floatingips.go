package neutronapi

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
)

// FloatingIP maps an external address to a fixed IP of a port.
type FloatingIP struct {
	ID                string  `json:"id"`
	FloatingNetworkID string  `json:"floating_network_id"`
	FloatingIPAddress string  `json:"floating_ip_address"`
	PortID            *string `json:"port_id"`
	FixedIPAddress    *string `json:"fixed_ip_address"`
	Description       string  `json:"description"`
	ProjectID         string  `json:"project_id"`
	TenantID          string  `json:"tenant_id"`
	Status            string  `json:"status"`
	Revision          int     `json:"revision_number"`
}

// Port and Fixed are the association ("" when there is none).
func (f *FloatingIP) Port() string  { return deref(f.PortID) }
func (f *FloatingIP) Fixed() string { return deref(f.FixedIPAddress) }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Event is one change of an association, recorded in the order the
// endpoint applied it: the lab's stand-in for reading Neutron's own log,
// so a test can say which of two writes came first.
type Event struct {
	Kind    string // fip-associated, fip-disassociated, fip-deleted, fixed-ip-removed, port-deleted
	FIP     string // the floating address (fip-*)
	Port    string
	Address string // the fixed IP
}

// Events returns the journal so far.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.journal)
}

func (s *Server) note(e Event) { s.journal = append(s.journal, e) }

func (s *Server) routeFloatingIPs(mux *http.ServeMux) {
	mux.HandleFunc("POST /v2.0/floatingips", s.locked(s.createFIP))
	mux.HandleFunc("GET /v2.0/floatingips", s.locked(s.listFIPs))
	mux.HandleFunc("GET /v2.0/floatingips/{id}", s.locked(s.getFIP))
	mux.HandleFunc("PUT /v2.0/floatingips/{id}", s.locked(s.updateFIP))
	mux.HandleFunc("DELETE /v2.0/floatingips/{id}", s.locked(s.deleteFIP))
}

// FloatingIPs lists the floating IPs; call with the endpoint held.
func (s *Server) FloatingIPs() []FloatingIP {
	var out []FloatingIP
	for _, f := range s.fips {
		out = append(out, *f)
	}
	return out
}

// fipBody is what a create or update may set. A key absent from an update
// leaves the field alone; "port_id": null disassociates, as in Neutron.
type fipBody struct {
	FloatingNetworkID string  `json:"floating_network_id"`
	FloatingIPAddress string  `json:"floating_ip_address"`
	PortID            *string `json:"port_id"`
	FixedIPAddress    *string `json:"fixed_ip_address"`
	Description       *string `json:"description"`
}

func (s *Server) createFIP(_ *http.Request, body []byte) (int, any, *apiError) {
	var b fipBody
	if err := decode(body, "floatingip", &b); err != nil {
		return 0, nil, err
	}
	ext, ok := s.networks[b.FloatingNetworkID]
	if !ok || len(ext.Subnets) == 0 {
		return 0, nil, errorf(404, "NetworkNotFound", "Network %s could not be found.", b.FloatingNetworkID)
	}
	sn := s.subnets[ext.Subnets[0]]
	var a netip.Addr
	if b.FloatingIPAddress != "" {
		want, err := netip.ParseAddr(b.FloatingIPAddress)
		if err != nil || !sn.prefix.Contains(want) {
			return 0, nil, errorf(400, "InvalidIpForSubnet", "IP address %s is not a valid IP for the specified subnet.", b.FloatingIPAddress)
		}
		if _, used := sn.used[want]; used {
			return 0, nil, errorf(409, "IpAddressAlreadyAllocated", "IP address %s already allocated in subnet %s", want, sn.ID)
		}
		a = want
	} else if a, ok = sn.firstFree(nil); !ok {
		return 0, nil, errorf(409, "IpAddressGenerationFailure", "No more IP addresses available on network %s.", ext.ID)
	}
	// Neutron allocates the external address first (its port on the
	// external network), then checks the association.
	f := &FloatingIP{FloatingNetworkID: ext.ID, Description: deref(b.Description)}
	if b.PortID != nil && *b.PortID != "" {
		if err := s.associate(f, *b.PortID, deref(b.FixedIPAddress)); err != nil {
			return 0, nil, err
		}
	} else if deref(b.FixedIPAddress) != "" {
		return 0, nil, errorf(400, "BadRequest", "Bad floatingip request: fixed_ip_address cannot be specified without a port_id.")
	}
	f.ID, f.FloatingIPAddress, f.ProjectID, f.TenantID, f.Revision = newID(), a.String(), project, project, 1
	f.Status = "DOWN"
	if f.Port() != "" {
		f.Status = "ACTIVE"
		s.note(Event{Kind: "fip-associated", FIP: f.FloatingIPAddress, Port: f.Port(), Address: f.Fixed()})
	}
	sn.used[a] = f.ID
	s.fips[f.ID] = f
	return 201, map[string]any{"floatingip": f}, nil
}

// associate points f at a fixed IP of a port, with Neutron's checks: the
// port has the address (or exactly one), and no other floating IP of the
// same external network holds that fixed IP.
func (s *Server) associate(f *FloatingIP, portID, fixed string) *apiError {
	p, ok := s.ports[portID]
	if !ok {
		return errorf(404, "PortNotFound", "Port %s could not be found.", portID)
	}
	if fixed == "" {
		if len(p.FixedIPs) != 1 {
			return errorf(400, "BadRequest", "Bad floatingip request: Port %s has multiple fixed IPv4 addresses.  Must provide a specific IPv4 address when assigning a floating IP.", p.ID)
		}
		fixed = p.FixedIPs[0].IPAddress
	}
	if !slices.ContainsFunc(p.FixedIPs, func(x FixedIP) bool { return x.IPAddress == fixed }) {
		return errorf(400, "BadRequest", "Bad floatingip request: Port %s does not have fixed ip %s.", p.ID, fixed)
	}
	if f.Port() == portID && f.ID != "" {
		f.FixedIPAddress = &fixed
		return nil
	}
	for _, other := range s.fips {
		if other.ID != f.ID && other.Port() == portID && other.Fixed() == fixed && other.FloatingNetworkID == f.FloatingNetworkID {
			return errorf(409, "FloatingIPPortAlreadyAssociated", "Cannot associate floating IP %s (%s) with port %s using fixed IP %s, as that fixed IP already has a floating IP on external network %s.", other.FloatingIPAddress, f.ID, p.ID, fixed, f.FloatingNetworkID)
		}
	}
	f.PortID, f.FixedIPAddress = &portID, &fixed
	return nil
}

func (s *Server) getFIP(r *http.Request, _ []byte) (int, any, *apiError) {
	f, ok := s.fips[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "FloatingIPNotFound", "Floating IP %s could not be found", r.PathValue("id"))
	}
	return 200, map[string]any{"floatingip": f}, nil
}

// listFIPs applies the filters vpcni and its tests use.
func (s *Server) listFIPs(r *http.Request, _ []byte) (int, any, *apiError) {
	q := r.URL.Query()
	out := []*FloatingIP{}
	for _, f := range s.fips {
		fields := map[string]string{"id": f.ID, "floating_ip_address": f.FloatingIPAddress, "floating_network_id": f.FloatingNetworkID,
			"port_id": f.Port(), "fixed_ip_address": f.Fixed(), "description": f.Description, "status": f.Status}
		match := true
		for key, want := range q {
			if got, known := fields[key]; known && !slices.Contains(want, got) {
				match = false
			}
		}
		if match {
			out = append(out, f)
		}
	}
	return 200, map[string]any{"floatingips": out}, nil
}

func (s *Server) updateFIP(r *http.Request, body []byte) (int, any, *apiError) {
	f, ok := s.fips[r.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "FloatingIPNotFound", "Floating IP %s could not be found", r.PathValue("id"))
	}
	var b fipBody
	if err := decode(body, "floatingip", &b); err != nil {
		return 0, nil, err
	}
	// Whether the body names port_id at all: absent keeps the association.
	var raw map[string]json.RawMessage
	_ = decode(body, "floatingip", &raw)
	_, namesPort := raw["port_id"]
	oldPort, oldFixed := f.Port(), f.Fixed()
	next := *f
	switch {
	case namesPort && deref(b.PortID) == "":
		if deref(b.FixedIPAddress) != "" {
			return 0, nil, errorf(400, "BadRequest", "Bad floatingip request: fixed_ip_address cannot be specified without a port_id.")
		}
		next.PortID, next.FixedIPAddress = nil, nil
	case namesPort:
		if err := s.associate(&next, *b.PortID, deref(b.FixedIPAddress)); err != nil {
			return 0, nil, err
		}
	}
	if b.Description != nil {
		next.Description = *b.Description
	}
	*f = next
	if oldPort != "" && (oldPort != f.Port() || oldFixed != f.Fixed()) {
		s.note(Event{Kind: "fip-disassociated", FIP: f.FloatingIPAddress, Port: oldPort, Address: oldFixed})
	}
	if f.Port() != "" && (oldPort != f.Port() || oldFixed != f.Fixed()) {
		s.note(Event{Kind: "fip-associated", FIP: f.FloatingIPAddress, Port: f.Port(), Address: f.Fixed()})
	}
	f.Status = "DOWN"
	if f.Port() != "" {
		f.Status = "ACTIVE"
	}
	f.Revision++
	return 200, map[string]any{"floatingip": f}, nil
}

func (s *Server) deleteFIP(req *http.Request, _ []byte) (int, any, *apiError) {
	f, ok := s.fips[req.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "FloatingIPNotFound", "Floating IP %s could not be found", req.PathValue("id"))
	}
	for _, sn := range s.subnets {
		if sn.used[netip.MustParseAddr(f.FloatingIPAddress)] == f.ID {
			delete(sn.used, netip.MustParseAddr(f.FloatingIPAddress))
		}
	}
	delete(s.fips, f.ID)
	s.note(Event{Kind: "fip-deleted", FIP: f.FloatingIPAddress, Port: f.Port(), Address: f.Fixed()})
	return 204, nil, nil
}

// portGone is Neutron's disassociate_floatingips on a port's deletion:
// the port's floating IPs stay, unassociated. Removing a fixed IP from a
// port that stays does nothing of the kind (Neutron 21 has no handler for
// it): the floating IP keeps pointing at the address, and the L3 agent
// keeps its DNAT — which is why vpcni detaches first.
func (s *Server) portGone(p *Port) {
	for _, f := range s.fips {
		if f.Port() == p.ID {
			s.note(Event{Kind: "fip-disassociated", FIP: f.FloatingIPAddress, Port: p.ID, Address: f.Fixed()})
			f.PortID, f.FixedIPAddress, f.Status = nil, nil, "DOWN"
			f.Revision++
		}
	}
	s.note(Event{Kind: "port-deleted", Port: p.ID})
}

// addRouterInterface plugs a router into a subnet at its gateway address,
// as Neutron does (a port owned by network:router_interface).
func (s *Server) addRouterInterface(req *http.Request, body []byte) (int, any, *apiError) {
	r, ok := s.routers[req.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "RouterNotFound", "Router %s could not be found", req.PathValue("id"))
	}
	var b struct {
		SubnetID string `json:"subnet_id"`
	}
	if err := json.Unmarshal(body, &b); err != nil || b.SubnetID == "" {
		return 0, nil, errorf(400, "BadRequest", "Bad router request: a subnet_id is required.")
	}
	sn, ok := s.subnets[b.SubnetID]
	if !ok {
		return 0, nil, errorf(404, "SubnetNotFound", "Subnet %s could not be found.", b.SubnetID)
	}
	owner, dev := "network:router_interface", r.ID
	p, err := s.createPort(portBody{NetworkID: &sn.NetworkID, DeviceOwner: &owner, DeviceID: &dev,
		FixedIPs: &[]FixedIP{{SubnetID: sn.ID, IPAddress: sn.GatewayIP}}})
	if err != nil {
		return 0, nil, err
	}
	return 200, map[string]any{"id": r.ID, "subnet_id": sn.ID, "subnet_ids": []string{sn.ID}, "port_id": p.ID}, nil
}
