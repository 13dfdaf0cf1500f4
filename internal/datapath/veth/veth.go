// Package veth is the routed veth datapath mode ("veth", the default):
//
//	pod:  eth0 (veth) <ip>/32, 169.254.1.1 scope link, default via
//	      169.254.1.1, permanent neighbour 169.254.1.1 -> host veth MAC
//	node: <ip>/32 dev vpc<hash> (protocol vpcni), a proxy neighbour entry
//	      for <ip> on the uplink so the node answers ARP for the pod,
//	      a gratuitous ARP on the uplink when the pod appears
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

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

func init() {
	datapath.Register(datapath.Registration{
		Name:        "veth",
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return NewVeth(node.Uplink, node.MTU, *s.(*Settings).GARP)
		},
		Prepare: func(node datapath.Node, _ datapath.Settings) error { return PrepareNode(node.Uplink) },
		Needs:   func(node datapath.Node, _ datapath.Settings) datapath.Needs { return NodeNeeds(node.Uplink) },
	})
}

// Settings is the mode's section of vpcnid.yaml (datapath.veth).
type Settings struct {
	// GARP: announce a pod's address on the uplink with a gratuitous ARP
	// when it is wired, so neighbours that knew the address elsewhere
	// learn its new home at once (default true).
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

// Gateway is the link-local next hop every pod routes through.
var Gateway = netip.MustParseAddr("169.254.1.1")

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
	garp      *arpSender // nil: gratuitous ARP disabled
	reap      chan reapItem
	reaped    chan struct{}

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
// empty), settles the MTU and prepares the node's sysctls.
func NewVeth(uplink string, mtu int, garp bool) (*Veth, error) {
	link, err := nlutil.Uplink(uplink)
	if err != nil {
		return nil, err
	}
	uplink = link.Attrs().Name
	if mtu == 0 {
		mtu = link.Attrs().MTU
	}
	v := &Veth{Uplink: uplink, uplinkIdx: link.Attrs().Index, uplinkMAC: link.Attrs().HardwareAddr, MTU: mtu}
	if err := v.prepareNode(); err != nil {
		return nil, err
	}
	if garp {
		if v.garp, err = newARPSender(v.uplinkIdx, v.uplinkMAC); err != nil {
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

// prepareNode sets what routed pods need on the node: forwarding, and proxy
// ARP answers without the kernel's random delay (0.8 s by default).
func (v *Veth) prepareNode() error { return PrepareNode(v.Uplink) }

// PrepareNode sets the node's sysctls for routed pods on uplink ("" = the
// interface of the default route). It writes only what differs, so an
// agent without a writable /proc/sys (a container that is not privileged)
// starts once a privileged step ran this.
func PrepareNode(uplink string) error {
	uplink, err := nlutil.UplinkName(uplink)
	if err != nil {
		return err
	}
	return errors.Join(nlutil.WriteSysctls(nodeSysctls(uplink)), defaultProxyDelay())
}

// nodeSysctls are what routed pods need on the node: forwarding, and proxy
// ARP answers on the uplink without the kernel's random delay (up to 0.8 s
// by default, on every neighbour's first ARP for a pod).
func nodeSysctls(uplink string) []datapath.Sysctl {
	return []datapath.Sysctl{datapath.Forwarding,
		{Key: "net/ipv4/neigh/" + uplink + "/proxy_delay", Value: "0", Why: "the node answers ARP for its pods on the uplink at once, not after up to 0.8 s"}}
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
// with its /32, the default route via the link-local gateway.
func wiring(a *alloc.Allocation) alloc.Wiring {
	return alloc.Wiring{
		Interfaces: []alloc.Interface{
			{Name: HostIfName(a.ContainerID, a.IfName), MAC: macFor(a.Key(), "host").String()},
			{Name: a.IfName, MAC: macFor(a.Key(), "pod").String(), Sandbox: a.Netns},
		},
		IPs:    []alloc.IPConfig{{Interface: 1, Address: netip.PrefixFrom(a.Address, 32), Gateway: Gateway}},
		Routes: []alloc.Route{{Dst: netip.PrefixFrom(netip.IPv4Unspecified(), 0), GW: Gateway}},
	}
}

// hostEnd names the attachment's host veth and its MACs.
type hostEnd struct {
	HostIf          string
	HostMAC, PodMAC net.HardwareAddr
}

// Setup implements datapath.Datapath. On failure it removes whatever it
// created.
func (v *Veth) Setup(_ context.Context, a *alloc.Allocation) (_ alloc.Wiring, err error) {
	// A passthrough lease (the NIC's own address is the pod's) is a NIC
	// for the pod itself, not one to route by: the provider wants mode
	// passthrough.
	if a.NIC != nil && a.NIC.Address == a.Address {
		return alloc.Wiring{}, &SetupError{Step: "lease", Err: datapath.OnUplink(a.Lease, "veth")}
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

	podIP := &net.IPNet{IP: a.Address.AsSlice(), Mask: net.CIDRMask(32, 32)}
	gw := Gateway.AsSlice()
	podLink, err := pod.LinkByName(a.IfName)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "find pod end " + a.IfName, Err: err}
	}
	idx := podLink.Attrs().Index
	if err = pod.AddrAdd(podLink, &netlink.Addr{IPNet: podIP}); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "pod address", Err: err}
	}
	if err = pod.LinkSetUp(podLink); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "pod link up", Err: err}
	}
	if err = pod.RouteAdd(&netlink.Route{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}}); err != nil {
		return alloc.Wiring{}, routeError("pod route to gateway", err)
	}
	if err = pod.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}); err != nil {
		return alloc.Wiring{}, routeError("pod default route", err)
	}
	if err = pod.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: w.HostMAC}); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "pod gateway neighbour", Err: err}
	}

	// LinkAdd created the host end up and looked up its index.
	if err = netlink.RouteReplace(v.hostRoute(veth.Attrs().Index, a.Address)); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "host route to pod", Err: err}
	}
	if a.NIC != nil {
		// The address lives on a secondary NIC: it is routed by it, and
		// the node answers ARP for it there (nic.go).
		nicIdx, err := v.wireNIC(a)
		if err != nil {
			return alloc.Wiring{}, &SetupError{Step: "route by NIC " + a.NIC.MAC, Err: err}
		}
		if err = netlink.NeighSet(proxyOn(nicIdx, a.Address)); err != nil {
			return alloc.Wiring{}, &SetupError{Step: "proxy ARP entry on NIC " + a.NIC.MAC, Err: err}
		}
		v.announceOn(nicIdx, a)
		return wiring(a), nil
	}
	if err = netlink.NeighSet(v.proxyEntry(a.Address)); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "proxy ARP entry on " + v.Uplink, Err: err}
	}
	// Neighbours that knew this address elsewhere learn its new home now.
	// Best effort: a lost announcement only delays them until their ARP
	// entry ages, it does not break the pod.
	if v.garp != nil {
		_ = v.garp.Announce(a.Address)
	}
	return wiring(a), nil
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
		Dst:       &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Protocol:  RouteProtocol,
	}
}

