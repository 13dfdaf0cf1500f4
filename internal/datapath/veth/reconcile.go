package veth

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

// Reconcile implements datapath.Datapath. It reads the node's links, its
// vpcni routes, the uplink's proxy entries and the node's IPv6 neighbours
// once each (both families) — not once per pod: per-pod dumps made an
// agent with 166 pods take seconds to start — and then:
//   - a desired allocation whose host veth is there gets, for each of its
//     addresses, its route, its proxy ARP (NDP) entry and (IPv6) its
//     permanent neighbour entry back, and its link state; one whose host
//     veth is gone is reported Broken (only a Setup inside the pod can
//     bring it back);
//   - a host veth of vpcni's that no desired allocation names is deleted,
//     with the proxy entries of the addresses routed to it;
//   - a vpcni route to an address no desired allocation has is deleted,
//     and so is the proxy entry of an idle address.
//
// Proxy entries carry no mark of their own, so only those of addresses the
// node holds (desired or idle) are ever touched.
func (v *Veth) Reconcile(_ context.Context, want datapath.Desired) (rep datapath.Report, err error) {
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return rep, fmt.Errorf("list links: %w", err)
	}
	var routes []netlink.Route
	var proxies, neighs []netlink.Neigh
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			return rep, fmt.Errorf("list vpcni routes: %w", err)
		}
		ps, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return netlink.NeighProxyList(v.uplinkIdx, fam) })
		if err != nil {
			return rep, fmt.Errorf("list proxy entries on %s: %w", v.Uplink, err)
		}
		routes, proxies = append(routes, rs...), append(proxies, ps...)
	}
	// The pods' IPv6 neighbour entries on their host veths: one dump of
	// the node's IPv6 neighbours, read only on a node with IPv6 pods.
	if v.has(family.V6) {
		if neighs, err = nlutil.RetryDump(func() ([]netlink.Neigh, error) { return netlink.NeighList(0, netlink.FAMILY_V6) }); err != nil {
			return rep, fmt.Errorf("list IPv6 neighbours: %w", err)
		}
	}

	// Host veths this mode made, by name: a veth named vpc<hash> with an
	// attachment's alias. Other modes mark their links too (the bridge
	// mode's bridge, a passthrough NIC): a node that ran one before is
	// never stripped of them here. A bare veth named as this mode names
	// host veths is one an ADD created and never marked: the agent died
	// in between (Setup does not run meanwhile). Its
	// pod end would block the pod's next container (eth0 exists) as long
	// as the namespace lives, so it goes as an orphan.
	ours := map[string]netlink.Link{}
	for _, l := range links {
		key, marked := strings.CutPrefix(l.Attrs().Alias, AliasPrefix)
		if marked && strings.Contains(key, "/") && l.Type() == "veth" && strings.HasPrefix(l.Attrs().Name, "vpc") ||
			l.Attrs().Alias == "" && l.Type() == "veth" && isHostIfName(l.Attrs().Name) {
			ours[l.Attrs().Name] = l
		}
	}
	routed := map[netip.Addr]netlink.Route{} // vpcni /32 and /128 routes by destination
	for _, r := range routes {
		if ip, ok := hostRouteDst(r); ok {
			routed[ip] = r
		}
	}
	proxied := map[netip.Addr]bool{}
	for _, n := range proxies {
		if ip, ok := addrOf(n.IP); ok {
			proxied[ip] = true
		}
	}
	type linkAddr struct {
		link int
		ip   netip.Addr
	}
	pinned := map[linkAddr]string{} // permanent IPv6 neighbours: their MAC
	for _, n := range neighs {
		if ip, ok := addrOf(n.IP); ok && n.State == netlink.NUD_PERMANENT {
			pinned[linkAddr{n.LinkIndex, ip}] = n.HardwareAddr.String()
		}
	}

	rb := &reportBuilder{rep: &rep}
	fail := rb.fail
	wanted := map[string]bool{}           // host veth names of desired allocations
	wantedAddr := map[netip.Addr]string{} // address -> its host veth
	for _, a := range want.Allocations {
		name := HostIfName(a.ContainerID, a.IfName)
		wanted[name] = true
		for _, ip := range a.Addresses() {
			wantedAddr[ip] = name
		}
		link, ok := ours[name]
		if !ok || link.Attrs().Alias != AliasPrefix+a.Key() {
			rep.Broken = append(rep.Broken, a.Key())
			continue
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(link); err != nil {
				fail(fmt.Errorf("set %s up: %w", name, err))
			} else {
				rep.AddRepair(datapath.RepairLink, "%s: host veth %s was down", a.Key(), name)
			}
		}
		idx := link.Attrs().Index
		podMAC := macFor(a.Key(), "pod")
		for _, l := range a.Leases() {
			host := family.Host(l.Address)
			if r, ok := routed[l.Address]; !ok || r.LinkIndex != idx {
				if err := netlink.RouteReplace(v.hostRoute(idx, l.Address)); err != nil {
					fail(fmt.Errorf("route %s dev %s: %w", host, name, err))
				} else {
					rep.AddRepair(datapath.RepairRoute, "%s: route %s dev %s", a.Key(), host, name)
				}
			}
			if family.Of(l.Address) == family.V6 && pinned[linkAddr{idx, l.Address}] != podMAC.String() {
				if err := netlink.NeighSet(podNeighbour(idx, l.Address, podMAC)); err != nil {
					fail(fmt.Errorf("neighbour %s dev %s: %w", l.Address, name, err))
				} else {
					rep.AddRepair(datapath.RepairNeighbour, "%s: neighbour %s -> %s dev %s", a.Key(), l.Address, podMAC, name)
				}
			}
			if l.NIC != nil {
				continue // routed by its NIC: reconcileNICs
			}
			if !proxied[l.Address] {
				kind := proxyKind(l.Address)
				if err := netlink.NeighSet(v.proxyEntry(l.Address)); err != nil {
					fail(fmt.Errorf("%s %s on %s: %w", kind, l.Address, v.Uplink, err))
				} else {
					rep.AddRepair(datapath.RepairNeighbour, "%s: %s %s on %s", a.Key(), kind, l.Address, v.Uplink)
				}
			}
		}
	}

	for _, a := range want.Leave {
		wanted[HostIfName(a.ContainerID, a.IfName)] = true
		for _, ip := range a.Addresses() {
			wantedAddr[ip] = HostIfName(a.ContainerID, a.IfName)
		}
	}

	// Orphan host veths: their routes' addresses lose their proxy entries
	// too, unless a desired allocation has the address now. Links released
	// by a DEL and waiting for the reaper are not orphans: deleting them
	// here would only hold up the verbs waiting for this reconcile.
	reaping := v.reaping()
	deleted := map[int]bool{} // link indexes: their routes went with them
	for name, link := range ours {
		if wanted[name] || reaping[link.Attrs().Index] {
			continue
		}
		for ip, r := range routed {
			if r.LinkIndex != link.Attrs().Index {
				continue
			}
			if _, live := wantedAddr[ip]; !live && proxied[ip] {
				if err := netlink.NeighDel(v.proxyEntry(ip)); err != nil && !nlutil.IsNotFound(err) {
					fail(fmt.Errorf("delete %s %s: %w", proxyKind(ip), ip, err))
				}
				delete(proxied, ip)
			}
		}
		key := strings.TrimPrefix(link.Attrs().Alias, AliasPrefix)
		if err := v.deleteHostLink(name, key); err != nil {
			fail(err)
			continue
		}
		deleted[link.Attrs().Index] = true
		rep.Removed = append(rep.Removed, fmt.Sprintf("orphan host veth %s (%s)", name, key))
	}
	// Stale routes (the link deleted above takes its routes with it; these
	// point elsewhere) and proxy entries of idle addresses.
	for ip, r := range routed {
		if _, live := wantedAddr[ip]; live || deleted[r.LinkIndex] {
			continue // kept or replaced above, or gone with its link
		}
		if err := netlink.RouteDel(&r); err != nil && !nlutil.IsNotFound(err) {
			fail(fmt.Errorf("delete stale route %s: %w", ip, err))
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("stale route %s", family.Host(ip)))
	}
	for _, ip := range want.Idle {
		if _, live := wantedAddr[ip]; live || !proxied[ip] {
			continue
		}
		if err := netlink.NeighDel(v.proxyEntry(ip)); err != nil && !nlutil.IsNotFound(err) {
			fail(fmt.Errorf("delete %s %s: %w", proxyKind(ip), ip, err))
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("%s of idle address %s", proxyKind(ip), ip))
	}
	err = v.reconcileNICs(links, nicLeases(want.Allocations), want.Idle, wantedAddr, rb)
	return rep, err
}

