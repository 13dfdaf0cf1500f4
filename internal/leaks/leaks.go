// Package leaks is vpcni's leak audit and collector. It compares what the
// cloud holds for vpcni — marked fixed IPs on VM ports, reservation ports,
// NIC ports, floating IPs, router routes and block pairs in OpenStack, the
// ENIs vpcni created in EC2 — with what the
// cluster says (Nodes, PodAddresses, pods, AddressReservations,
// NodeBlocks), and judges each holding: held (by whom) or orphaned (why,
// and what releasing it does).
//
// Only what this cluster claimed (Cloud.Claim: tagged when first seen
// held here) is ever released; an orphan never claimed is "unclaimed" —
// maybe another cluster's on the same subnet or project.
//
// Releasing is two-phase: a Collector marks a claimed orphan when it first
// sees it and releases it only when it is still orphaned a grace period
// after the mark, in a second look at the cloud and the cluster read
// afresh. What an agent claims within the grace (its PodAddress written
// late), or a Node re-registering, is kept. vpcnictl audit runs the same
// judgement as a dry run.
package leaks

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Kind is what sort of thing the cloud holds.
type Kind string

// The kinds, in the order reports list them.
const (
	FixedIP         Kind = "fixed-ip"         // a marked fixed IP on a node's (VM or NIC) port
	ReservationPort Kind = "reservation-port" // address-pairs mode: a port holding one pod address
	NICPort         Kind = "nic-port"         // a secondary or passthrough NIC's port
	ENI             Kind = "eni"              // an ENI vpcni created for a node's pod addresses (EC2)
	FloatingIP      Kind = "floating-ip"      // a floating IP marked for a pod
	Route           Kind = "route"            // a router route to a block (routed pod subnet)
	BlockPair       Kind = "block-pair"       // a VM port's pair for a block (routed pod subnet)
)

// Kinds lists every kind.
var Kinds = []Kind{FixedIP, ReservationPort, NICPort, ENI, FloatingIP, Route, BlockPair}

// Collected says whether the Collector releases an orphan of this kind.
// Routes and block pairs have one writer, the routes reconciler, which
// removes those no NodeBlock needs at its next sync (a gone node's blocks
// are themselves given back only after a grace and once its pods are
// gone); the audit reports them, the collector leaves them to it.
func (k Kind) Collected() bool { return k != Route && k != BlockPair }

// Holding is one thing the cloud holds for vpcni.
type Holding struct {
	Kind Kind `json:"kind"`
	// Address is the address, or for routes and pairs the block CIDR.
	Address string `json:"address"`
	// Resource is where it is held: a port's, floating IP's or router's ID.
	Resource string `json:"resource"`
	// NodeIPs are the addresses that tie it to a node: the node's own
	// (unmarked) fixed IPs on its ports for fixed-ip and block-pair; those
	// of the VM port a reservation port serves (none when that port is
	// gone); those of its instance's other ports for a NIC; its
	// instance's primary ENI's addresses for an ENI; a route's next hop.
	NodeIPs []netip.Addr `json:"nodeIPs,omitempty"`
	// Instance is the VM it is tied to, matched with Nodes'
	// spec.providerID: a VM port's device_id (fixed-ip; for a
	// reservation port, its VM port's), a NIC's from its name, an ENI's
	// attachment's (or, detached, the instance vpcni made it for).
	Instance string `json:"instance,omitempty"`
	// Port: reservation-port: the VM port it serves (its device_id);
	// floating-ip: the port it points at ("" detached).
	Port string `json:"port,omitempty"`
	// Carries: nic-port: every address it holds on the pods' subnet (its
	// own and the pods'); eni: every address it holds, those of its
	// prefixes too.
	Carries []netip.Addr `json:"carries,omitempty"`
	// Claimed: the resource carries this cluster's tag (see Cloud.Claim):
	// only a claimed orphan is released.
	Claimed bool `json:"claimed"`
	// Unreadable says why what the resource holds cannot be read (marks
	// someone cut short): it is judged held, and never released.
	Unreadable string `json:"unreadable,omitempty"`
	// Pod, Policy: floating-ip: the pod in its mark ("namespace/name")
	// and its policy (release|retain).
	Pod    string `json:"pod,omitempty"`
	Policy string `json:"policy,omitempty"`
}

