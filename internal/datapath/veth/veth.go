// Package veth is the routed veth datapath mode ("veth", the default):
//
//	pod:  eth0 (veth) <ip>/32, 169.254.1.1 scope link, default via
//	      169.254.1.1, permanent neighbour 169.254.1.1 -> host veth MAC
//	node: <ip>/32 dev vpc<hash> (protocol vpcni), a proxy neighbour entry
//	      for <ip> on the uplink so the node answers ARP for the pod,
//	      a gratuitous ARP on the uplink when the pod appears
//
// and for each IPv6 address of the pod (ipv6.go):
//
//	pod:  eth0 <ip6>/128 nodad, default via fe80::1 dev eth0, permanent
//	      neighbour fe80::1 -> host veth MAC
//	node: <ip6>/128 dev vpc<hash> (protocol vpcni), permanent neighbour
//	      <ip6> -> pod MAC on the host veth, a proxy NDP entry for <ip6>
//	      on the uplink, an unsolicited neighbour advertisement on the
//	      uplink when the pod appears
//
// The pod end is created inside the pod's namespace (moving a link between
// namespaces costs ~25 ms). The host end carries the alias
// "vpcni:<container>/<ifname>" so vpcni never touches a link it did not make.
//
// A pod has one routed interface: a second one (a Multus net1 on the same
// network) is refused, since the pod's default route is vpcni's already.
package veth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

func init() {
	datapath.Register(datapath.Registration{
		Name:        "veth",
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return NewVeth(node.Uplink, node.MTU, *s.(*Settings).GARP, node.Families...)
		},
		Families: []family.Family{family.V4, family.V6},
		Prepare:  func(node datapath.Node, _ datapath.Settings) error { return PrepareNode(node.Uplink, node.Families...) },
		Needs: func(node datapath.Node, _ datapath.Settings) datapath.Needs {
			return NodeNeeds(node.Uplink, node.Families...)
		},
	})
}

// Settings is the mode's section of vpcnid.yaml (datapath.veth).
type Settings struct {
	// GARP: announce a pod's addresses on the uplink when it is wired —
	// a gratuitous ARP for IPv4, an unsolicited neighbour advertisement
	// for IPv6 — so neighbours that knew an address elsewhere learn its
	// new home at once (default true).
	GARP *bool `json:"garp,omitempty"`
}

// Defaults implements datapath.Settings.
func (s *Settings) Defaults() {
	if s.GARP == nil {
		on := true
		s.GARP = &on
	}
}

// Validate implements datapath.Settings: nothing can be wrong yet.
func (s *Settings) Validate() error { return nil }

// Gateway is the link-local next hop every pod routes IPv4 through.
var Gateway = netip.MustParseAddr("169.254.1.1")

// Gateway6 is the link-local next hop every pod routes IPv6 through.
var Gateway6 = netip.MustParseAddr("fe80::1")

// gatewayOf is the pods' next hop for family f.
func gatewayOf(f family.Family) netip.Addr {
	if f == family.V6 {
		return Gateway6
	}
	return Gateway
}

// RouteProtocol marks the node routes vpcni installs (see /etc/iproute2/rt_protos).
const RouteProtocol netlink.RouteProtocol = 0xa7

// AliasPrefix starts the alias of every host link vpcni creates.
const AliasPrefix = datapath.AliasPrefix

// SetupError is the datapath's: which step failed, and whose fault.
type SetupError = datapath.SetupError

// Veth is the routed veth datapath of one node.
type Veth struct {
	Uplink    string
	uplinkIdx int
	uplinkMAC net.HardwareAddr
	MTU       int
	// families the node was prepared for (nil: IPv4 only).
	families []family.Family
	garp     *announcer // nil: announcements disabled
	reap     chan reapItem
	reaped   chan struct{}

	mu      sync.Mutex
	pending map[string][]reapItem // by pod netns: links released, not yet deleted
	closed  bool
}

type reapItem struct {
	index int
	alias string
	netns string
}

