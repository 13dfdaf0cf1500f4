// Package datapath is how pods are wired into the node's kernel, as the
// agent needs it: wire one allocation and say what the CNI result reports,
// take it down, check it, bring the whole node in line with what should be
// there. Each mode (routed veth, macvlan, bridge, ...) is a package of its
// own that registers itself by name with its own config section;
// `datapath:` in vpcnid.yaml picks one. The agent never names a mode.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/registry"
)

// AliasPrefix starts the alias of every node-side link a mode creates:
// "vpcni:<container>/<ifname>". vpcni never touches a link without it.
const AliasPrefix = "vpcni:"

// Datapath wires the pods of one node.
type Datapath interface {
	// Setup wires an allocation and returns what it made. On failure it
	// removes whatever it created; a *SetupError says which step failed
	// and whether the request (not the node) is at fault.
	Setup(ctx context.Context, a *alloc.Allocation) (alloc.Wiring, error)
	// Check verifies the allocation is wired as Setup left it, and returns
	// the wiring it verified (also when it finds problems, as far as the
	// mode can tell).
	Check(ctx context.Context, a *alloc.Allocation) (alloc.Wiring, error)
	// Teardown takes a deleted pod off the network. Idempotent: what is
	// already gone is fine; anything vpcni did not make is left alone.
	// It also removes the node-side pieces that name only the address
	// (a proxy ARP entry, an eBPF map entry, a /32 route), so the caller
	// never tears down an allocation whose address another one holds
	// (it drops such a record, and Reconcile removes its links, which
	// carry its key).
	Teardown(ctx context.Context, a *alloc.Allocation) error
	// Reconcile brings the node side in line with what should be there,
	// in one pass over the kernel's state: the node-side pieces of every
	// desired allocation put back, vpcni's pieces of anything else
	// removed. It does not enter pod namespaces (Check does, per pod).
	// The caller keeps Setup and Teardown from running meanwhile. The
	// error says the kernel's state could not be read (nothing was done);
	// an item that could not be repaired or removed is in Report.Failed,
	// for the next pass.
	Reconcile(ctx context.Context, want Desired) (Report, error)
	// Trace lists every piece of the allocation's path the mode made, on
	// the node and in the pod, each ok or not and what to do (vpcnictl
	// trace); Check's problems are the pieces that are not ok.
	Trace(ctx context.Context, a *alloc.Allocation) []Hop
	// Info describes the mode as configured on this node.
	Info() Info
	// Close releases the datapath's own resources; pods stay wired.
	Close() error
}

// Desired is what the node should hold.
type Desired struct {
	// Allocations should be wired.
	Allocations []*alloc.Allocation
	// Idle are addresses the node holds that no pod uses (free, cooling):
	// anything wired for them is stale.
	Idle []netip.Addr
	// Leave are allocations to leave exactly as they are, neither repaired
	// nor removed (records in conflict, for a person to resolve).
	Leave []*alloc.Allocation
}

// Report says what a Reconcile changed, one line per item, for the log.
type Report struct {
	// Repaired: node-side pieces of desired allocations put back.
	Repaired []Repair
	// Removed: vpcni's pieces of what is not desired.
	Removed []string
	// Broken: the keys of desired allocations the node side cannot repair
	// alone (their link is gone): the caller re-wires them from their pod.
	Broken []string
	// Failed: items that could not be repaired or removed, and why.
	Failed []string
}

// Repair is one piece a Reconcile put back: its kind (for the repair
// counters) and what was missing (for the log).
type Repair struct {
	Kind RepairKind
	What string
}

// RepairKind is the kind of kernel object a repair put back.
type RepairKind string

// The kinds of repair.
const (
	// RepairLink: a node-side link's state (down, off its bridge).
	RepairLink RepairKind = "link"
	// RepairRoute: a route, or a routing table's contents.
	RepairRoute RepairKind = "route"
	// RepairNeighbour: a (proxy) neighbour entry.
	RepairNeighbour RepairKind = "neighbour"
	// RepairRule: a policy routing rule.
	RepairRule RepairKind = "rule"
	// RepairNAT: an nftables table, chain or set of vpcni's.
	RepairNAT RepairKind = "nat"
	// RepairNode: the node's own setup (a bridge holding the uplink).
	RepairNode RepairKind = "node"
	// RepairProgram: a fast path's BPF program on a link, or a map entry
	// (mode ebpf).
	RepairProgram RepairKind = "program"
	// RepairRewired: a pod re-wired from inside its namespace (its node
	// link was gone: Report.Broken). The agent counts these itself.
	RepairRewired RepairKind = "rewired"
)

