package neutronapi

import (
	"net/http"
	"net/netip"
	"slices"
)

// Route is a router's extra route.
type Route struct {
	Destination string `json:"destination"`
	NextHop     string `json:"nexthop"`
}

// Router is a Neutron router: extra routes, at most MaxRoutes of them.
type Router struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Routes    []Route `json:"routes"`
	ProjectID string  `json:"project_id"`
	TenantID  string  `json:"tenant_id"`
	Status    string  `json:"status"`
	Revision  int     `json:"revision_number"`
}

// FloatingIP maps an external address to a fixed IP of a port.
type FloatingIP struct {
	ID                string `json:"id"`
	FloatingNetworkID string `json:"floating_network_id"`
	FloatingIPAddress string `json:"floating_ip_address"`
	PortID            string `json:"port_id"`
	FixedIPAddress    string `json:"fixed_ip_address"`
	ProjectID         string `json:"project_id"`
	TenantID          string `json:"tenant_id"`
	Status            string `json:"status"`
}

func (s *Server) routeRouters(mux *http.ServeMux) {
	mux.HandleFunc("POST /v2.0/routers", s.locked(s.createRouter))
	mux.HandleFunc("GET /v2.0/routers/{id}", s.locked(s.getRouter))
	mux.HandleFunc("PUT /v2.0/routers/{id}", s.locked(s.updateRouter))
	mux.HandleFunc("PUT /v2.0/routers/{id}/add_extraroutes", s.locked(s.extraRoutes(true)))
	mux.HandleFunc("PUT /v2.0/routers/{id}/remove_extraroutes", s.locked(s.extraRoutes(false)))
	mux.HandleFunc("POST /v2.0/floatingips", s.locked(s.createFIP))
	mux.HandleFunc("GET /v2.0/floatingips", s.locked(s.listFIPs))
	mux.HandleFunc("DELETE /v2.0/floatingips/{id}", s.locked(s.deleteFIP))
}

// Routers and floating IPs, for the fabric; call with the endpoint held.
func (s *Server) Routers() []Router {
	var out []Router
	for _, r := range s.routers {
		c := *r
		c.Routes = slices.Clone(r.Routes)
		out = append(out, c)
	}
	return out
}

// FloatingIPs lists the floating IPs; call with the endpoint held.
func (s *Server) FloatingIPs() []FloatingIP {
	var out []FloatingIP
	for _, f := range s.fips {
		out = append(out, *f)
	}
	return out
}

func (s *Server) createRouter(_ *http.Request, body []byte) (int, any, *apiError) {
	r := &Router{}
	if err := decode(body, "router", r); err != nil {
		return 0, nil, err
	}
	r.ID, r.ProjectID, r.TenantID, r.Status, r.Revision, r.Routes = newID(), project, project, "ACTIVE", 1, []Route{}
	s.routers[r.ID] = r
	return 201, map[string]any{"router": r}, nil
}

func (s *Server) getRouter(req *http.Request, _ []byte) (int, any, *apiError) {
	r, ok := s.routers[req.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "RouterNotFound", "Router %s could not be found", req.PathValue("id"))
	}
	return 200, map[string]any{"router": r}, nil
}

// checkRoutes validates a router's whole route list.
func (s *Server) checkRoutes(routes []Route) *apiError {
	if len(routes) > s.MaxRoutes {
		return errorf(400, "RoutesExhausted", "Unable to complete operation for %s. The number of routes exceeds the maximum %d.", "router", s.MaxRoutes)
	}
	for _, rt := range routes {
		if _, err := netip.ParsePrefix(rt.Destination); err != nil {
			return errorf(400, "InvalidInput", "Invalid input for routes: destination %q", rt.Destination)
		}
		hop, err := netip.ParseAddr(rt.NextHop)
		onSubnet := false
		for _, sn := range s.subnets {
			onSubnet = onSubnet || err == nil && sn.prefix.Contains(hop)
		}
		if !onSubnet {
			return errorf(400, "InvalidRoutes", "Invalid format for routes: the nexthop %s is not connected with router", rt.NextHop)
		}
	}
	return nil
}