// NewVeth finds the uplink (the default route's interface when name is
// empty), settles the MTU and prepares the node's sysctls for the address
// families its pods get (none named: IPv4).
func NewVeth(uplink string, mtu int, garp bool, families ...family.Family) (*Veth, error) {
	link, err := nlutil.Uplink(uplink)
	if err != nil {
		return nil, err
	}
	uplink = link.Attrs().Name
	if mtu == 0 {
		mtu = link.Attrs().MTU
	}
	v := &Veth{Uplink: uplink, uplinkIdx: link.Attrs().Index, uplinkMAC: link.Attrs().HardwareAddr, MTU: mtu, families: families}
	if err := PrepareNode(v.Uplink, families...); err != nil {
		return nil, err
	}
	if garp {
		if v.garp, err = newAnnouncer(v.uplinkIdx, v.uplinkMAC); err != nil {
			return nil, err
		}
	}
	v.reap, v.reaped = make(chan reapItem, 4096), make(chan struct{})
	v.pending = map[string][]reapItem{}
	go v.reaper()
	return v, nil
}

// Close finishes pending link deletions and releases the datapath's
// sockets; the pods' wiring stays.
func (v *Veth) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	close(v.reap)
	v.mu.Unlock()
	<-v.reaped
	if v.garp == nil {
		return nil
	}
	return v.garp.Close()
}

// Info implements datapath.Datapath.
func (v *Veth) Info() datapath.Info {
	return datapath.Info{Mode: "veth", Uplink: v.Uplink, MTU: v.MTU, NodeIP: v.UplinkIP(), PodVeth: true, NICRoutes: true}
}

// has says whether the node was prepared for family f.
func (v *Veth) has(f family.Family) bool {
	if len(v.families) == 0 {
		return f == family.V4
	}
	return family.Has(v.families, f)
}

// PrepareNode sets the node's sysctls for routed pods of the given
// families (none named: IPv4) on uplink ("" = the interface of the
// default route). It writes only what differs, so an agent without a
// writable /proc/sys (a container that is not privileged) starts once a
// privileged step ran this.
func PrepareNode(uplink string, families ...family.Family) error {
	uplink, err := nlutil.UplinkName(uplink)
	if err != nil {
		return err
	}
	// In order: an uplink keeps taking router advertisements
	// (accept_ra=2) before forwarding goes on (ipv6Sysctls).
	errs := []error{nlutil.WriteSysctls(nodeSysctls(uplink, families))}
	if wantsV4(families) {
		errs = append(errs, defaultProxyDelay())
	}
	return errors.Join(errs...)
}

// wantsV4 says whether a node of families has IPv4 pods.
func wantsV4(families []family.Family) bool {
	return len(families) == 0 || family.Has(families, family.V4)
}

// nodeSysctls are what routed pods of the families need on the node, in
// the order to write them: forwarding, and proxy ARP (NDP) answers on the
// uplink without the kernel's random delay (up to 0.8 s by default, on
// every neighbour's first ARP or neighbour solicitation for a pod).
func nodeSysctls(uplink string, families []family.Family) []datapath.Sysctl {
	var out []datapath.Sysctl
	if wantsV4(families) {
		out = append(out, datapath.Forwarding,
			datapath.Sysctl{Key: "net/ipv4/neigh/" + uplink + "/proxy_delay", Value: "0", Why: "the node answers ARP for its pods on the uplink at once, not after up to 0.8 s"})
	}
	if family.Has(families, family.V6) {
		out = append(out, ipv6Sysctls(uplink)...)
	}
	return out
}

