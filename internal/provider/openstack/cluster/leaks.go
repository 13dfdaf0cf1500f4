package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// ClusterTag is the Neutron tag that claims a resource for one cluster.
func ClusterTag(clusterID string) string { return "vpcni-cluster=" + clusterID }

// Leaks is the leak collector's cloud (leaks.Cloud) on OpenStack. What it
// reads: every port with an address on the pods' subnet (marks in
// descriptions, IPv6 ones against the subnet of the port's IPv6 fixed IPs, reservation ports by device_owner, NIC ports by name,
// block pairs) and vpcni's NIC ports on any network (openstack.NICTag), the floating IPs marked for pods and, with a router, its
// routes. Claims are Neutron tags (standard-attr-tag) on ports and
// floating IPs.
type Leaks struct {
	NC *gophercloud.ServiceClient
	// OpenStack is the cloud config's openstack section: its subnetID (the
	// pods' subnet), deviceOwner (of reservation ports) and timeout.
	OpenStack *openstack.Config
	// ClusterID names this cluster in claims (ClusterTag).
	ClusterID string
	// RouterID, Ranges: the routed pod subnet (empty: no routes or block
	// pairs are read).
	RouterID string
	Ranges   []netip.Prefix
	// Log hears what the audit skips (a cloud without floating IPs).
	Log *slog.Logger
}

// Instance implements leaks.Cloud: a Node's spec.providerID is
// openstack:///<id> (the cloud provider's), or with a region before the
// last slash.
func (n *Leaks) Instance(providerID string) (string, bool) {
	id, ok := strings.CutPrefix(providerID, "openstack://")
	if !ok {
		return "", false
	}
	return id[strings.LastIndex(id, "/")+1:], true
}

func (n *Leaks) call(ctx context.Context) (context.Context, context.CancelFunc) {
	t := n.OpenStack.Timeout.Duration
	if t <= 0 {
		t = 15 * time.Second
	}
	return context.WithTimeout(ctx, t)
}

func (n *Leaks) inRanges(p netip.Prefix) bool {
	return slices.ContainsFunc(n.Ranges, func(r netip.Prefix) bool { return r.Bits() <= p.Bits() && r.Contains(p.Addr()) })
}

func (n *Leaks) claimed(tags []string) bool { return slices.Contains(tags, ClusterTag(n.ClusterID)) }

// subnetPorts reads the pods' subnet and every port with an address on it.
func (n *Leaks) subnetPorts(ctx context.Context) (*subnets.Subnet, netip.Prefix, []ports.Port, error) {
	cc, cancel := n.call(ctx)
	sn, err := subnets.Get(cc, n.NC, n.OpenStack.SubnetID).Extract()
	cancel()
	if err != nil {
		return nil, netip.Prefix{}, nil, fmt.Errorf("subnet %s: %w", n.OpenStack.SubnetID, err)
	}
	subnet, err := netip.ParsePrefix(sn.CIDR)
	if err != nil {
		return nil, netip.Prefix{}, nil, fmt.Errorf("subnet %s has CIDR %q: %w", sn.ID, sn.CIDR, err)
	}
	cc, cancel = n.call(ctx)
	defer cancel()
	pages, err := ports.List(n.NC, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{SubnetID: sn.ID}}}).AllPages(cc)
	if err != nil {
		return nil, netip.Prefix{}, nil, fmt.Errorf("list the ports of subnet %s: %w", sn.ID, err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, netip.Prefix{}, nil, err
	}
	// vpcni's NICs on any network — a PodNetwork's, a listed subnet's —
	// by their tag.
	pages, err = ports.List(n.NC, ports.ListOpts{Tags: openstack.NICTag}).AllPages(cc)
	if err != nil {
		return nil, netip.Prefix{}, nil, fmt.Errorf("list the ports tagged %s: %w", openstack.NICTag, err)
	}
	nics, err := ports.ExtractPorts(pages)
	for _, p := range nics {
		if !slices.ContainsFunc(all, func(q ports.Port) bool { return q.ID == p.ID }) {
			all = append(all, p)
		}
	}
	return sn, subnet, all, err
}