func (v *Veth) proxyEntry(ip netip.Addr) *netlink.Neigh { return proxyOn(v.uplinkIdx, ip) }

// Teardown implements datapath.Datapath: it takes a deleted pod off the
// network at once — its route and its proxy ARP entry go now — and deletes
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
		if err := netlink.RouteDel(v.hostRoute(link.Attrs().Index, a.Address)); err != nil && !nlutil.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete route to %s: %w", a.Address, err))
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
	if a.NIC != nil {
		errs = append(errs, v.unwireNIC(a))
	} else if err := netlink.NeighDel(v.proxyEntry(a.Address)); err != nil && !nlutil.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete proxy ARP entry %s on %s: %w", a.Address, v.Uplink, err))
	}
	return errors.Join(errs...)
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
	if a.Address.IsValid() && a.NIC != nil {
		errs = append(errs, v.unwireNIC(a))
	} else if a.Address.IsValid() {
		if err := netlink.NeighDel(v.proxyEntry(a.Address)); err != nil && !nlutil.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete proxy ARP entry %s on %s: %w", a.Address, v.Uplink, err))
		}
	}
	return errors.Join(errs...)
}

// deleteHostLink removes the host veth (its pod end goes with it) if it is
// there and is this attachment's (nlutil.DeleteOwnedVeth).
func (v *Veth) deleteHostLink(name, key string) error {
	return nlutil.DeleteOwnedVeth(name, AliasPrefix+key)
}

