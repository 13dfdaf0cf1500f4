// Package provider is where a node's pod addresses come from: a cloud
// (Neutron fixed IPs, EC2 secondary IPs) or a static range. The agent owns
// this interface; each implementation lives in a package of its own,
// registers itself by name with its own config section, and passes the
// same contract tests.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/registry"
)

// Provider obtains addresses for this node and gives them back.
//
// Implementations serialise their own writes per node (one writer per VM
// port) and never touch addresses they did not assign (ownership marks).
type Provider interface {
	// Assign obtains Count addresses of the provider's choosing plus every
	// address in Addresses, in as few cloud calls as it can. On partial
	// success it returns what it got and an error.
	Assign(ctx context.Context, req AssignRequest) ([]alloc.Lease, error)
	// Release gives addresses back. Releasing an address the node does not
	// hold is not an error.
	Release(ctx context.Context, addrs []netip.Addr) error
	// Held lists every address the provider holds for this node on vpcni's
	// behalf (not addresses a person added by hand).
	Held(ctx context.Context) ([]alloc.Lease, error)
	// Info describes the provider as it is now.
	Info() Info
}

// Info is what a provider tells about itself: what the agent reports,
// the node's annotations, and the pool's ceiling.
type Info struct {
	// Name is the provider's registered type, e.g. "static", "openstack".
	Name string
	// Port is the cloud port (or NIC, ENI) the node's pod addresses live
	// on; "" for providers without one.
	Port string
	// Capacity is the most addresses this node may hold (0: unknown), and
	// CapacityReason what bounds it, for a person reading why.
	Capacity       int
	CapacityReason string
	// Capacities are, for a provider that serves more than one address
	// family, each family's Capacity and CapacityReason (the agent runs a
	// pool per family); nil: Capacity is the one family's.
	Capacities map[family.Family]Capacity
	// FreeNICs is, for a provider whose PodNetworks live on NICs of their
	// own (the node's and each network's), how many more NICs the VM may
	// take, as last counted (-1: not counted yet); read by its
	// Registration.NetworkRoom.
	FreeNICs int
	// NICAddresses is how many pod addresses one more NIC would hold
	// (0: not said); with FreeNICs, what a new PodNetwork could get.
	NICAddresses int
	// Subnet names where the node's pod addresses come from and how that
	// was settled (configured, or discovered); "" when the provider has
	// no such choice to report.
	Subnet string
	// Calls counts the provider's cloud requests by method (nil: it does
	// not count them).
	Calls map[string]int64
	// VPCCIDRs are the node's cloud network's own ranges, which pods reach
	// with their own addresses: SNAT's vpc set when the agent's
	// snat.vpcCIDRs is empty (nil: the provider does not know them).
	VPCCIDRs []netip.Prefix
}

// Capacity is how many addresses of one family the node may hold (0:
// unknown) and what bounds it.
type Capacity struct {
	Max    int
	Reason string
}

// AssignRequest asks for addresses.
type AssignRequest struct {
	Count     int
	Addresses []netip.Addr
	// Family is the family of the Count addresses (0: IPv4). A provider
	// that serves one family only is asked only for that one.
	Family family.Family
}

// Fam is the request's family, IPv4 when unset.
func (r AssignRequest) Fam() family.Family {
	if r.Family == 0 {
		return family.V4
	}
	return r.Family
}

// Errors a provider wraps so the agent can tell a person what to do.
var (
	// ErrExhausted: nothing more can be obtained (subnet full, limit hit).
	ErrExhausted = errors.New("no more addresses can be obtained")
	// ErrTaken: a specific address asked for is held by someone else.
	ErrTaken = errors.New("address is already taken")
	// ErrOutside: a specific address asked for is outside the provider's
	// subnet or ranges; it can never be the node's.
	ErrOutside = errors.New("address is outside the provider's subnet or ranges")
	// ErrUnavailable: the provider's endpoint cannot be reached right now.
	ErrUnavailable = errors.New("provider endpoint unavailable")
)

// Settings is a provider's own section of vpcnid.yaml
// (provider.<type>). Defaults fills what the file left out; Validate names
// every bad field at once, relative to the section ("subnetID: ...").
type Settings interface {
	Defaults()
	Validate() error
}

// Node is what a provider learns of the node it serves.
type Node struct {
	Name string
	// IP is the node's address on the pods' network (the uplink's), by
	// which a cloud finds the node's port; invalid if it has none.
	IP netip.Addr
	// PodMACs: the datapath sends each pod's traffic from a MAC of its
	// own, alloc.AddressMAC(address): every address the provider holds
	// must be allowed on the network with that MAC, or the provider
	// refuses to start and says why.
	PodMACs  bool
	StateDir string
	// Kubeconfig is the agent's kubernetes.kubeconfig ("": $KUBECONFIG,
	// else the pod's service account), for a provider that reads cluster
	// objects (the static provider's blocks and Nodes).
	Kubeconfig string
	// Kubernetes: the agent runs with the cluster (kubernetes.mode not
	// off), so its objects may be read.
	Kubernetes bool
	// Uplink is the interface that holds the node's address on the pods'
	// network ("" unknown), which a provider without a cloud probes (the
	// static provider's ARP).
	Uplink string
	// Families are the address families the node's pods get, in order
	// (the agent's ipFamilies): a provider that cannot serve one of them
	// refuses to start and says what to configure.
	Families []family.Family
	Log      *slog.Logger
	// Notify, if set, is told what the provider found that a person should
	// know of though no call failed (see Notice). The provider calls it on
	// its own goroutines and must not wait on it; nil: nobody listens.
	Notify func(Notice)
}

