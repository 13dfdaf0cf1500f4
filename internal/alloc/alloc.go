// Package alloc holds the one type of an allocation — an address given to
// one pod interface — as the store keeps it, the datapath wires it, the
// agent reports it on its API and the cluster side publishes it, and the
// lease it was made from. Standard library only: the CNI plugin and
// vpcnictl read it through the agent's API.
package alloc

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vpcni/vpcni/internal/family"
)

// Lease is one address a provider holds for the node, with where it lives:
// L2 modes route via the subnet's own gateway, and addresses on a secondary
// NIC or ENI need that NIC's route table.
type Lease struct {
	Address netip.Addr `json:"address"`
	// Prefix is the subnet the address belongs to (invalid: unknown).
	Prefix netip.Prefix `json:"prefix,omitzero"`
	// Gateway is the subnet's router (invalid: none known).
	Gateway netip.Addr `json:"gateway,omitzero"`
	// Interface is the cloud port, NIC or ENI that holds the address (""
	// for the node's primary one, or a provider without ports).
	Interface string `json:"interface,omitempty"`
	// NIC is set when the address lives on a network interface of its own
	// that the provider attached to the node (a passthrough NIC, a
	// secondary NIC): how the datapath finds it and routes through it.
	NIC *NIC `json:"nic,omitempty"`
	// PodNetwork names the PodNetwork whose pool the address is of (""
	// for the node's default network): the agent keeps a pool per
	// network, and a record's address goes back to its own.
	PodNetwork string `json:"podNetwork,omitempty"`
}

// NIC is a cloud port attached to the node as a network interface.
type NIC struct {
	// MAC is the port's MAC: the interface carries it, whatever its name.
	MAC string `json:"mac"`
	// Address is the NIC's own address (its port's first fixed IP), the
	// source of its ARP; for a passthrough NIC it is the pod's address.
	Address netip.Addr `json:"address,omitzero"`
}

// AddressMAC is the MAC of a pod in a datapath mode where pods send with
// MACs of their own (macvlan, bridge): 0a:58 and the four bytes of the
// IPv4 address. It is unique on the segment as the address is, and known
// before the pod exists, so a cloud port can allow it while the address
// waits in the warm pool. A dual-stack pod's MAC is its IPv4 address's;
// an IPv6 address gives its last four bytes, unique only among addresses
// that differ there (one node block, one /96).
func AddressMAC(ip netip.Addr) string {
	ip = ip.Unmap()
	var b [4]byte
	if ip.Is4() {
		b = ip.As4()
	} else {
		s := ip.As16()
		copy(b[:], s[12:])
	}
	return fmt.Sprintf("0a:58:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
}

// MaxContainerID bounds a container ID. Every mode marks the node-side
// links it makes with the alias "vpcni:<container>/<ifname>", and the
// kernel caps an alias at 255 bytes: 255 - len("vpcni:/") - 15 (the
// longest interface name) = 233. Runtimes use 64 hex digits.
const MaxContainerID = 233

// Allocation is one lease given to one container interface, and what the
// datapath made of it.
type Allocation struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// Network is the CNI network name (GC is per network).
	Network string `json:"network"`
	Netns   string `json:"netns"`
	// Lease is the attachment's address of its first family (the agent's
	// ipFamilies order): all of it for a single-family pod. A record that
	// a release before dual-stack wrote holds this alone, and such a
	// release reads this alone, so a rollback keeps every pod's first
	// address.
	Lease
	// Others are the attachment's addresses of its other families, in
	// the configured order: a dual-stack pod's second address, taken with
	// the first and given back with it.
	Others       []Lease `json:"others,omitempty"`
	PodNamespace string  `json:"podNamespace,omitempty"`
	PodName      string  `json:"podName,omitempty"`
	PodUID       string  `json:"podUID,omitempty"`
	// Requested: the runtime asked for this address by name (CNI_ARGS
	// IP=, or the ips capability). It is the pod's, not the node's pool's:
	// DEL gives it straight back to the provider, without a cooldown, so
	// the pod may take it on another node at once.
	Requested bool `json:"requested,omitempty"`
	// Shaped: the runtime asked to limit the pod's bandwidth, which the
	// bandwidth plugin chained after vpcni does with qdiscs on the pod's
	// host veth: a mode's fast path that would bypass them (ebpf) leaves
	// such a pod on its plain path.
	Shaped bool `json:"shaped,omitempty"`
	// Wiring is what the datapath made (nil until a wiring was recorded:
	// the ADD is in flight, or the record predates wirings).
	Wiring *Wiring `json:"wiring,omitempty"`
	// Ready: the ADD answered with this allocation wired. A record found
	// unready at start (the agent stopped mid-ADD) is checked and re-wired
	// or released, never trusted.
	Ready   bool      `json:"ready"`
	Created time.Time `json:"created"`
}

