package svcpath

import (
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

// Reconcile brings the node side of the service path in line with want,
// reading the node's links, vpcni routes (and IPv6 neighbours) once each:
//   - the NAT tables are put back if missing or not as made;
//   - a desired allocation's service veth gets its link state, its
//     routes and its IPv6 neighbours back; one whose service veth is gone is reported Broken (its
//     pod end went with it: only a Setup inside the pod brings it back);
//   - a service veth of vpcni's that neither want nor leave names is
//     deleted (its pod end and route go with it).
//
// It never enters a pod namespace, and touches only links named "vsv..."
// with a vpcni alias.
func (p *Path) Reconcile(want, leave []*alloc.Allocation) (rep datapath.Report, err error) {
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return rep, fmt.Errorf("list links: %w", err)
	}
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	})
	if err != nil {
		return rep, fmt.Errorf("list vpcni routes: %w", err)
	}
	var neighs []netlink.Neigh
	if p.v6 {
		if neighs, err = nlutil.RetryDump(func() ([]netlink.Neigh, error) { return netlink.NeighList(0, netlink.FAMILY_V6) }); err != nil {
			return rep, fmt.Errorf("list IPv6 neighbours: %w", err)
		}
	}
	fail := func(err error) { rep.Failed = append(rep.Failed, err.Error()) }
	if changed, err := EnsureNAT(p.v6); err != nil {
		fail(err)
	} else if changed {
		rep.AddRepair(datapath.RepairNAT, "nftables table %s", NATTable)
	}

	ours := map[string]netlink.Link{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, HostPrefix) && strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) {
			ours[l.Attrs().Name] = l
		}
	}
	routed := map[int]map[netip.Addr]bool{} // link index -> /32 and /128 destinations
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok || ones != bits {
			continue
		}
		if routed[r.LinkIndex] == nil {
			routed[r.LinkIndex] = map[netip.Addr]bool{}
		}
		routed[r.LinkIndex][ip.Unmap()] = true
	}
	neighbours := map[int]map[netip.Addr]string{} // link index -> permanent IPv6 neighbour -> MAC
	for _, n := range neighs {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || n.State != netlink.NUD_PERMANENT {
			continue
		}
		if neighbours[n.LinkIndex] == nil {
			neighbours[n.LinkIndex] = map[netip.Addr]string{}
		}
		neighbours[n.LinkIndex][ip] = n.HardwareAddr.String()
	}

	wanted := map[string]bool{}
	for _, a := range leave {
		wanted[HostIfName(a.ContainerID, a.IfName)] = true
	}
	for _, a := range want {
		name := HostIfName(a.ContainerID, a.IfName)
		wanted[name] = true
		link, ok := ours[name]
		if !ok || link.Attrs().Alias != datapath.AliasPrefix+a.Key() {
			rep.Broken = append(rep.Broken, a.Key())
			continue
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(link); err != nil {
				fail(fmt.Errorf("set %s up: %w", name, err))
			} else {
				rep.AddRepair(datapath.RepairLink, "%s: service veth %s was down", a.Key(), name)
			}
		}
		for _, ip := range a.Addresses() {
			if !routed[link.Attrs().Index][ip] {
				if err := netlink.RouteReplace(hostRoute(link.Attrs().Index, ip)); err != nil {
					fail(fmt.Errorf("route %s dev %s: %w", family.Host(ip), name, err))
				} else {
					rep.AddRepair(datapath.RepairRoute, "%s: route %s dev %s", a.Key(), family.Host(ip), name)
				}
			}
			if mac := macFor(a.Key(), "pod"); family.Of(ip) == family.V6 && neighbours[link.Attrs().Index][ip] != mac.String() {
				if err := netlink.NeighSet(neighbour(link.Attrs().Index, ip, mac)); err != nil {
					fail(fmt.Errorf("neighbour %s on %s: %w", ip, name, err))
				} else {
					rep.AddRepair(datapath.RepairNeighbour, "%s: neighbour %s on %s", a.Key(), ip, name)
				}
			}
		}
	}
	for name, link := range ours {
		if wanted[name] {
			continue
		}
		key := strings.TrimPrefix(link.Attrs().Alias, datapath.AliasPrefix)
		if err := deleteHostLink(name, key); err != nil {
			fail(err)
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("orphan service veth %s (%s)", name, key))
	}
	return rep, nil
}