// nicCarries are the addresses a NIC port carries: those on the pods'
// subnet, or, for a NIC on another subnet (a PodNetwork's), all of them.
func nicCarries(p ports.Port, subnetID string) []netip.Addr {
	onSubnet := slices.ContainsFunc(p.FixedIPs, func(f ports.IP) bool { return f.SubnetID == subnetID })
	var out []netip.Addr
	for _, f := range p.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && (f.SubnetID == subnetID || !onSubnet) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Holdings implements leaks.Cloud.
func (n *Leaks) Holdings(ctx context.Context) ([]leaks.Holding, error) {
	if n.OpenStack == nil || n.OpenStack.SubnetID == "" || n.ClusterID == "" {
		return nil, fmt.Errorf("the audit needs the cloud config's openstack.subnetID (the pods' subnet) and the cluster's ID")
	}
	sn, subnet, all, err := n.subnetPorts(ctx)
	if err != nil {
		return nil, err
	}
	// A node's own addresses: each port's unmarked fixed IPs, gathered per
	// device (an instance's ports together).
	own := map[string][]netip.Addr{} // port ID -> its unmarked fixed IPs
	marks := map[string]map[netip.Addr]bool{}
	bad := map[string]string{}
	subnets6 := map[string]netip.Prefix{} // the IPv6 subnets read so far
	byDevice := map[string][]netip.Addr{}
	byID := map[string]ports.Port{}
	for _, p := range all {
		byID[p.ID] = p
		m, err := openstack.Marked(p.Description, subnet)
		if err != nil {
			bad[p.ID], m = err.Error(), nil // none of its addresses judged
		} else if openstack.MarksIPv6(p.Description) {
			// The IPv6 marks unreadable: the port is reported so (held,
			// never released) and its IPv4 marks still count.
			if err := n.markedV6(ctx, p, m, subnets6); err != nil {
				bad[p.ID] = err.Error()
			}
		}
		marks[p.ID] = m
		for _, f := range p.FixedIPs {
			a, err := netip.ParseAddr(f.IPAddress)
			if err != nil || m[a] {
				continue
			}
			own[p.ID] = append(own[p.ID], a)
		}
		// An instance's own addresses: those of its ports that are not
		// vpcni's (a NIC's addresses are its pods').
		if _, nic := openstack.NICOf(p.Name); p.DeviceID != "" && p.DeviceOwner != n.OpenStack.DeviceOwner && !nic {
			byDevice[p.DeviceID] = append(byDevice[p.DeviceID], own[p.ID]...)
		}
	}
	nodeIPs := func(p ports.Port) []netip.Addr {
		addrs := slices.Clone(own[p.ID])
		if p.DeviceID != "" {
			addrs = append(addrs, byDevice[p.DeviceID]...)
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		return slices.Compact(addrs)
	}
	var out []leaks.Holding
	for _, p := range all {
		claimed := n.claimed(p.Tags)
		if p.DeviceOwner == n.OpenStack.DeviceOwner {
			h := leaks.Holding{Kind: leaks.ReservationPort, Resource: p.ID, Port: p.DeviceID, Claimed: claimed}
			for _, f := range p.FixedIPs {
				if f.SubnetID == sn.ID {
					h.Address = f.IPAddress
				}
			}
			if vm, ok := byID[p.DeviceID]; ok && p.DeviceID != "" {
				h.NodeIPs, h.Instance = nodeIPs(vm), vm.DeviceID
			}
			out = append(out, h)
			continue
		}
		if inst, nic := openstack.NICOf(p.Name); nic {
			h := leaks.Holding{Kind: leaks.NICPort, Resource: p.ID, Instance: inst, NodeIPs: slices.Clone(byDevice[inst]), Claimed: claimed,
				Carries: nicCarries(p, sn.ID)}
			if len(h.Carries) > 0 {
				h.Address = h.Carries[0].String()
			}
			out = append(out, h)
			continue
		}
		if why, ok := bad[p.ID]; ok {
			out = append(out, leaks.Holding{Kind: leaks.FixedIP, Address: "?", Resource: p.ID, Unreadable: why})
		}
		for _, f := range p.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && marks[p.ID][a] {
				out = append(out, leaks.Holding{Kind: leaks.FixedIP, Address: a.String(), Resource: p.ID, NodeIPs: nodeIPs(p), Instance: p.DeviceID, Claimed: claimed})
			}
		}
		for _, ap := range p.AllowedAddressPairs {
			if pf, err := netip.ParsePrefix(ap.IPAddress); err == nil && n.inRanges(pf) {
				out = append(out, leaks.Holding{Kind: leaks.BlockPair, Address: pf.Masked().String(), Resource: p.ID, NodeIPs: nodeIPs(p), Instance: p.DeviceID})
			}
		}
	}
	fips, err := n.floatingIPs(ctx)
	if err != nil {
		return nil, err
	}
	out = append(out, fips...)
	if n.RouterID != "" {
		cc, cancel := n.call(ctx)
		rs, err := NewRoutes(n.NC, n.RouterID, "", 0).Routes(cc)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if n.inRanges(r.Destination) {
				out = append(out, leaks.Holding{Kind: leaks.Route, Address: r.Destination.Masked().String(), Resource: n.RouterID, NodeIPs: []netip.Addr{r.NextHop}})
			}
		}
	}
	return out, nil
}