// Check implements datapath.Datapath.
func (v *Veth) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	return wiring(a), datapath.Problems(v.trace(a))
}

// Trace implements datapath.Datapath: the host veth, its /32 route, the
// proxy ARP entry (or a secondary NIC's rules, table and entry), then the
// pod's interface, address, default route and gateway neighbour.
func (v *Veth) Trace(_ context.Context, a *alloc.Allocation) []datapath.Hop {
	return v.trace(a)
}

// hops collects a trace.
type hops []datapath.Hop

// add records a piece: ok, or not with what is wrong.
func (h *hops) add(where, what string, ok bool, state, detail string) {
	hop := datapath.Hop{Where: where, What: what, State: datapath.HopOK}
	if !ok {
		hop.State, hop.Detail, hop.Fix = state, detail, datapath.FixNode
		if where == datapath.HopPod {
			hop.Fix = datapath.FixPod
		}
	}
	*h = append(*h, hop)
}

func (v *Veth) trace(a *alloc.Allocation) []datapath.Hop {
	var h hops
	hostIf := HostIfName(a.ContainerID, a.IfName)
	hostMAC := macFor(a.Key(), "host")
	link, err := netlink.LinkByName(hostIf)
	if err != nil {
		// Without the host veth the pod is cut off: the reconcile reports
		// it broken and the agent re-wires the pod.
		h.add(datapath.HopNode, "host veth "+hostIf, false, datapath.HopMissing, fmt.Sprintf("host veth %s: %v", hostIf, err))
		return append(h, v.tracePod(a, hostMAC)...)
	}
	alias := link.Attrs().Alias == AliasPrefix+a.Key()
	h.add(datapath.HopNode, "host veth "+hostIf, alias, datapath.HopWrong, fmt.Sprintf("host veth %s has alias %q", hostIf, link.Attrs().Alias))
	h.add(datapath.HopNode, "host veth "+hostIf+" up", link.Attrs().Flags&net.FlagUp != 0, datapath.HopWrong, fmt.Sprintf("host veth %s is down", hostIf))
	h.add(datapath.HopNode, fmt.Sprintf("route %s/32 dev %s", a.Address, hostIf), v.hasRoute(&netlink.Handle{}, link.Attrs().Index, a.Address, nil),
		datapath.HopMissing, fmt.Sprintf("node has no route %s/32 dev %s", a.Address, hostIf))
	if a.NIC != nil {
		h = append(h, v.traceNIC(a)...)
	} else {
		h.add(datapath.HopNode, fmt.Sprintf("proxy ARP entry %s on %s", a.Address, v.Uplink), v.hasProxyEntry(a.Address),
			datapath.HopMissing, fmt.Sprintf("no proxy ARP entry for %s on %s", a.Address, v.Uplink))
	}
	return append(h, v.tracePod(a, hostMAC)...)
}