// Key identifies an allocation: the CNI attachment (container ID,
// interface). Container IDs never hold '/' (CNI spec).
func (a *Allocation) Key() string { return Key(a.ContainerID, a.IfName) }

// Key of an attachment.
func Key(containerID, ifName string) string { return containerID + "/" + ifName }

// Leases are all of the attachment's addresses, first family first.
func (a *Allocation) Leases() []Lease {
	return append([]Lease{a.Lease}, a.Others...)
}

// Addresses are the attachment's addresses, first family first.
func (a *Allocation) Addresses() []netip.Addr {
	out := []netip.Addr{a.Address}
	for _, l := range a.Others {
		out = append(out, l.Address)
	}
	return out
}

// LeaseOf is the attachment's address of family f, if it has one.
func (a *Allocation) LeaseOf(f family.Family) (Lease, bool) {
	for _, l := range a.Leases() {
		if family.Of(l.Address) == f {
			return l, true
		}
	}
	return Lease{}, false
}

// PodMAC is the MAC of the pod's interface, as wired ("" if not known).
func (a *Allocation) PodMAC() string {
	if a.Wiring == nil {
		return ""
	}
	for _, i := range a.Wiring.Interfaces {
		if i.Sandbox != "" && i.Name == a.IfName {
			return i.MAC
		}
	}
	return ""
}

// PodGateway is the next hop the pod's first address routes through, as
// wired (invalid if not known).
func (a *Allocation) PodGateway() netip.Addr { return a.GatewayOf(a.Address) }

// GatewayOf is the next hop one of the pod's addresses routes through, as
// wired (invalid if not known).
func (a *Allocation) GatewayOf(addr netip.Addr) netip.Addr {
	if a.Wiring == nil {
		return netip.Addr{}
	}
	for _, ip := range a.Wiring.IPs {
		if ip.Address.Addr() == addr {
			return ip.Gateway
		}
	}
	return netip.Addr{}
}

// HostIf is the node-side interface of the wiring ("" if the mode has
// none).
func (a *Allocation) HostIf() string {
	if a.Wiring == nil {
		return ""
	}
	for _, i := range a.Wiring.Interfaces {
		if i.Sandbox == "" {
			return i.Name
		}
	}
	return ""
}

// Wiring is what a datapath made for an allocation, shaped like a CNI
// result: the interfaces (node side without a sandbox), the pod's
// addresses on them and its routes.
type Wiring struct {
	Interfaces []Interface `json:"interfaces"`
	IPs        []IPConfig  `json:"ips"`
	Routes     []Route     `json:"routes,omitempty"`
}

// Interface is one link the datapath made or moved.
type Interface struct {
	Name string `json:"name"`
	MAC  string `json:"mac,omitempty"`
	// Sandbox is the pod's netns path; empty for a node-side link.
	Sandbox string `json:"sandbox,omitempty"`
}

// IPConfig is an address on one of the wiring's interfaces.
type IPConfig struct {
	// Interface indexes Wiring.Interfaces.
	Interface int          `json:"interface"`
	Address   netip.Prefix `json:"address"`
	Gateway   netip.Addr   `json:"gateway,omitzero"`
}

// Route is a route in the pod.
type Route struct {
	Dst netip.Prefix `json:"dst"`
	GW  netip.Addr   `json:"gw,omitzero"`
}