// markedV6 adds to marked the IPv6 addresses that port p's description
// marks: its "[vpcni6:...]" block counts offsets in the pods' IPv6
// subnet, which is openstack.subnetIDv6 or, unset, the one IPv6 subnet of
// the port's fixed IPs (a port with addresses on several, and no
// subnetIDv6 to say which, is unreadable: marks read against the wrong
// one would name another address). subnets caches the subnets read.
func (n *Leaks) markedV6(ctx context.Context, p ports.Port, marked map[netip.Addr]bool, subnets6 map[string]netip.Prefix) error {
	var ids []string
	for _, f := range p.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && a.Is6() && f.SubnetID != "" && !slices.Contains(ids, f.SubnetID) {
			ids = append(ids, f.SubnetID)
		}
	}
	id := n.OpenStack.SubnetIDv6
	switch {
	case id != "" && !slices.Contains(ids, id):
		return nil // no address on the pods' IPv6 subnet: nothing marked holds
	case id == "" && len(ids) == 0:
		return nil
	case id == "" && len(ids) > 1:
		return fmt.Errorf("port %s marks IPv6 addresses and holds addresses of %d IPv6 subnets (%s): set openstack.subnetIDv6 to the pods' one", p.ID, len(ids), strings.Join(ids, ", "))
	case id == "":
		id = ids[0]
	}
	prefix, ok := subnets6[id]
	if !ok {
		cc, cancel := n.call(ctx)
		sn, err := subnets.Get(cc, n.NC, id).Extract()
		cancel()
		if err != nil {
			return fmt.Errorf("IPv6 subnet %s of port %s: %w", id, p.ID, err)
		}
		if prefix, err = netip.ParsePrefix(sn.CIDR); err != nil {
			return fmt.Errorf("subnet %s has CIDR %q: %w", sn.ID, sn.CIDR, err)
		}
		prefix = prefix.Masked()
		subnets6[id] = prefix
	}
	m, err := openstack.Marked(p.Description, prefix)
	if err != nil {
		return err
	}
	for _, f := range p.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == id && m[a] {
			marked[a] = true
		}
	}
	return nil
}