// defaultProxyDelay sets neigh.default.proxy_delay to 0, which a NIC a
// provider hot-plugs later (a secondary NIC, an ENI) takes when it
// appears: the agent's container may not write its own (see nicSysctls).
// Only the host's initial network namespace has the default (a node in a
// namespace of its own — the lab's — has none): there it is left alone.
func defaultProxyDelay() error {
	if err := nlutil.WriteSysctl("net/ipv4/neigh/default/proxy_delay", "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// HostIfName is the node-side name of an attachment's veth: "vpc" and 11 hex
// digits of a hash of container ID and interface, stable across restarts.
func HostIfName(containerID, ifName string) string {
	return "vpc" + hashHex(containerID + "/" + ifName)[:11]
}

func hashHex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// macFor derives a stable, locally administered unicast MAC.
func macFor(key, side string) net.HardwareAddr {
	h := sha256.Sum256([]byte(side + "/" + key))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
}

// wiring is what Setup makes for a: the host veth, the pod's interface
// with each of its addresses alone (/32, /128), a default route per family
// via that family's link-local gateway.
func wiring(a *alloc.Allocation) alloc.Wiring {
	w := alloc.Wiring{
		Interfaces: []alloc.Interface{
			{Name: HostIfName(a.ContainerID, a.IfName), MAC: macFor(a.Key(), "host").String()},
			{Name: a.IfName, MAC: macFor(a.Key(), "pod").String(), Sandbox: a.Netns},
		},
	}
	for _, f := range leaseFamilies(a) {
		w.Routes = append(w.Routes, alloc.Route{Dst: f.Default(), GW: gatewayOf(f)})
	}
	for _, l := range a.Leases() {
		w.IPs = append(w.IPs, alloc.IPConfig{Interface: 1, Address: family.Host(l.Address), Gateway: gatewayOf(family.Of(l.Address))})
	}
	return w
}

// leaseFamilies are the families of a's addresses, in lease order.
func leaseFamilies(a *alloc.Allocation) []family.Family {
	var out []family.Family
	for _, l := range a.Leases() {
		if f := family.Of(l.Address); f != 0 && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// withLease is a with l as its lease: the secondary-NIC code routes one
// address at a time.
func withLease(a *alloc.Allocation, l alloc.Lease) *alloc.Allocation {
	b := *a
	b.Lease, b.Others = l, nil
	return &b
}

// ipNet is p as the netlink library spells a prefix.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nlFamily is the netlink family of an address.
func nlFamily(ip netip.Addr) int { return nlFamilyOf(family.Of(ip)) }

// nlFamilyOf is the netlink family of f.
func nlFamilyOf(f family.Family) int {
	if f == family.V6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// proxyKind names the node's proxy neighbour entry for ip's family.
func proxyKind(ip netip.Addr) string {
	if family.Of(ip) == family.V6 {
		return "proxy NDP entry"
	}
	return "proxy ARP entry"
}

// leaseError refuses, before anything is made, an address this mode cannot
// wire.
func (v *Veth) leaseError(a *alloc.Allocation) error {
	for _, l := range a.Leases() {
		// A passthrough lease (the NIC's own address is the pod's) is a
		// NIC for the pod itself, not one to route by: the provider wants
		// mode passthrough.
		if l.NIC != nil && l.NIC.Address == l.Address {
			return &SetupError{Step: "lease", Err: datapath.OnUplink(l, "veth")}
		}
		f := family.Of(l.Address)
		if !v.has(f) {
			return &SetupError{Step: "lease", Err: fmt.Errorf("%s address %s for a node not prepared for %s: the agent's ipFamilies has no %s", f, l.Address, f, f)}
		}
	}
	return nil
}

// hostEnd names the attachment's host veth and its MACs.
type hostEnd struct {
	HostIf          string
	HostMAC, PodMAC net.HardwareAddr
}

// Setup implements datapath.Datapath. On failure it removes whatever it
// created.
func (v *Veth) Setup(_ context.Context, a *alloc.Allocation) (_ alloc.Wiring, err error) {
	if err := v.leaseError(a); err != nil {
		return alloc.Wiring{}, err
	}
	w := hostEnd{HostIf: HostIfName(a.ContainerID, a.IfName), HostMAC: macFor(a.Key(), "host"), PodMAC: macFor(a.Key(), "pod")}
	podNs, err := netns.GetFromPath(a.Netns)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "open pod netns " + a.Netns, BadRequest: true, Err: err}
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "netlink in pod netns", Err: err}
	}
	defer pod.Close()
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name: w.HostIf, MTU: v.MTU, HardwareAddr: w.HostMAC, Flags: net.FlagUp,
		},
		PeerName:         a.IfName,
		PeerHardwareAddr: w.PodMAC,
		PeerNamespace:    netlink.NsFd(int(podNs)),
		PeerMTU:          uint32(v.MTU),
	}
	if err := netlink.LinkAdd(veth); errors.Is(err, syscall.EEXIST) {
		if err := v.clearWay(a, w.HostIf, pod); err != nil {
			return alloc.Wiring{}, err
		}
		veth.Index = 0
		if err := netlink.LinkAdd(veth); err != nil {
			return alloc.Wiring{}, &SetupError{Step: "create veth " + w.HostIf, Err: err}
		}
	} else if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "create veth " + w.HostIf, Err: err}
	}
	defer func() {
		if err != nil {
			_ = v.undo(a)
		}
	}()
	// The kernel ignores an alias given at creation; it marks the link ours.
	if err = netlink.LinkSetAlias(veth, AliasPrefix+a.Key()); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "mark host end " + w.HostIf, Err: err}
	}
	if err = wirePod(pod, a, w); err != nil {
		return alloc.Wiring{}, err
	}
	// LinkAdd created the host end up and looked up its index.
	for _, l := range a.Leases() {
		if err = v.wireNode(veth.Attrs().Index, a, l, w.PodMAC); err != nil {
			return alloc.Wiring{}, err
		}
	}
	return wiring(a), nil
}

