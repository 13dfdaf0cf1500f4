package bridge

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// Reconcile implements datapath.Datapath, from one read of the node's
// links:
//   - the node side: the bridge is there, up, passing bridged IPv4 to
//     iptables and holding the uplink with the node's IPv4 (a bridge
//     deleted by hand is made again, a move cut short is finished, an
//     address a DHCP renewal put back on the uplink moves to the bridge
//     with the renewed lifetimes);
//   - a desired allocation whose host veth is there is put back up and on
//     the bridge; one whose host veth is gone is Broken (only a Setup
//     inside the pod can bring it back);
//   - a pod link of vpcni's that no allocation names is deleted.
//
// Bridge mode holds nothing per address on the node (no routes, no proxy
// entries): idle addresses need nothing.
func (b *Bridge) Reconcile(_ context.Context, want datapath.Desired) (rep datapath.Report, err error) {
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return rep, fmt.Errorf("list links: %w", err)
	}
	fail := func(err error) { rep.Failed = append(rep.Failed, err.Error()) }
	byName := map[string]netlink.Link{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
	}
	br := b.repairNode(byName, &rep)
	if br == nil {
		// Without the bridge nothing else can be repaired; pods are not
		// Broken (their links are there), the next pass tries again.
		return rep, nil
	}

	wanted := map[string]bool{}
	for _, a := range want.Leave {
		wanted[HostIfName(a.ContainerID, a.IfName)] = true
	}
	for _, a := range want.Allocations {
		name := HostIfName(a.ContainerID, a.IfName)
		wanted[name] = true
		link, ok := byName[name]
		if !ok || link.Attrs().Alias != AliasPrefix+a.Key() {
			rep.Broken = append(rep.Broken, a.Key())
			continue
		}
		if link.Attrs().MasterIndex != br.Attrs().Index {
			if err := netlink.LinkSetMasterByIndex(link, br.Attrs().Index); err != nil {
				fail(fmt.Errorf("put %s back on %s: %w", name, b.name, err))
			} else {
				rep.AddRepair(datapath.RepairLink, "%s: host veth %s back on %s", a.Key(), name, b.name)
			}
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(link); err != nil {
				fail(fmt.Errorf("set %s up: %w", name, err))
			} else {
				rep.AddRepair(datapath.RepairLink, "%s: host veth %s was down", a.Key(), name)
			}
		}
	}
	for name, l := range byName {
		key, ours := strings.CutPrefix(l.Attrs().Alias, AliasPrefix)
		// Pod links are "vpcni:<container>/<ifname>"; the bridge's own
		// alias has no '/'.
		if !ours || !strings.Contains(key, "/") || wanted[name] {
			continue
		}
		if err := deleteHostLink(name, key); err != nil {
			fail(err)
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("orphan pod link %s (%s)", name, key))
	}
	return rep, nil
}

// repairNode puts the node side back (see takeUplink) when any piece of it
// is off, and returns the bridge (nil: it could not be made).
func (b *Bridge) repairNode(byName map[string]netlink.Link, rep *datapath.Report) netlink.Link {
	br, up := byName[b.name], byName[b.uplink]
	var off []string
	switch {
	case br == nil:
		off = append(off, "bridge "+b.name+" missing")
	default:
		if br.Attrs().Flags&net.FlagUp == 0 {
			off = append(off, b.name+" down")
		}
		if on, err := nfCallIptables(br.Attrs().Index); err != nil || !on {
			off = append(off, b.name+" nf_call_iptables off")
		}
		if on, err := nfCallIp6tables(br.Attrs().Index); b.v6 && (err != nil || !on) {
			off = append(off, b.name+" nf_call_ip6tables off")
		}
		if up != nil && up.Attrs().MasterIndex != br.Attrs().Index {
			off = append(off, b.uplink+" not a port of "+b.name)
		}
	}
	if up != nil && nlutil.LinkIPv4(up.Attrs().Name).IsValid() {
		off = append(off, b.uplink+" holds IPv4 addresses")
	}
	if len(off) == 0 {
		return br
	}
	nbr, err := takeUplink(b.uplink, b.name, b.v6)
	if err != nil {
		rep.Failed = append(rep.Failed, fmt.Sprintf("node (%s): %v", strings.Join(off, ", "), err))
		return nil
	}
	rep.AddRepair(datapath.RepairNode, "node: %s", strings.Join(off, ", "))
	return nbr
}
