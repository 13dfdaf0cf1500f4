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

func (s *Server) routeRouters(mux *http.ServeMux) {
	mux.HandleFunc("POST /v2.0/routers", s.locked(s.createRouter))
	mux.HandleFunc("GET /v2.0/routers/{id}", s.locked(s.getRouter))
	mux.HandleFunc("PUT /v2.0/routers/{id}", s.locked(s.updateRouter))
	mux.HandleFunc("PUT /v2.0/routers/{id}/add_extraroutes", s.locked(s.extraRoutes(true)))
	mux.HandleFunc("PUT /v2.0/routers/{id}/remove_extraroutes", s.locked(s.extraRoutes(false)))
	mux.HandleFunc("PUT /v2.0/routers/{id}/add_router_interface", s.locked(s.addRouterInterface))
	s.routeFloatingIPs(mux)
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