// wirePod gives the pod's end its addresses, and for each family a
// default route via the link-local gateway, which a permanent neighbour
// entry resolves to the host veth's MAC.
func wirePod(pod *netlink.Handle, a *alloc.Allocation, w hostEnd) error {
	podLink, err := pod.LinkByName(a.IfName)
	if err != nil {
		return &SetupError{Step: "find pod end " + a.IfName, Err: err}
	}
	idx := podLink.Attrs().Index
	fams := leaseFamilies(a)
	if slices.Contains(fams, family.V6) {
		if err := nlutil.PodIPv6Sysctls(a.Netns, a.IfName); err != nil {
			return &SetupError{Step: "pod IPv6 settings", Err: err}
		}
	}
	for _, l := range a.Leases() {
		addr := &netlink.Addr{IPNet: ipNet(family.Host(l.Address))}
		if family.Of(l.Address) == family.V6 {
			// Usable at once: duplicate address detection would hold the
			// address tentative for ~2 s (measured), and the node alone
			// decides who has it.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(podLink, addr); err != nil {
			return &SetupError{Step: "pod address " + l.Address.String(), Err: err}
		}
	}
	if err := pod.LinkSetUp(podLink); err != nil {
		return &SetupError{Step: "pod link up", Err: err}
	}
	for _, f := range fams {
		gw := gatewayOf(f)
		if f == family.V4 {
			// An IPv6 link-local next hop needs no route to it: the
			// interface named is the link.
			if err := pod.RouteAdd(&netlink.Route{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: ipNet(family.Host(gw))}); err != nil {
				return routeError("pod route to gateway", err)
			}
		}
		if err := pod.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice(), Dst: ipNet(f.Default())}); err != nil {
			return routeError("pod default route", err)
		}
		if err := pod.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: nlFamily(gw), State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: w.HostMAC}); err != nil {
			return &SetupError{Step: "pod gateway neighbour " + gw.String(), Err: err}
		}
	}
	return nil
}