// reportBuilder adds lines to a Report.
type reportBuilder struct{ rep *datapath.Report }

func (b *reportBuilder) fail(err error) { b.rep.Failed = append(b.rep.Failed, err.Error()) }
func (b *reportBuilder) repaired(kind datapath.RepairKind, format string, args ...any) {
	b.rep.AddRepair(kind, format, args...)
}
func (b *reportBuilder) removed(format string, args ...any) {
	b.rep.Removed = append(b.rep.Removed, fmt.Sprintf(format, args...))
}

// reaping lists the indexes of released links the reaper has yet to
// delete.
func (v *Veth) reaping() map[int]bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[int]bool{}
	for _, items := range v.pending {
		for _, it := range items {
			out[it.index] = true
		}
	}
	return out
}

// isHostIfName says whether name has the shape HostIfName gives: "vpc"
// and 11 hex digits.
func isHostIfName(name string) bool {
	hex, ok := strings.CutPrefix(name, "vpc")
	return ok && len(hex) == 11 && strings.Trim(hex, "0123456789abcdef") == ""
}

// hostRouteDst is the destination of a /32 or /128 route (ok=false
// otherwise).
func hostRouteDst(r netlink.Route) (netip.Addr, bool) {
	if r.Dst == nil || !isHostMask(r.Dst.Mask) {
		return netip.Addr{}, false
	}
	return addrOf(r.Dst.IP)
}

// addrOf is ip as netip spells it, an IPv4 address as IPv4 whichever
// length the library gave it.
func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// nicLeases are the desired allocations' addresses that live on secondary
// NICs, each as an allocation of its own (reconcileNICs).
func nicLeases(want []*alloc.Allocation) []*alloc.Allocation {
	var out []*alloc.Allocation
	for _, a := range want {
		for _, l := range a.Leases() {
			if l.NIC != nil {
				out = append(out, withLease(a, l))
			}
		}
	}
	return out
}

var _ datapath.Datapath = (*Veth)(nil)
