package neutronapi

import "fmt"

// Bind claims a port for a Nova server, as Nova's interface attach does:
// device_id is the server, device_owner compute:nova, and the port goes
// ACTIVE (the lab's NIC is plugged at once). A port claimed by any device
// is refused with what Nova Zed answers a member (measured, test/nova):
// 409 "Port … is still in use."
func (s *Server) Bind(portID, serverID string) (Port, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.ports[portID]
	switch {
	case !ok:
		return Port{}, &BindError{Status: 404, Msg: fmt.Sprintf("Port %s could not be found.", portID)}
	case p.DeviceID != "":
		return Port{}, &BindError{Status: 409, Msg: fmt.Sprintf("Port %s is still in use.", portID)}
	}
	p.DeviceID, p.DeviceOwner, p.Status = serverID, "compute:nova", "ACTIVE"
	p.Revision++
	if s.OnChange != nil {
		s.OnChange(s)
	}
	return s.copyOf(p), nil
}

// Unbind gives a port back from a Nova server, as Nova's detach does.
func (s *Server) Unbind(portID, serverID string) (Port, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.ports[portID]
	if !ok || p.DeviceID != serverID {
		return Port{}, &BindError{Status: 404, Msg: fmt.Sprintf("Port %s is not attached", portID)}
	}
	p.DeviceID, p.DeviceOwner, p.Status = "", "", "DOWN"
	p.Revision++
	if s.OnChange != nil {
		s.OnChange(s)
	}
	return s.copyOf(p), nil
}

// Port returns a copy of one port.
func (s *Server) Port(id string) (Port, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.ports[id]
	if !ok {
		return Port{}, false
	}
	return s.copyOf(p), true
}

// PortsOf returns copies of the ports bound to a device.
func (s *Server) PortsOf(deviceID string) []Port {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Port
	for _, p := range s.ports {
		if p.DeviceID == deviceID {
			out = append(out, s.copyOf(p))
		}
	}
	return out
}

func (s *Server) copyOf(p *Port) Port {
	c := *p
	c.FixedIPs, c.Pairs = append([]FixedIP(nil), p.FixedIPs...), append([]Pair(nil), p.Pairs...)
	return c
}

// BindError is a refusal of Bind or Unbind, with the HTTP status Nova
// answers it with.
type BindError struct {
	Status int
	Msg    string
}

func (e *BindError) Error() string { return e.Msg }