// wireNode routes one of the pod's addresses to its host veth and has the
// node answer ARP (NDP) for it on the uplink, or on its secondary NIC.
func (v *Veth) wireNode(hostIdx int, a *alloc.Allocation, l alloc.Lease, podMAC net.HardwareAddr) error {
	if err := netlink.RouteReplace(v.hostRoute(hostIdx, l.Address)); err != nil {
		return &SetupError{Step: "host route to pod " + l.Address.String(), Err: err}
	}
	if family.Of(l.Address) == family.V6 {
		if err := netlink.NeighSet(podNeighbour(hostIdx, l.Address, podMAC)); err != nil {
			return &SetupError{Step: "node neighbour " + l.Address.String(), Err: err}
		}
	}
	if l.NIC != nil {
		// The address lives on a secondary NIC: it is routed by it, and
		// the node answers ARP (NDP) for it there (nic.go).
		nicIdx, err := v.wireNIC(withLease(a, l))
		if err != nil {
			return &SetupError{Step: "route by NIC " + l.NIC.MAC, Err: err}
		}
		if err = netlink.NeighSet(proxyOn(nicIdx, l.Address)); err != nil {
			return &SetupError{Step: proxyKind(l.Address) + " on NIC " + l.NIC.MAC, Err: err}
		}
		v.announceOn(nicIdx, l)
		return nil
	}
	if err := netlink.NeighSet(v.proxyEntry(l.Address)); err != nil {
		return &SetupError{Step: proxyKind(l.Address) + " on " + v.Uplink, Err: err}
	}
	// Neighbours that knew this address elsewhere learn its new home now.
	// Best effort: a lost announcement only delays them until their
	// neighbour entry ages, it does not break the pod.
	if v.garp != nil {
		_ = v.garp.Announce(l.Address)
	}
	return nil
}

// clearWay handles a name clash when creating the veth pair: a leftover
// host end of this very attachment (an ADD cut short) is removed; a pod end
// of a pod just released from this namespace is reaped at once; anything
// else is the caller's problem.
func (v *Veth) clearWay(a *alloc.Allocation, hostIf string, pod *netlink.Handle) error {
	if _, err := netlink.LinkByName(hostIf); err == nil {
		if err := v.deleteHostLink(hostIf, a.Key()); err != nil {
			return &SetupError{Step: "replace leftover " + hostIf, Err: err}
		}
		return nil
	}
	if _, err := pod.LinkByName(a.IfName); err == nil {
		v.reapNow(a.Netns)
		if _, err := pod.LinkByName(a.IfName); err == nil {
			return &SetupError{Step: "pod interface", BadRequest: true,
				Err: fmt.Errorf("%s already exists in %s", a.IfName, a.Netns)}
		}
	}
	return nil
}

// routeError explains the usual cause of a clash in the pod's routes: the
// pod already has an interface with a default route.
func routeError(step string, err error) error {
	if errors.Is(err, syscall.EEXIST) {
		return &SetupError{Step: step, BadRequest: true,
			Err: errors.New("the pod namespace already routes via " + Gateway.String() + " or has a default route: vpcni wires one routed interface per pod")}
	}
	return &SetupError{Step: step, Err: err}
}

func (v *Veth) hostRoute(linkIdx int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{
		LinkIndex: linkIdx,
		Scope:     netlink.SCOPE_LINK,
		Dst:       ipNet(family.Host(ip)),
		Protocol:  RouteProtocol,
	}
}

func (v *Veth) proxyEntry(ip netip.Addr) *netlink.Neigh { return proxyOn(v.uplinkIdx, ip) }

// Teardown implements datapath.Datapath: it takes a deleted pod off the
// network at once — its routes and its proxy ARP (NDP) entries go now — and deletes
// its veth pair in the background.
// Deleting a link waits for an RCU grace period in the kernel (12-35 ms
// here); the pod's DEL need not. The address cools down before reuse, and a
// link a crash leaves behind is an orphan the next start removes.
func (v *Veth) Teardown(_ context.Context, a *alloc.Allocation) error {
	name, alias := HostIfName(a.ContainerID, a.IfName), AliasPrefix+a.Key()
	var errs []error
	link, err := netlink.LinkByName(name)
	switch {
	case nlutil.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("look up %s: %w", name, err)
	case link.Attrs().Alias != alias:
		errs = append(errs, fmt.Errorf("%s belongs to %q, not to %s: left alone", name, link.Attrs().Alias, a.Key()))
	default:
		for _, l := range a.Leases() {
			if err := netlink.RouteDel(v.hostRoute(link.Attrs().Index, l.Address)); err != nil && !nlutil.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete route to %s: %w", l.Address, err))
			}
		}
		item := reapItem{index: link.Attrs().Index, alias: alias, netns: a.Netns}
		v.mu.Lock()
		v.pending[a.Netns] = append(v.pending[a.Netns], item)
		queued := false
		if !v.closed {
			select {
			case v.reap <- item:
				queued = true
			default: // the reaper is far behind
			}
		}
		v.mu.Unlock()
		if !queued {
			v.reapOne(item) // delete in line
		}
	}
	for _, l := range a.Leases() {
		errs = append(errs, v.unwireAddress(a, l))
	}
	return errors.Join(errs...)
}

