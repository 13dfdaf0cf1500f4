package routes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// Cloud is the router and the nodes' ports as the reconciler needs them:
// the router's routes, changed only atomically (all of a request or none,
// never a write of the whole list, which would race other writers), and
// a node's port with the pairs it lets through, written only if it is
// still as read. The reconciler owns it; each cloud implements it (for
// Neutron: internal/provider/openstack/cluster).
type Cloud interface {
	// Routes reads the router's routes. A route that does not parse is an
	// error: the budget would be miscounted.
	Routes(ctx context.Context) ([]Route, error)
	// AddRoutes adds routes in one atomic request. When the router has no
	// room, the error is an *ExhaustedError with the limit the cloud named.
	AddRoutes(ctx context.Context, rs []Route) error
	// RemoveRoutes removes routes in one atomic request (ones not there
	// are no error).
	RemoveRoutes(ctx context.Context, rs []Route) error
	// PortByIP finds the node port holding ip as its own address; none is
	// an ErrNoPort error.
	PortByIP(ctx context.Context, ip netip.Addr) (Port, error)
	// PortsByIP finds the ports of ips at once: an address no port has, or
	// several ports have, maps to an ErrNoPort error in missing.
	PortsByIP(ctx context.Context, ips []netip.Addr) (found map[netip.Addr]Port, missing map[netip.Addr]error, err error)
	// SetPairs writes a port's whole pair list if the port is still at
	// revision, and returns the port as written; a port changed since is
	// an ErrStale error, for a fresh read.
	SetPairs(ctx context.Context, portID string, revision int, pairs []Pair) (Port, error)
	// MaxPairs is how many pairs one port may hold, everyone's counted
	// (Neutron's max_allowed_address_pair).
	MaxPairs() int
}

// Port is a node's port (Neutron's VM port) as far as pairs go.
type Port struct {
	ID string
	// Revision is the port as read, for a write only if it is unchanged.
	Revision int
	Pairs    []Pair
}

// Pair is one address or CIDR a port lets through besides its own
// (Neutron's allowed address pair), with the MAC it is allowed from (""
// for the port's own).
type Pair struct {
	Address string
	MAC     string
}

// ErrNoPort: no node port has the node's address (or several have).
var ErrNoPort = errors.New("no Neutron port has the node's address")

// ErrStale: the port changed since it was read.
var ErrStale = errors.New("the port changed since it was read")

// ExhaustedError is the router's refusal of a route beyond its limit
// (Neutron's 400 RoutesExhausted).
type ExhaustedError struct {
	Max int
	Err error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("the router holds at most %d routes (max_routes): %v", e.Max, e.Err)
}
func (e *ExhaustedError) Unwrap() error { return e.Err }
