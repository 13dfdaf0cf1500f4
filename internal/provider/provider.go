// Package provider is where a node's pod addresses come from: a cloud
// (Neutron fixed IPs, EC2 secondary IPs) or a static range. The agent owns
// this interface; each implementation passes the same contract tests.
package provider

import (
	"context"
	"errors"
	"net/netip"
)

// Provider obtains addresses for this node and gives them back.
//
// Implementations serialise their own writes per node (one writer per VM
// port) and never touch addresses they did not assign (ownership marks).
type Provider interface {
	// Name is the provider's type, e.g. "static", "openstack".
	Name() string
	// Assign obtains Count addresses of the provider's choosing plus every
	// address in Addresses, in as few cloud calls as it can. On partial
	// success it returns what it got and an error.
	Assign(ctx context.Context, req AssignRequest) ([]netip.Addr, error)
	// Release gives addresses back. Releasing an address the node does not
	// hold is not an error.
	Release(ctx context.Context, addrs []netip.Addr) error
	// Held lists every address the provider holds for this node on vpcni's
	// behalf (not addresses a person added by hand).
	Held(ctx context.Context) ([]netip.Addr, error)
	// Capacity is the most addresses this node may hold (0: unknown).
	Capacity(ctx context.Context) (int, error)
}

// AssignRequest asks for addresses.
type AssignRequest struct {
	Count     int
	Addresses []netip.Addr
}

// Errors a provider wraps so the agent can tell a person what to do.
var (
	// ErrExhausted: nothing more can be obtained (subnet full, limit hit).
	ErrExhausted = errors.New("no more addresses can be obtained")
	// ErrTaken: a specific address asked for is held by someone else.
	ErrTaken = errors.New("address is already taken")
	// ErrUnavailable: the provider's endpoint cannot be reached right now.
	ErrUnavailable = errors.New("provider endpoint unavailable")
)
