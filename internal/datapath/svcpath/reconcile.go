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
)

// Reconcile brings the node side of the service path in line with want,
// reading the node's links and vpcni routes once each:
//   - the NAT table is put back if it is missing or not as made;
//   - a desired allocation's service veth gets its link state and its
//     route back; one whose service veth is gone is reported Broken (its
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
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	})
	if err != nil {
		return rep, fmt.Errorf("list vpcni routes: %w", err)
	}
	fail := func(err error) { rep.Failed = append(rep.Failed, err.Error()) }
	if changed, err := EnsureNAT(); err != nil {
		fail(err)
	} else if changed {
		rep.AddRepair(datapath.RepairNAT, "nftables table ip %s", NATTable)
	}

	ours := map[string]netlink.Link{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, HostPrefix) && strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) {
			ours[l.Attrs().Name] = l
		}
	}
	routed := map[int]map[netip.Addr]bool{} // link index -> /32 destinations
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok || ones != bits {
			continue
		}
		if routed[r.LinkIndex] == nil {
			routed[r.LinkIndex] = map[netip.Addr]bool{}
		}
		routed[r.LinkIndex][ip] = true
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
		if !routed[link.Attrs().Index][a.Address] {
			if err := netlink.RouteReplace(hostRoute(link.Attrs().Index, a.Address)); err != nil {
				fail(fmt.Errorf("route %s/32 dev %s: %w", a.Address, name, err))
			} else {
				rep.AddRepair(datapath.RepairRoute, "%s: route %s/32 dev %s", a.Key(), a.Address, name)
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
