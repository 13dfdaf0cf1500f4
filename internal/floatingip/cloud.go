// Package floatingip is what vpcni-controller asks of a cloud for pods'
// floating IPs: find or create a pod's floating IP and point it at the
// pod's address on its port, and detach it (then delete or keep it) when
// the pod goes. The reconciler (vpcni-controller's FloatingIPs) and
// vpcnictl trace own this door; each cloud implements Cloud (Neutron's is
// internal/provider/openstack/cluster).
//
// Every floating IP vpcni handles carries a mark with its owner and
// policy, "vpcni pod=<namespace>/<name> policy=<release|retain>" (in
// Neutron, its description): the owner is found again from the cloud
// alone (a retained address comes back to a re-created pod of the same
// name; a pod gone while the controller was down is still detached), and
// the policy outlives the pod.
package floatingip

import (
	"context"
	"errors"
	"net/netip"
	"strings"
)

// Policies: what becomes of a floating IP once its pod is gone.
const (
	Release = "release" // deleted: the address goes back to the external network
	Retain  = "retain"  // kept, unassociated, for the next pod of that name
)

// Want is a pod's floating IP as its annotations ask for it.
type Want struct {
	Owner   string     // "namespace/name"
	Network string     // the external network, ID or name
	Address netip.Addr // invalid: any ("auto")
	Policy  string
	PortID  string     // the port holding the pod's address
	FixedIP netip.Addr // the pod's address
}

// FIP is a floating IP as the cloud holds it: Owner and Policy are its
// mark's ("" when unmarked), PortID and FixedIP what it points at (""
// detached).
type FIP struct {
	ID, Address, Network, PortID, FixedIP, Owner, Policy string
}

// ErrInvalid wraps a refusal that no retry can fix (a named address that
// is not on the network, or held by someone else).
var ErrInvalid = errors.New("floating IP request cannot be met")

// Cloud is pods' floating IPs in one cloud.
type Cloud interface {
	// Owned lists the floating IPs marked for owner ("" for every marked
	// one).
	Owned(ctx context.Context, owner string) ([]FIP, error)
	// At lists the floating IPs pointing at addr, marked or not.
	At(ctx context.Context, addr netip.Addr) ([]FIP, error)
	// Ensure makes one floating IP point at w's fixed IP: the pod's own
	// (marked for it, kept from an earlier pod of that name or made now)
	// or, for a named address, that address. A request no retry can meet
	// is an ErrInvalid error.
	Ensure(ctx context.Context, w Want) (FIP, error)
	// Detach takes every floating IP of owner off its port, then applies
	// its policy: Release deletes it, Retain keeps it (unassociated, still
	// marked). keep, if set, is a floating IP to leave as it is (the one a
	// pod still wants). It returns what it detached.
	Detach(ctx context.Context, owner string, keep func(FIP) bool) ([]FIP, error)
}

// Mark is the mark of a floating IP owned by a pod.
func Mark(owner, policy string) string { return "vpcni pod=" + owner + " policy=" + policy }

// ParseMark reads a mark: the owner and policy of a floating IP marked
// for a pod (vpcni-controller's leak audit lists them too).
func ParseMark(desc string) (owner, policy string, ok bool) {
	rest, ok := strings.CutPrefix(desc, "vpcni pod=")
	if !ok {
		return "", "", false
	}
	owner, policy, ok = strings.Cut(rest, " policy=")
	return owner, policy, ok && owner != ""
}