// Key names a holding across passes.
func (h Holding) Key() string { return string(h.Kind) + " " + h.Resource + " " + h.Address }

// PodAddress is one PodAddress as the judgement needs it.
type PodAddress struct {
	Name string // the object's
	Pod  string // namespace/name
	Node string
	// Live: the pod exists (same UID when the PodAddress records one).
	Live bool
}

// Cluster is what the cluster says, read after the cloud (a thing the
// cloud got a moment before its owner was recorded is then seen owned).
type Cluster struct {
	// Nodes maps each Node's InternalIPs to its name.
	Nodes map[netip.Addr]string
	// Instances maps the VM of each Node's spec.providerID (as the
	// cloud reads it: Cloud.Instance) to its name.
	Instances map[string]string
	// NodeIPs maps each Node's name to its InternalIPs.
	NodeIPs map[string][]netip.Addr
	// Pods are the pods that exist, "namespace/name".
	Pods map[string]bool
	// Addresses are the PodAddresses by address.
	Addresses map[netip.Addr]PodAddress
	// Reservations: each reserved address (AddressReservation) and its
	// owner, "namespace/name".
	Reservations map[netip.Addr]string
	// Blocks: each NodeBlock's CIDR and its node.
	Blocks map[netip.Prefix]string
}

// NewCluster is an empty cluster to fill.
func NewCluster() *Cluster {
	return &Cluster{Nodes: map[netip.Addr]string{}, Instances: map[string]string{}, NodeIPs: map[string][]netip.Addr{}, Pods: map[string]bool{},
		Addresses: map[netip.Addr]PodAddress{}, Reservations: map[netip.Addr]string{}, Blocks: map[netip.Prefix]string{}}
}

// AddNode records a Node and its InternalIPs.
func (c *Cluster) AddNode(name string, ips []netip.Addr) {
	c.NodeIPs[name] = ips
	for _, ip := range ips {
		c.Nodes[ip] = name
	}
}

// nodeOf is the Node of the holding's instance or with one of its
// addresses, if any.
func (c *Cluster) nodeOf(h Holding) (string, bool) {
	if n, ok := c.Instances[h.Instance]; ok && h.Instance != "" {
		return n, true
	}
	for _, ip := range h.NodeIPs {
		if n, ok := c.Nodes[ip]; ok {
			return n, true
		}
	}
	return "", false
}

// Verdict is the judgement.
type Verdict string

const (
	Held   Verdict = "held"
	Orphan Verdict = "orphan"
	// Unclaimed: nothing here holds it, but it was never seen held by
	// this cluster (it carries no tag of it): reported, never released.
	Unclaimed Verdict = "unclaimed"
)

// Finding is one holding judged.
type Finding struct {
	Holding
	Verdict Verdict `json:"verdict"`
	// Holder is who holds it ("pod ns/name", "node n1", …), for held.
	Holder string `json:"holder,omitempty"`
	// Reason says why it is held, or why nothing holds it.
	Reason string `json:"reason"`
	// Release is what releasing an orphan does, and who does it.
	Release string `json:"release,omitempty"`
	// OrphanSince, ReleaseAt, Released: set by a Collector's pass (the
	// audit's dry run has none of them: it keeps no marks).
	OrphanSince *time.Time `json:"orphanSince,omitempty"`
	ReleaseAt   *time.Time `json:"releaseAt,omitempty"`
	Released    bool       `json:"released,omitempty"`
	// Error is why releasing it failed (it is tried again next pass).
	Error string `json:"error,omitempty"`
}

func held(h Holding, holder, reason string) Finding {
	return Finding{Holding: h, Verdict: Held, Holder: holder, Reason: reason}
}

func orphan(h Holding, reason, release string) Finding {
	return Finding{Holding: h, Verdict: Orphan, Reason: reason, Release: release}
}