func (v *Veth) tracePod(a *alloc.Allocation, hostMAC net.HardwareAddr) []datapath.Hop {
	var h hops
	podNs, err := netns.GetFromPath(a.Netns)
	if err != nil {
		h.add(datapath.HopPod, "pod netns "+a.Netns, false, datapath.HopMissing, fmt.Sprintf("pod netns %s: %v", a.Netns, err))
		return h
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs)
	if err != nil {
		h.add(datapath.HopPod, "pod netns "+a.Netns, false, datapath.HopWrong, fmt.Sprintf("netlink in pod netns: %v", err))
		return h
	}
	defer pod.Close()
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		h.add(datapath.HopPod, "pod interface "+a.IfName, false, datapath.HopMissing, fmt.Sprintf("pod interface %s: %v", a.IfName, err))
		return h
	}
	h.add(datapath.HopPod, "pod interface "+a.IfName+" up", link.Attrs().Flags&net.FlagUp != 0, datapath.HopWrong, fmt.Sprintf("pod interface %s is down", a.IfName))
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return pod.AddrList(link, netlink.FAMILY_V4) })
	if err != nil {
		h.add(datapath.HopPod, "pod addresses", false, datapath.HopWrong, fmt.Sprintf("pod addresses: %v", err))
		return h
	}
	found := slices.ContainsFunc(addrs, func(ad netlink.Addr) bool {
		ip, ok := netip.AddrFromSlice(ad.IP.To4())
		return ok && ip == a.Address
	})
	h.add(datapath.HopPod, fmt.Sprintf("address %s/32 on %s", a.Address, a.IfName), found, datapath.HopMissing, fmt.Sprintf("pod interface %s lacks %s/32", a.IfName, a.Address))
	h.add(datapath.HopPod, fmt.Sprintf("default route via %s dev %s", Gateway, a.IfName), v.hasRoute(pod, link.Attrs().Index, netip.Addr{}, Gateway.AsSlice()),
		datapath.HopMissing, fmt.Sprintf("pod has no default route via %s dev %s", Gateway, a.IfName))
	neighs, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return pod.NeighList(link.Attrs().Index, netlink.FAMILY_V4) })
	if err != nil {
		h.add(datapath.HopPod, "pod neighbours", false, datapath.HopWrong, fmt.Sprintf("pod neighbours: %v", err))
		return h
	}
	found = slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
		return n.IP.Equal(Gateway.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == hostMAC.String()
	})
	h.add(datapath.HopPod, fmt.Sprintf("neighbour %s -> %s (permanent)", Gateway, hostMAC), found, datapath.HopMissing,
		fmt.Sprintf("pod has no permanent neighbour %s -> %s", Gateway, hostMAC))
	return h
}

// hasRoute looks for the /32 to dst on linkIdx that the FIB matches for dst (dst valid), or a default route
// via gw on linkIdx, in the handle's namespace (zero Handle: the node's).
func (v *Veth) hasRoute(h *netlink.Handle, linkIdx int, dst netip.Addr, gw net.IP) bool {
	if dst.IsValid() {
		// The route the FIB matches for dst, asked for alone: the health
		// probe asks for every pod of the node, and a dump of the node's
		// routes per pod made each pass O(pods²) (bench node-scale).
		routes, err := h.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
		return err == nil && slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return r.LinkIndex == linkIdx && r.Dst != nil && r.Dst.IP.Equal(dst.AsSlice()) && isHostMask(r.Dst.Mask)
		})
	}
	filter := &netlink.Route{LinkIndex: linkIdx}
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return false
	}
	for _, r := range routes {
		if gw != nil && r.Gw.Equal(gw) && (r.Dst == nil || nlutil.IsZeroMask(r.Dst.Mask)) {
			return true
		}
	}
	return false
}

func isHostMask(m net.IPMask) bool {
	ones, bits := m.Size()
	return ones == bits
}

func (v *Veth) hasProxyEntry(ip netip.Addr) bool { return v.hasProxyOn(v.uplinkIdx, ip) }

// UplinkIP is the uplink's first IPv4 address (invalid if it has none): the
// node's address on the pods' network, by which a cloud finds its port.
func (v *Veth) UplinkIP() netip.Addr { return nlutil.LinkIPv4(v.Uplink) }

// Wiring is what Setup makes for a (its host veth and pod interface with
// their MACs, the pod's address and route), computed without looking at
// the kernel: for a mode built on this one.
func Wiring(a *alloc.Allocation) alloc.Wiring { return wiring(a) }

// NodeNeeds is what routed pods need of the node's kernel (the uplink's
// name resolved): veth links, forwarding, prompt proxy ARP.
func NodeNeeds(uplink string) datapath.Needs {
	return datapath.Needs{Links: []string{"veth"}, Sysctls: nodeSysctls(uplink)}
}