// Hop is one piece of a pod's path, as vpcnictl trace shows it (the wire
// type: the agent serves a mode's trace as it is).
type Hop = api.Hop

// Where a hop is, and its states.
const (
	HopPod   = api.HopPod
	HopNode  = api.HopNode
	HopCloud = api.HopCloud

	HopOK      = api.HopOK
	HopMissing = api.HopMissing
	HopWrong   = api.HopWrong
)

// What to do about a piece that is not ok, by where it is.
const (
	// FixNode: node-side pieces are the self-healing reconcile's.
	FixNode = "the agent puts node-side pieces back by itself (selfHeal: at once on a kernel event, else every selfHeal.period); it stays broken only if something removes it again — vpcnictl status counts the repairs, the agent's log names them"
	// FixPod: the agent does not enter a running pod to mend it.
	FixPod = "the agent re-wires a pod whose wiring is broken when it starts (it checks every pod) — restart vpcnid on this node, or delete the pod"
)

// Problems joins the Detail of every hop that is not ok (nil when all
// are): a mode's Check, from its Trace.
func Problems(hops []Hop) error {
	var errs []error
	for _, h := range hops {
		if h.State != HopOK {
			errs = append(errs, errors.New(h.Detail))
		}
	}
	return errors.Join(errs...)
}

// HopsOf is the trace of a mode that checks a pod as a whole: one hop per
// problem its check found (where: HopNode), or one ok hop named what.
func HopsOf(what string, problem error) []Hop {
	if problem == nil {
		return []Hop{{Where: HopNode, What: what, State: HopOK}}
	}
	list := []error{problem}
	if j, ok := problem.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	hops := make([]Hop, 0, len(list))
	for _, e := range list {
		hops = append(hops, Hop{Where: HopNode, What: what, State: HopWrong, Detail: e.Error(), Fix: FixNode + "; " + FixPod})
	}
	return hops
}

// AddRepair adds a repair to the report.
func (r *Report) AddRepair(kind RepairKind, format string, args ...any) {
	r.Repaired = append(r.Repaired, Repair{Kind: kind, What: fmt.Sprintf(format, args...)})
}

// Info describes a datapath.
type Info struct {
	Mode   string
	Uplink string
	MTU    int
	// NodeIP is the uplink's first IPv4 address: the node's address on the
	// pods' network, by which a cloud finds its port (invalid: none).
	NodeIP netip.Addr
	// NodeLink names the interface that holds NodeIP when Uplink is not
	// it (bridge: the bridge), for what must send on the segment as the
	// node (the static provider's ARP probe); "": Uplink.
	NodeLink string
	// OwnMACs: pods send on the network with MACs of their own,
	// alloc.AddressMAC(address), not the node's: the cloud's port security
	// must allow them (macvlan, bridge).
	OwnMACs bool
	// PodVeth: the pod's interface is a veth whose node end the CNI result
	// lists (veth, bridge). The bandwidth plugin chained after vpcni shapes
	// a pod on that node end; without one (macvlan, ipvlan, passthrough)
	// it cannot, and the agent refuses a pod that asks for it.
	PodVeth bool
	// NICRoutes: a pod whose address lives on a NIC of its own (a
	// secondary NIC, a PodNetwork's) is routed out through that NIC
	// (veth, ebpf); the modes that wire pods on the uplink refuse such an
	// address (OnUplink).
	NICRoutes bool
}

// FastPath is the state of a mode's kernel fast path beside its plain one
// (mode ebpf): a mode that has one says so through a FastPath method,
// which the agent's metrics and status read.
type FastPath struct {
	// Active: the fast path's programs run.
	Active bool
	// Reason the fast path is off (or why its counters could not be read).
	Reason string
	// Packets is what the fast path did, by action, since it was loaded.
	Packets map[string]uint64
	// Note says what the fast path leaves to the plain path while it
	// runs (a family it does not handle), for vpcnictl status.
	Note string
}

// SetupError says which step of the wiring failed and whether the cause is
// the caller's input (the pod namespace) rather than the node.
type SetupError struct {
	Step       string
	BadRequest bool
	Err        error
}