func ips(a []netip.Addr) string {
	if len(a) == 0 {
		return "none"
	}
	s := make([]string, len(a))
	for i, x := range a {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// Judge decides one holding. A live pod's address, a reserved address
// and anything tied to an existing Node are held, whatever else is true:
// only what nothing in the cluster names is an orphan — and only if the
// resource is claimed (tagged) as this cluster's, else it is unclaimed:
// maybe another cluster's on the same subnet or project, never released.
func Judge(h Holding, c *Cluster) Finding {
	if h.Unreadable != "" {
		return held(h, "nobody known", "what it holds cannot be read ("+h.Unreadable+"): never released")
	}
	f := judge(h, c)
	if f.Verdict == Orphan && h.Kind.Collected() && !h.Claimed {
		f.Verdict = Unclaimed
		f.Reason += "; it is not tagged as this cluster's (never seen held here: maybe another cluster's)"
		f.Release = "none: tag it " + claimHint + " if it is this cluster's"
	}
	return f
}

// claimHint names the tag in a person's terms; the Cloud sets the value.
const claimHint = "vpcni-cluster=<this cluster's ID>"

func judge(h Holding, c *Cluster) Finding {
	switch h.Kind {
	case FixedIP, ReservationPort:
		return judgeAddress(h, c)
	case NICPort, ENI:
		return judgeNIC(h, c)
	case FloatingIP:
		if c.Pods[h.Pod] {
			return held(h, "pod "+h.Pod, "the pod its mark names exists")
		}
		if h.Policy == "retain" && h.Port == "" {
			return held(h, "policy retain", "kept, detached, for the next pod named "+h.Pod)
		}
		if h.Policy == "retain" {
			return orphan(h, "its pod "+h.Pod+" is gone and it still points at a port",
				"the collector detaches it (policy retain: kept for the next pod of that name)")
		}
		return orphan(h, "its pod "+h.Pod+" is gone", "the collector detaches and deletes it (policy "+policyOr(h.Policy)+")")
	case Route, BlockPair:
		return judgeBlock(h, c)
	}
	return orphan(h, "unknown kind "+string(h.Kind), "none: not understood")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func policyOr(p string) string {
	if p == "" {
		return "release"
	}
	return p
}

func judgeAddress(h Holding, c *Cluster) Finding {
	a, err := netip.ParseAddr(h.Address)
	if err != nil {
		return held(h, "nobody known", "not an address: never released")
	}
	pa, hasPA := c.Addresses[a]
	if hasPA && pa.Live {
		return held(h, "pod "+pa.Pod, "PodAddress "+pa.Name+" on node "+pa.Node)
	}
	if r, ok := c.Reservations[a]; ok {
		return held(h, "reservation "+r, "a sticky pod's address: the sticky keeper moves it")
	}
	if n, ok := c.nodeOf(h); ok {
		why := "its agent's: a pod's or the warm pool's"
		if hasPA {
			why += " (PodAddress " + pa.Name + " names a gone pod: the orphans reconciler deletes it and the agent gives the address back)"
		}
		return held(h, "node "+n, why)
	}
	var why string
	switch {
	case h.Kind == ReservationPort && len(h.NodeIPs) == 0 && h.Instance == "":
		why = "its VM port " + h.Port + " is gone"
	default:
		why = "no Node has its port's address (" + ips(h.NodeIPs) + ") or instance (" + orNone(h.Instance) + ")"
	}
	if hasPA {
		why += "; PodAddress " + pa.Name + " names pod " + pa.Pod + ", which is gone"
	} else {
		why += "; no pod or reservation names it"
	}
	release := "the collector takes the fixed IP and its mark off the port"
	if h.Kind == ReservationPort {
		release = "the collector deletes the reservation port"
	}
	return orphan(h, why, release)
}

// judgeNIC: a NIC (or an ENI) is held while any address on it is a live
// pod's or reserved, or its instance is a Node.
func judgeNIC(h Holding, c *Cluster) Finding {
	for _, a := range h.Carries {
		if pa, ok := c.Addresses[a]; ok && pa.Live {
			return held(h, "pod "+pa.Pod, "PodAddress "+pa.Name+" names "+a.String()+", on this NIC")
		}
		if r, ok := c.Reservations[a]; ok {
			return held(h, "reservation "+r, a.String()+", on this NIC, is a sticky pod's")
		}
	}
	if n, ok := c.nodeOf(h); ok {
		return held(h, "node "+n, "a NIC of its instance "+h.Instance)
	}
	release := "the collector deletes the NIC's port"
	if h.Kind == ENI {
		release = "the collector detaches the ENI if it is attached, and deletes it"
	}
	return orphan(h, "no Node has an address of instance "+h.Instance+" ("+ips(h.NodeIPs)+"); no pod or reservation names one of its addresses ("+ips(h.Carries)+")",
		release)
}

func judgeBlock(h Holding, c *Cluster) Finding {
	p, err := netip.ParsePrefix(h.Address)
	if err != nil {
		return held(h, "nobody known", "not a CIDR: never released")
	}
	const byRoutes = "the routes reconciler removes it at its next sync"
	node, ok := c.Blocks[p.Masked()]
	if !ok {
		return orphan(h, "no NodeBlock is "+p.Masked().String(), byRoutes)
	}
	nips, live := c.NodeIPs[node]
	if !live {
		return held(h, "NodeBlock of node "+node, "the node is gone: its block is given back after the grace, once its pods are gone")
	}
	if slices.ContainsFunc(h.NodeIPs, func(a netip.Addr) bool { return slices.Contains(nips, a) }) {
		return held(h, "NodeBlock of node "+node, "the block's node is "+ips(nips))
	}
	return orphan(h, fmt.Sprintf("the block is node %s's (%s), not %s's", node, ips(nips), ips(h.NodeIPs)), byRoutes)
}

// Cloud is the cloud as the collector and the audit need it; each cloud
// implements it (Neutron's is internal/provider/openstack/cluster).
type Cloud interface {
	// Holdings lists everything the cloud holds for vpcni.
	Holdings(ctx context.Context) ([]Holding, error)
	// Claim tags a held resource as this cluster's (once: Claimed
	// holdings are not claimed again), so that it can be released when
	// it is orphaned later; another cluster's never is.
	Claim(ctx context.Context, h Holding) error
	// Release gives an orphan back. It checks the cloud still holds it
	// as listed (a resource changed since is left alone).
	Release(ctx context.Context, h Holding) error
	// Instance reads a Node's spec.providerID: the cloud's ID of its VM
	// (Cluster.Instances), false when it is not one of this cloud's.
	Instance(providerID string) (string, bool)
}

// Scope is what a Cloud compares: this cluster's claims and, with a
// routed pod subnet, the router's routes and the ports' pairs of the
// block ranges.
type Scope struct {
	// ClusterID names this cluster in claims.
	ClusterID string
	// Router, Ranges: the routed pod subnet (empty: no routes or block
	// pairs are read).
	Router string
	Ranges []netip.Prefix
}

// Audit lists the cloud's holdings, then reads the cluster, and judges
// each: the dry run.
func Audit(ctx context.Context, cloud Cloud, cluster func(context.Context) (*Cluster, error)) ([]Finding, error) {
	hs, err := cloud.Holdings(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the cloud: %w", err)
	}
	c, err := cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the cluster: %w", err)
	}
	out := make([]Finding, 0, len(hs))
	for _, h := range hs {
		out = append(out, Judge(h, c))
	}
	Sort(out)
	return out, nil
}

// Sort orders findings by kind, then orphans, unclaimed, held, then by
// resource and address.
func Sort(fs []Finding) {
	kind := func(k Kind) int { return slices.Index(Kinds, k) }
	verdict := map[Verdict]int{Orphan: 0, Unclaimed: 1, Held: 2}
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(kind(a.Kind), kind(b.Kind)), cmp.Compare(verdict[a.Verdict], verdict[b.Verdict]), strings.Compare(a.Key(), b.Key()))
	})
}