// unwireAddress removes the node's proxy entry of one of the pod's
// addresses (and its rule, on a secondary NIC). Gone already is fine.
func (v *Veth) unwireAddress(a *alloc.Allocation, l alloc.Lease) error {
	if l.NIC != nil {
		return v.unwireNIC(withLease(a, l))
	}
	if err := netlink.NeighDel(v.proxyEntry(l.Address)); err != nil && !nlutil.IsNotFound(err) {
		return fmt.Errorf("delete %s %s on %s: %w", proxyKind(l.Address), l.Address, v.Uplink, err)
	}
	return nil
}

// reaper deletes released links in the background.
func (v *Veth) reaper() {
	defer close(v.reaped)
	for item := range v.reap {
		v.reapOne(item)
	}
}

// reapOne deletes a released link by index, after checking the index still
// names the link released (a new pod may reuse the name meanwhile).
func (v *Veth) reapOne(item reapItem) {
	if link, err := netlink.LinkByIndex(item.index); err == nil && link.Attrs().Alias == item.alias {
		_ = netlink.LinkDel(link)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	items := slices.DeleteFunc(v.pending[item.netns], func(i reapItem) bool { return i == item })
	if len(items) == 0 {
		delete(v.pending, item.netns)
	} else {
		v.pending[item.netns] = items
	}
}

// reapNow deletes at once the released links of a pod namespace and says
// whether there were any.
func (v *Veth) reapNow(netns string) bool {
	v.mu.Lock()
	items := slices.Clone(v.pending[netns])
	v.mu.Unlock()
	for _, item := range items {
		v.reapOne(item)
	}
	return len(items) > 0
}

// undo removes at once what Setup created for the attachment, and nothing
// else: a failed Setup's rollback. Idempotent: what is gone is fine.
func (v *Veth) undo(a *alloc.Allocation) error {
	var errs []error
	if err := v.deleteHostLink(HostIfName(a.ContainerID, a.IfName), a.Key()); err != nil {
		errs = append(errs, err)
	}
	for _, l := range a.Leases() {
		if l.Address.IsValid() {
			errs = append(errs, v.unwireAddress(a, l))
		}
	}
	return errors.Join(errs...)
}

// deleteHostLink removes the host veth (its pod end goes with it) if it is
// there and is this attachment's (nlutil.DeleteOwnedVeth).
func (v *Veth) deleteHostLink(name, key string) error {
	return nlutil.DeleteOwnedVeth(name, AliasPrefix+key)
}

// UplinkIP is the uplink's first IPv4 address (invalid if it has none): the
// node's address on the pods' network, by which a cloud finds its port.
func (v *Veth) UplinkIP() netip.Addr { return nlutil.LinkIPv4(v.Uplink) }

// Wiring is what Setup makes for a (its host veth and pod interface with
// their MACs, the pod's addresses and routes), computed without looking at
// the kernel: for a mode built on this one.
func Wiring(a *alloc.Allocation) alloc.Wiring { return wiring(a) }

// NodeNeeds is what routed pods of the families (none named: IPv4) need
// of the node's kernel (the uplink's name resolved): veth links,
// forwarding, prompt proxy ARP (NDP).
func NodeNeeds(uplink string, families ...family.Family) datapath.Needs {
	return datapath.Needs{Links: []string{"veth"}, Sysctls: nodeSysctls(uplink, families)}
}