func (e *SetupError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// OnUplink refuses a lease whose address lives on a NIC of its own (a
// passthrough port, a secondary NIC) for a mode that wires pods on the
// uplink: the cloud answers for that address on the other NIC, so a pod
// wired here would be silently unreachable. The provider and the mode do
// not fit; the error says which modes do.
func OnUplink(l alloc.Lease, mode string) error {
	if l.NIC == nil {
		return nil
	}
	return fmt.Errorf("address %s lives on a NIC of its own (MAC %s) and datapath %s wires pods on the uplink: use datapath passthrough for a port per pod, or veth for secondary NICs", l.Address, l.NIC.MAC, mode)
}

// Settings is a mode's own section of vpcnid.yaml (datapath.<mode>).
// Defaults fills what the file left out; Validate names every bad field
// at once, relative to the section.
type Settings interface {
	Defaults()
	Validate() error
}

// Node is what a mode learns of the node: the uplink pods reach the
// network through ("" = the default route's interface), the pods' MTU
// (0 = the uplink's) and the address families its pods get (nil: IPv4).
type Node struct {
	Uplink   string
	MTU      int
	Families []family.Family
	Log      *slog.Logger
}

// Registration is one datapath mode.
type Registration struct {
	Name string
	// NewSettings returns the mode's config section, empty.
	NewSettings func() Settings
	// New opens the mode on this node with its validated settings.
	New func(node Node, s Settings) (Datapath, error)
	// Families are the address families the mode wires (nil: IPv4
	// only); the agent refuses an ipFamilies the mode lacks, naming the
	// modes that have it.
	Families []family.Family
	// Prepare sets what the mode needs of the node's kernel (sysctls),
	// from a privileged step (vpcnictl install-cni) so that the agent
	// itself need not be privileged. Nil: nothing to prepare.
	Prepare func(node Node, s Settings) error
	// Needs says what the mode needs of the node's kernel, for a check
	// that changes nothing (vpcnictl doctor). node.Uplink is the uplink's
	// name, resolved (the sysctls name it); a caller that reads only the
	// Links may leave it empty.
	Needs func(node Node, s Settings) Needs
	// Clear takes off the node what the mode left there that would still
	// act on pods another mode wires (mode ebpf: its tc programs, whose
	// maps no one would keep current). The agent calls it at start for
	// every mode but its own: switching modes needs no manual step.
	// Idempotent and quick when there is nothing; nil: nothing to clear.
	Clear func(node Node) error
	// Uninstall undoes what New changed on the node itself beyond the
	// pods' own links (bridge mode: the uplink taken into a bridge), from
	// a privileged step (vpcnictl uninstall-cni) once the agent is
	// stopped for good. Idempotent: nothing to undo is no error. Nil: the
	// mode changes nothing that outlives its pods.
	Uninstall func(node Node, s Settings) error
}

// Needs is what a mode needs of the node's kernel: the link types it
// creates and the sysctls it relies on (Prepare sets those it can).
type Needs struct {
	// Links are the link types the mode creates, as the kernel names them
	// (ip link add ... type <kind>).
	Links []string
	// Sysctls are the settings the mode relies on.
	Sysctls []Sysctl
}

// Sysctl is one kernel setting under /proc/sys.
type Sysctl struct {
	// Key is its path under /proc/sys: net/ipv4/ip_forward.
	Key string
	// Value is what the mode needs. Empty: only that the key exists,
	// which the kernel shows only with a feature loaded (net/bridge with
	// br_netfilter).
	Value string
	// Why the mode needs it, for a person told it is wrong.
	Why string
}

// Name is the key as sysctl(8) writes it: net.ipv4.ip_forward.
func (s Sysctl) Name() string { return strings.ReplaceAll(s.Key, "/", ".") }

// Forwarding is IPv4 forwarding, which every mode whose pods' traffic
// crosses the node's stack (routed pods, the service path, DNATed bridged
// packets) needs.
var Forwarding = Sysctl{Key: "net/ipv4/ip_forward", Value: "1", Why: "pod traffic is forwarded by the node's stack"}

var modes = registry.New[Registration]("datapath mode")

// Register adds a datapath mode; its package calls it from init.
func Register(r Registration) { modes.Register(r.Name, r) }

// Lookup finds a registered datapath mode.
func Lookup(name string) (Registration, error) { return modes.Lookup(name) }

// NewSettings returns the empty config section of a registered datapath mode.
func NewSettings(name string) (Settings, error) {
	r, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return r.NewSettings(), nil
}

// Names lists the registered datapath modes, sorted.
func Names() []string { return modes.Names() }
