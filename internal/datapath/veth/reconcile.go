package veth

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// Reconcile implements datapath.Datapath. It reads the node's links, its
// vpcni routes and the uplink's proxy entries once each — not once per
// pod: per-pod dumps made an agent with 166 pods take seconds to start —
// and then:
//   - a desired allocation whose host veth is there gets its route, its
//     proxy ARP entry and its link state back; one whose host veth is gone
//     is reported Broken (only a Setup inside the pod can bring it back);
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
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	})
	if err != nil {
		return rep, fmt.Errorf("list vpcni routes: %w", err)
	}
	proxies, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return netlink.NeighProxyList(v.uplinkIdx, netlink.FAMILY_V4) })
	if err != nil {
		return rep, fmt.Errorf("list proxy ARP entries on %s: %w", v.Uplink, err)
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
	routed := map[netip.Addr]netlink.Route{} // vpcni /32 routes by destination
	for _, r := range routes {
		if ip, ok := hostRouteDst(r); ok {
			routed[ip] = r
		}
	}
	proxied := map[netip.Addr]bool{}
	for _, n := range proxies {
		if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok {
			proxied[ip] = true
		}
	}

	rb := &reportBuilder{rep: &rep}
	fail := rb.fail
	wanted := map[string]bool{}           // host veth names of desired allocations
	wantedAddr := map[netip.Addr]string{} // address -> its host veth
	for _, a := range want.Allocations {
		name := HostIfName(a.ContainerID, a.IfName)
		wanted[name] = true
		wantedAddr[a.Address] = name
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
		if r, ok := routed[a.Address]; !ok || r.LinkIndex != link.Attrs().Index {
			if err := netlink.RouteReplace(v.hostRoute(link.Attrs().Index, a.Address)); err != nil {
				fail(fmt.Errorf("route %s/32 dev %s: %w", a.Address, name, err))
			} else {
				rep.AddRepair(datapath.RepairRoute, "%s: route %s/32 dev %s", a.Key(), a.Address, name)
			}
		}
		if a.NIC != nil {
			continue // routed by its NIC: reconcileNICs
		}
		if !proxied[a.Address] {
			if err := netlink.NeighSet(v.proxyEntry(a.Address)); err != nil {
				fail(fmt.Errorf("proxy ARP entry %s on %s: %w", a.Address, v.Uplink, err))
			} else {
				rep.AddRepair(datapath.RepairNeighbour, "%s: proxy ARP entry %s on %s", a.Key(), a.Address, v.Uplink)
			}
		}
	}

	for _, a := range want.Leave {
		wanted[HostIfName(a.ContainerID, a.IfName)] = true
		wantedAddr[a.Address] = HostIfName(a.ContainerID, a.IfName)
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
					fail(fmt.Errorf("delete proxy ARP entry %s: %w", ip, err))
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
		rep.Removed = append(rep.Removed, fmt.Sprintf("stale route %s/32", ip))
	}
	for _, ip := range want.Idle {
		if _, live := wantedAddr[ip]; live || !proxied[ip] {
			continue
		}
		if err := netlink.NeighDel(v.proxyEntry(ip)); err != nil && !nlutil.IsNotFound(err) {
			fail(fmt.Errorf("delete proxy ARP entry %s: %w", ip, err))
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("proxy ARP entry of idle address %s", ip))
	}
	err = v.reconcileNICs(links, want.Allocations, want.Idle, wantedAddr, rb)
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

// hostRouteDst is the destination of a /32 route (ok=false otherwise).
func hostRouteDst(r netlink.Route) (netip.Addr, bool) {
	if r.Dst == nil || !isHostMask(r.Dst.Mask) {
		return netip.Addr{}, false
	}
	return netip.AddrFromSlice(r.Dst.IP.To4())
}

var _ datapath.Datapath = (*Veth)(nil)