// floatingIPs lists the project's floating IPs marked for pods, with
// their tags (one list: Neutron filters a description only by equality).
// A cloud without the L3 extension (404) has none.
func (n *Leaks) floatingIPs(ctx context.Context) ([]leaks.Holding, error) {
	cc, cancel := n.call(ctx)
	defer cancel()
	pages, err := floatingips.List(n.NC, floatingips.ListOpts{}).AllPages(cc)
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		n.Log.Debug("no floating IPs in this cloud (no L3 extension): none audited")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list floating IPs: %w", err)
	}
	all, err := floatingips.ExtractFloatingIPs(pages)
	if err != nil {
		return nil, err
	}
	var out []leaks.Holding
	for _, f := range all {
		if owner, policy, ok := floatingip.ParseMark(f.Description); ok {
			out = append(out, leaks.Holding{Kind: leaks.FloatingIP, Address: f.FloatingIP, Resource: f.ID, Pod: owner, Policy: policy, Port: f.PortID, Claimed: n.claimed(f.Tags)})
		}
	}
	return out, nil
}

// Claim implements leaks.Cloud: the cluster's tag on the port or floating IP
// (PUT …/tags/<tag>: it touches nothing else of the resource).
func (n *Leaks) Claim(ctx context.Context, h leaks.Holding) error {
	kind := "ports"
	if h.Kind == leaks.FloatingIP {
		kind = "floatingips"
	}
	cc, cancel := n.call(ctx)
	defer cancel()
	err := attributestags.Add(cc, n.NC, kind, h.Resource, ClusterTag(n.ClusterID)).ExtractErr()
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return nil // gone meanwhile: nothing to claim
	}
	return err
}

// Release implements leaks.Cloud: only what is still as listed goes.
func (n *Leaks) Release(ctx context.Context, h leaks.Holding) error {
	switch h.Kind {
	case leaks.FixedIP:
		a, err := netip.ParseAddr(h.Address)
		if err != nil {
			return err
		}
		// Takes the address off only if the port still marks it, fixed
		// IP and mark in one If-Match PUT; a floating IP still pointing at
		// it keeps it (the floating IP is released first, as an orphan of
		// its own).
		return openstack.TakeOffWith(ctx, n.NC, *n.OpenStack, h.Resource, []netip.Addr{a})
	case leaks.ReservationPort:
		return n.deletePort(ctx, h, func(p *ports.Port) bool { return p.DeviceOwner == n.OpenStack.DeviceOwner && p.DeviceID == h.Port })
	case leaks.NICPort:
		// Deleting an attached port detaches it from its VM too (Neutron
		// tells Nova); its instance is no Node, or is gone.
		return n.deletePort(ctx, h, func(p *ports.Port) bool {
			inst, nic := openstack.NICOf(p.Name)
			return nic && inst == h.Instance && slices.Equal(nicCarries(*p, n.OpenStack.SubnetID), h.Carries)
		})
	case leaks.FloatingIP:
		cc, cancel := n.call(ctx)
		f, err := floatingips.Get(cc, n.NC, h.Resource).Extract()
		cancel()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if f.Description != floatingip.Mark(h.Pod, h.Policy) || f.PortID != h.Port {
			return fmt.Errorf("floating IP %s changed since the audit (%q, port %q): left alone", f.FloatingIP, f.Description, f.PortID)
		}
		fc := &FloatingIPs{NC: n.NC, Timeout: n.OpenStack.Timeout.Duration}
		_, err = fc.Detach(ctx, h.Pod, func(x floatingip.FIP) bool { return x.ID != h.Resource })
		return err
	}
	return fmt.Errorf("%s: released by the routes reconciler, not the collector", h.Kind)
}

// deletePort deletes a reservation or NIC port the audit found orphaned,
// if it is still as listed (same says so); gone already is done.
func (n *Leaks) deletePort(ctx context.Context, h leaks.Holding, same func(*ports.Port) bool) error {
	cc, cancel := n.call(ctx)
	p, err := ports.Get(cc, n.NC, h.Resource).Extract()
	cancel()
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !same(p) {
		return fmt.Errorf("%s %s changed since the audit (name %q, device %s/%s, %d addresses): left alone", h.Kind, p.ID, p.Name, p.DeviceOwner, p.DeviceID, len(p.FixedIPs))
	}
	cc, cancel = n.call(ctx)
	err = ports.Delete(cc, n.NC, h.Resource).ExtractErr()
	cancel()
	if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return fmt.Errorf("delete %s %s: %w", h.Kind, h.Resource, err)
	}
	return nil
}