// Notice is something a provider found that needs a person's eye though no
// call failed: a write of its own that raced another writer's on the
// cloud port, say. The agent logs it, counts it (Reason and Kind as
// labels) and reports it on the node's Kubernetes object as a Warning
// Event with Reason and Message.
type Notice struct {
	// Reason names the kind of notice (an Event's reason): one of the
	// Reason… constants.
	Reason string
	// Kind tells notices of one reason apart for counting, a short
	// snake_case word.
	Kind string
	// Message says what happened and what to do, for a person.
	Message string
	// Attrs are the figures behind the message, as slog key-value pairs.
	Attrs []any
}

// ReasonWriteRace: a write of the provider's and another writer's met on
// the cloud port. The provider never guesses which change should win:
// it keeps its own addresses and leaves everyone else's as the cloud
// has them, and says what it saw.
const ReasonWriteRace = "VpcniCloudWriteRace"

// ReasonAddressInUse: another host on the segment answered the probe of
// an address the provider was about to hand out (the static provider's
// ARP probe); the address is set aside, never handed to a pod.
const ReasonAddressInUse = "VpcniAddressInUse"

// Registration is one provider type.
type Registration struct {
	Name string
	// NewSettings returns the provider's config section, empty.
	NewSettings func() Settings
	// New connects a provider with its validated settings.
	New func(ctx context.Context, node Node, s Settings) (Provider, error)
	// SNATByDefault: the provider's cloud does not translate pod addresses
	// for traffic that leaves the network (an AWS VPC maps only an
	// instance's primary address to a public one), so the agent's SNAT is
	// on unless the file says snat.enabled: false; the provider reports
	// the network's ranges in Info.VPCCIDRs.
	SNATByDefault bool
	// Network, if set, serves the pods of one PodNetwork on this node:
	// name is the PodNetwork's, spec its section for this provider type
	// (the JSON of spec.<type>), s the node's validated settings (how to
	// reach the cloud). The provider it returns holds only that network's
	// addresses, in leases of their own (a NIC on the network, say), and
	// the agent runs a pool of its own on it. nil: the provider serves no
	// PodNetworks, and a pod that names one is refused.
	Network func(ctx context.Context, node Node, s Settings, name string, spec json.RawMessage) (Provider, error)
	// NetworkNICs: a PodNetwork's addresses live on NICs of their own
	// (Lease.NIC), which only a datapath mode that routes pods by their
	// NIC can wire (datapath.Info.NICRoutes); the agent refuses such a
	// pod on another mode before any NIC is made.
	NetworkNICs bool
	// NetworkRoom, if set, is how many addresses of a PodNetwork the node
	// could hold before it serves any of its pods — what the node
	// advertises to the scheduler for the network's first pods: spec and s
	// as for Network, def the node's default provider's Info. ok false:
	// unknown (the agent advertises the kubelet's pod limit). nil: always
	// unknown.
	NetworkRoom func(s Settings, spec json.RawMessage, def Info) (room int, ok bool)
	// Families are the address families the provider can serve (nil:
	// IPv4 only); the agent refuses an ipFamilies the provider lacks
	// before it starts the provider.
	Families []family.Family
	// Doctor, if set, is how vpcnictl doctor looks at the provider's cloud
	// from the node (nil: the provider has no cloud to look at, as
	// static).
	Doctor *Doctor
}

// Doctor is vpcnictl doctor's look at a provider's cloud, owned here
// beside the registration it comes with (as a datapath mode's Needs):
// doctor reads the node's agent config, so the provider that config names
// is the one to ask.
type Doctor struct {
	// API names the endpoint the steps talk to, whose clock doctor judges
	// ("neutron": the check "clock neutron").
	API string
	// Diagnose runs the provider's start-up steps one by one, as New
	// would, changing nothing the node holds; after a failed step the
	// rest are not tried. s is the provider's validated settings.
	Diagnose func(ctx context.Context, s Settings, node DoctorNode) []Step
}

// DoctorNode is what Diagnose is told of the node.
type DoctorNode struct {
	// IP is the node's address on the pods' network (the uplink's);
	// invalid when unknown.
	IP netip.Addr
	// ConfigFile is the agent's config file, for fixes to name.
	ConfigFile string
	// Transport carries every request to the cloud (doctor reads the
	// clock of its answers).
	Transport http.RoundTripper
	// Wrap, if set, is used instead of Transport by a provider whose
	// settings make a transport of their own (a CA bundle, a proxy): it
	// puts doctor's Transport in front of that one.
	Wrap func(http.RoundTripper) http.RoundTripper
}

// Step is one stage of a provider's start-up, checked: what it found,
// its error (nil: passed) and, when it failed or warns, what to do.
type Step struct {
	Name   string
	Detail string
	Err    error
	// Warn: passed, but something needs a look (no room left).
	Warn bool
	Fix  string
}

var providers = registry.New[Registration]("provider")

// Register adds a provider; its package calls it from init.
func Register(r Registration) { providers.Register(r.Name, r) }

// Lookup finds a registered provider.
func Lookup(name string) (Registration, error) { return providers.Lookup(name) }

// NewSettings returns the empty config section of a registered provider.
func NewSettings(name string) (Settings, error) {
	r, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return r.NewSettings(), nil
}

// Names lists the registered providers, sorted.
func Names() []string { return providers.Names() }

// Addresses lists the addresses of leases.
func Addresses(leases []alloc.Lease) []netip.Addr {
	out := make([]netip.Addr, len(leases))
	for i, l := range leases {
		out[i] = l.Address
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
