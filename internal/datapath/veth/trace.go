package veth

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

// Check implements datapath.Datapath.
func (v *Veth) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	return wiring(a), datapath.Problems(v.trace(a))
}

// Trace implements datapath.Datapath: the host veth, then for each of the
// pod's addresses its /32 (/128) route, its permanent neighbour entry (an
// IPv6 address) and its proxy ARP (NDP) entry (or a secondary NIC's rules,
// table and entry), then the pod's interface, addresses, and for each
// family its default route and gateway neighbour.
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
	hostMAC, podMAC := macFor(a.Key(), "host"), macFor(a.Key(), "pod")
	link, err := netlink.LinkByName(hostIf)
	if err != nil {
		// Without the host veth the pod is cut off: the reconcile reports
		// it broken and the agent re-wires the pod.
		h.add(datapath.HopNode, "host veth "+hostIf, false, datapath.HopMissing, fmt.Sprintf("host veth %s: %v", hostIf, err))
		return append(h, v.tracePod(a, hostMAC)...)
	}
	idx := link.Attrs().Index
	alias := link.Attrs().Alias == AliasPrefix+a.Key()
	h.add(datapath.HopNode, "host veth "+hostIf, alias, datapath.HopWrong, fmt.Sprintf("host veth %s has alias %q", hostIf, link.Attrs().Alias))
	h.add(datapath.HopNode, "host veth "+hostIf+" up", link.Attrs().Flags&net.FlagUp != 0, datapath.HopWrong, fmt.Sprintf("host veth %s is down", hostIf))
	for _, l := range a.Leases() {
		host := family.Host(l.Address)
		h.add(datapath.HopNode, fmt.Sprintf("route %s dev %s", host, hostIf), v.hasRoute(&netlink.Handle{}, idx, l.Address, nil),
			datapath.HopMissing, fmt.Sprintf("node has no route %s dev %s", host, hostIf))
		if family.Of(l.Address) == family.V6 {
			h.add(datapath.HopNode, fmt.Sprintf("neighbour %s -> %s dev %s (permanent)", l.Address, podMAC, hostIf), hasNeighbour(idx, l.Address, podMAC),
				datapath.HopMissing, fmt.Sprintf("node has no permanent neighbour %s -> %s dev %s", l.Address, podMAC, hostIf))
		}
		if l.NIC != nil {
			h = append(h, v.traceNIC(withLease(a, l))...)
			continue
		}
		kind := proxyKind(l.Address)
		h.add(datapath.HopNode, fmt.Sprintf("%s %s on %s", kind, l.Address, v.Uplink), v.hasProxyEntry(l.Address),
			datapath.HopMissing, fmt.Sprintf("no %s for %s on %s", kind, l.Address, v.Uplink))
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
	idx := link.Attrs().Index
	h.add(datapath.HopPod, "pod interface "+a.IfName+" up", link.Attrs().Flags&net.FlagUp != 0, datapath.HopWrong, fmt.Sprintf("pod interface %s is down", a.IfName))
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return pod.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		h.add(datapath.HopPod, "pod addresses", false, datapath.HopWrong, fmt.Sprintf("pod addresses: %v", err))
		return h
	}
	for _, l := range a.Leases() {
		host := family.Host(l.Address)
		found := slices.ContainsFunc(addrs, func(ad netlink.Addr) bool {
			ip, ok := netip.AddrFromSlice(ad.IP)
			return ok && ip.Unmap() == host.Addr()
		})
		h.add(datapath.HopPod, fmt.Sprintf("address %s on %s", host, a.IfName), found, datapath.HopMissing, fmt.Sprintf("pod interface %s lacks %s", a.IfName, host))
	}
	for _, f := range leaseFamilies(a) {
		gw := gatewayOf(f)
		h.add(datapath.HopPod, fmt.Sprintf("default route via %s dev %s", gw, a.IfName), v.hasRoute(pod, idx, netip.Addr{}, gw.AsSlice()),
			datapath.HopMissing, fmt.Sprintf("pod has no default route via %s dev %s", gw, a.IfName))
		neighs, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return pod.NeighList(idx, nlFamily(gw)) })
		if err != nil {
			h.add(datapath.HopPod, "pod neighbours", false, datapath.HopWrong, fmt.Sprintf("pod neighbours: %v", err))
			return h
		}
		found := slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
			return n.IP.Equal(gw.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == hostMAC.String()
		})
		h.add(datapath.HopPod, fmt.Sprintf("neighbour %s -> %s (permanent)", gw, hostMAC), found, datapath.HopMissing,
			fmt.Sprintf("pod has no permanent neighbour %s -> %s", gw, hostMAC))
	}
	return h
}

// hasRoute looks for the host route to dst on linkIdx that the FIB matches
// for dst (dst valid), or a default route via gw on linkIdx, in the
// handle's namespace (zero Handle: the node's).
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
	fam := netlink.FAMILY_V4
	if gw.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	filter := &netlink.Route{LinkIndex: linkIdx}
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(fam, filter, netlink.RT_FILTER_OIF)
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