func (s *Server) updateRouter(req *http.Request, body []byte) (int, any, *apiError) {
	r, ok := s.routers[req.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "RouterNotFound", "Router %s could not be found", req.PathValue("id"))
	}
	var b struct {
		Routes *[]Route `json:"routes"`
	}
	if err := decode(body, "router", &b); err != nil {
		return 0, nil, err
	}
	if b.Routes != nil {
		if err := s.checkRoutes(*b.Routes); err != nil {
			return 0, nil, err
		}
		r.Routes = slices.Clone(*b.Routes)
	}
	r.Revision++
	return 200, map[string]any{"router": r}, nil
}

// extraRoutes adds or removes routes atomically, as Neutron's
// add_extraroutes/remove_extraroutes do.
func (s *Server) extraRoutes(add bool) handler {
	return func(req *http.Request, body []byte) (int, any, *apiError) {
		r, ok := s.routers[req.PathValue("id")]
		if !ok {
			return 0, nil, errorf(404, "RouterNotFound", "Router %s could not be found", req.PathValue("id"))
		}
		var b struct {
			Routes []Route `json:"routes"`
		}
		if err := decode(body, "router", &b); err != nil {
			return 0, nil, err
		}
		next := slices.Clone(r.Routes)
		for _, rt := range b.Routes {
			i := slices.Index(next, rt)
			switch {
			case add && i < 0:
				next = append(next, rt)
			case !add && i >= 0:
				next = slices.Delete(next, i, i+1)
			}
		}
		if err := s.checkRoutes(next); err != nil {
			return 0, nil, err
		}
		r.Routes = next
		r.Revision++
		return 200, map[string]any{"router": r}, nil
	}
}

func (s *Server) createFIP(_ *http.Request, body []byte) (int, any, *apiError) {
	f := &FloatingIP{}
	if err := decode(body, "floatingip", f); err != nil {
		return 0, nil, err
	}
	ext, ok := s.networks[f.FloatingNetworkID]
	if !ok || len(ext.Subnets) == 0 {
		return 0, nil, errorf(404, "NetworkNotFound", "Network %s could not be found.", f.FloatingNetworkID)
	}
	if f.PortID != "" {
		p, ok := s.ports[f.PortID]
		if !ok {
			return 0, nil, errorf(404, "PortNotFound", "Port %s could not be found.", f.PortID)
		}
		if f.FixedIPAddress == "" {
			if len(p.FixedIPs) != 1 {
				return 0, nil, errorf(400, "BadRequest", "Port %s has multiple fixed IPv4 addresses. Must provide a specific IPv4 address when assigning a floating IP", p.ID)
			}
			f.FixedIPAddress = p.FixedIPs[0].IPAddress
		}
		if !slices.ContainsFunc(p.FixedIPs, func(x FixedIP) bool { return x.IPAddress == f.FixedIPAddress }) {
			return 0, nil, errorf(400, "BadRequest", "Port %s does not have fixed ip %s", p.ID, f.FixedIPAddress)
		}
		for _, other := range s.fips {
			if other.PortID == f.PortID && other.FixedIPAddress == f.FixedIPAddress {
				return 0, nil, errorf(409, "FloatingIPPortAlreadyAssociated", "Cannot associate floating IP %s with port %s using fixed IP %s, as that fixed IP already has a floating IP on external network %s.", "new", p.ID, f.FixedIPAddress, ext.ID)
			}
		}
	}
	sn := s.subnets[ext.Subnets[0]]
	a, ok := sn.firstFree(nil)
	if !ok {
		return 0, nil, errorf(409, "IpAddressGenerationFailure", "No more IP addresses available on network %s.", ext.ID)
	}
	f.ID, f.FloatingIPAddress, f.ProjectID, f.TenantID, f.Status = newID(), a.String(), project, project, "ACTIVE"
	sn.used[a] = f.ID
	s.fips[f.ID] = f
	return 201, map[string]any{"floatingip": f}, nil
}

func (s *Server) listFIPs(*http.Request, []byte) (int, any, *apiError) {
	out := []*FloatingIP{}
	for _, f := range s.fips {
		out = append(out, f)
	}
	return 200, map[string]any{"floatingips": out}, nil
}

func (s *Server) deleteFIP(req *http.Request, _ []byte) (int, any, *apiError) {
	f, ok := s.fips[req.PathValue("id")]
	if !ok {
		return 0, nil, errorf(404, "FloatingIPNotFound", "Floating IP %s could not be found", req.PathValue("id"))
	}
	for _, sn := range s.subnets {
		delete(sn.used, netip.MustParseAddr(f.FloatingIPAddress))
	}
	delete(s.fips, f.ID)
	return 204, nil, nil
}
