package openstack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
)

// Subnet discovery: with no subnetID, a node's pods take addresses from
// the subnet of its own VM port's fixed IP — the one the port was found
// by (portLookup ip), or the port's first IPv4 fixed IP (portLookup
// instance). One config then serves nodes that sit in different subnets,
// each node on its own.
//
// Several subnets (subnets, or subnetTags: Neutron's tags filter): the VM
// port's own subnet, if selected, or else the first selected one on the
// VM port's network, serves the VM port's fixed IPs as a lone subnetID
// does; a new secondary NIC goes on the selected subnet with the most free
// addresses, and a subnet found full moves on to the next. Free is counted
// from the subnet's ports: Neutron's network-ip-availabilities is
// admin-only by its default policy.

// subnetInfo is what vpcni reads of a subnet to take addresses from it.
type subnetInfo struct {
	id, networkID string
	prefix        netip.Prefix
	gateway       netip.Addr
	pools         [][2]netip.Addr
	// used: its addresses ports hold, as last listed (nil: not yet), for
	// subnets other than the VM port's (that one's is Provider.used).
	used   map[netip.Addr]bool
	usedAt time.Time
}

// readSubnetInfo reads a subnet; vpcni serves IPv4 subnets only.
func (p *Provider) readSubnetInfo(ctx context.Context, id string) (*subnetInfo, error) {
	c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	sn, err := answered(subnets.Get(c, p.nc, id).Extract())
	if err != nil {
		return nil, explain(fmt.Errorf("subnet %s: %w", id, err))
	}
	return subnetInfoOf(sn)
}

func subnetInfoOf(sn *subnets.Subnet) (*subnetInfo, error) {
	s := &subnetInfo{id: sn.ID, networkID: sn.NetworkID}
	var err error
	if s.prefix, err = netip.ParsePrefix(sn.CIDR); err != nil || !s.prefix.Addr().Is4() {
		return nil, fmt.Errorf("subnet %s has CIDR %q: vpcni needs an IPv4 subnet", sn.ID, sn.CIDR)
	}
	s.gateway, _ = netip.ParseAddr(sn.GatewayIP)
	for _, pool := range sn.AllocationPools {
		lo, err1 := netip.ParseAddr(pool.Start)
		hi, err2 := netip.ParseAddr(pool.End)
		if err1 == nil && err2 == nil {
			s.pools = append(s.pools, [2]netip.Addr{lo, hi})
		}
	}
	return s, nil
}

// subnetInfo is a subnet as read once (a NIC found on a subnet no longer
// selected is read then).
func (p *Provider) subnetInfo(ctx context.Context, id string) (*subnetInfo, error) {
	if s := p.nets[id]; s != nil {
		return s, nil
	}
	s, err := p.readSubnetInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.nets == nil {
		p.nets = map[string]*subnetInfo{}
	}
	p.nets[id] = s
	return s, nil
}

// selectSubnets reads the subnets the config selects (subnets, or
// subnetTags), in order; nil when it selects none.
func (p *Provider) selectSubnets(ctx context.Context) ([]*subnetInfo, error) {
	var out []*subnetInfo
	switch {
	case len(p.cfg.Subnets) > 0:
		for _, id := range p.cfg.Subnets {
			s, err := p.subnetInfo(ctx, id)
			if err != nil {
				return nil, fmt.Errorf("subnets: %w", err)
			}
			out = append(out, s)
		}
	case len(p.cfg.SubnetTags) > 0:
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		defer cancel()
		tags := strings.Join(p.cfg.SubnetTags, ",")
		pages, err := subnets.List(p.nc, subnets.ListOpts{Tags: tags}).AllPages(c)
		if err != nil {
			return nil, explain(fmt.Errorf("list the subnets tagged %s: %w", tags, err))
		}
		all, err := subnets.ExtractSubnets(pages)
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("subnetTags: no subnet has the tags %s", tags)
		}
		slices.SortFunc(all, func(a, b subnets.Subnet) int { return strings.Compare(a.ID, b.ID) })
		for i := range all {
			s, err := subnetInfoOf(&all[i])
			if err != nil {
				return nil, fmt.Errorf("subnetTags %s: %w", tags, err)
			}
			if p.nets == nil {
				p.nets = map[string]*subnetInfo{}
			}
			p.nets[s.id] = s
			out = append(out, s)
		}
	}
	return out, nil
}

// discoverSubnet settles the pods' subnet from the VM port findPort found
// on any network (and, with subnets or subnetTags, the selection), and
// reads it.
func (p *Provider) discoverSubnet(ctx context.Context) error {
	id, addr, err := p.portSubnet()
	if err != nil {
		return err
	}
	sel, err := p.selectSubnets(ctx)
	if err != nil {
		return err
	}
	p.subnetHow = fmt.Sprintf("discovered: the subnet of VM port %s's fixed IP %s", p.portID, addr)
	if len(sel) > 0 {
		p.selected = nil
		for _, s := range sel {
			p.selected = append(p.selected, s.id)
		}
		own := slices.IndexFunc(sel, func(s *subnetInfo) bool { return s.id == id })
		onNet := slices.IndexFunc(sel, func(s *subnetInfo) bool { return s.networkID == p.port.NetworkID })
		switch {
		case own >= 0:
			p.subnetHow = fmt.Sprintf("selected (%s), the VM port's own", p.selection())
		case onNet >= 0:
			id = sel[onNet].id
			p.subnetHow = fmt.Sprintf("selected (%s), the first on the VM port's network", p.selection())
		default:
			p.subnetHow = fmt.Sprintf("discovered: the subnet of VM port %s's fixed IP %s (none of %s is on its network)", p.portID, addr, p.selection())
		}
	}
	p.cfg.SubnetID = id
	_, err = p.readSubnet(ctx)
	return err
}

// selection names what selects the subnets.
func (p *Provider) selection() string {
	if len(p.cfg.Subnets) > 0 {
		return "subnets"
	}
	return "subnetTags " + strings.Join(p.cfg.SubnetTags, ",")
}

// portSubnet picks the VM port's fixed IP whose subnet serves the pods.
func (p *Provider) portSubnet() (subnetID string, addr netip.Addr, err error) {
	for _, f := range p.port.FixedIPs {
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil || f.SubnetID == "" {
			continue
		}
		switch {
		case p.cfg.PortLookup == "ip" && a == p.nodeIP:
			return f.SubnetID, a, nil
		case p.cfg.PortLookup != "ip" && a.Is4():
			return f.SubnetID, a, nil
		}
	}
	if p.cfg.PortLookup == "ip" {
		return "", netip.Addr{}, fmt.Errorf("VM port %s does not list %s among its fixed IPs: set subnetID", p.portID, p.nodeIP)
	}
	return "", netip.Addr{}, fmt.Errorf("VM port %s has no IPv4 fixed IP to take the pods' subnet from: set subnetID", p.portID)
}

// SubnetSource says which subnet serves the pods and how it was settled
// (configured, or discovered from the VM port), and the other subnets
// selected for secondary NICs.
func (p *Provider) SubnetSource() string {
	s := fmt.Sprintf("subnet %s (%s), %s", p.cfg.SubnetID, p.subnet, p.subnetHow)
	var more []string
	for _, id := range p.selected {
		if n := p.nets[id]; id != p.cfg.SubnetID && n != nil {
			more = append(more, fmt.Sprintf("%s (%s)", id, n.prefix))
		}
	}
	if len(more) > 0 {
		s += "; secondary NICs also on " + strings.Join(more, ", ")
	}
	return s
}

// nicSubnets are the subnets a new secondary NIC may go on, the most free
// addresses first (the listed order among equals): the selected ones, or
// the pods' subnet alone.
func (p *Provider) nicSubnets(ctx context.Context) ([]*subnetInfo, []int, error) {
	ids := p.selected
	if len(ids) == 0 {
		ids = []string{p.cfg.SubnetID}
	}
	var out []*subnetInfo
	var free []int
	for _, id := range ids {
		s, err := p.subnetInfo(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		used, err := p.usedOn(ctx, s, true)
		if err != nil {
			return nil, nil, err
		}
		out, free = append(out, s), append(free, freeIn(s, used))
	}
	order := make([]int, len(out))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return free[b] - free[a] })
	so, sf := make([]*subnetInfo, len(out)), make([]int, len(out))
	for i, j := range order {
		so[i], sf[i] = out[j], free[j]
	}
	return so, sf, nil
}

// freeIn counts the addresses of a subnet's allocation pools that no port
// holds (the gateway aside).
func freeIn(s *subnetInfo, used map[netip.Addr]bool) int {
	n := 0
	for _, pool := range s.pools {
		for a := pool[0]; a.IsValid() && a.Compare(pool[1]) <= 0; a = a.Next() {
			if a != s.gateway && !used[a] {
				n++
			}
		}
	}
	return n
}

// usedOn is what addresses of a subnet ports hold, listed again when
// older than a minute (or at once with fresh).
func (p *Provider) usedOn(ctx context.Context, s *subnetInfo, fresh bool) (map[netip.Addr]bool, error) {
	if s.id == p.cfg.SubnetID {
		if fresh || p.used == nil || time.Since(p.usedAt) > time.Minute {
			if err := p.refreshUsed(ctx); err != nil {
				return nil, err
			}
		}
		return p.used, nil
	}
	if fresh || s.used == nil || time.Since(s.usedAt) > time.Minute {
		used, err := p.listUsedOn(ctx, s.id)
		if err != nil {
			return nil, err
		}
		s.used, s.usedAt = used, time.Now()
	}
	return s.used, nil
}

// forget drops a subnet's list of used addresses (a conflict showed it
// stale).
func (p *Provider) forget(s *subnetInfo) {
	if s.id == p.cfg.SubnetID {
		p.used = nil
	}
	s.used = nil
}

// pickOn chooses n addresses of a subnet's allocation pools that nobody
// holds, lowest first.
func pickOn(s *subnetInfo, used map[netip.Addr]bool, n int, on, skip, also map[netip.Addr]bool) []netip.Addr {
	var out []netip.Addr
	for _, pool := range s.pools {
		for a := pool[0]; len(out) < n && a.Compare(pool[1]) <= 0 && a.IsValid(); a = a.Next() {
			if a == s.gateway || on[a] || skip[a] || also[a] || used[a] {
				continue
			}
			out = append(out, a)
		}
	}
	return out
}

// refreshUsed learns which addresses of the subnet other ports hold.
func (p *Provider) refreshUsed(ctx context.Context) error {
	used, err := p.listUsed(ctx)
	if err != nil {
		return err
	}
	p.used, p.usedAt = used, time.Now()
	return nil
}

// listUsed lists the addresses of the subnet that ports hold.
func (p *Provider) listUsed(ctx context.Context) (map[netip.Addr]bool, error) {
	return p.listUsedOn(ctx, p.cfg.SubnetID)
}

// listUsedOn lists the addresses of a subnet that ports hold.
func (p *Provider) listUsedOn(ctx context.Context, subnetID string) (map[netip.Addr]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	pages, err := ports.List(p.nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{SubnetID: subnetID}}}).AllPages(ctx)
	if err != nil {
		return nil, explain(fmt.Errorf("list the subnet's addresses: %w", err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, err
	}
	used := map[netip.Addr]bool{}
	for _, port := range all {
		for _, f := range port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				used[a] = true
			}
		}
	}
	return used, nil
}

// refreshUsedLater re-learns the subnet's used addresses in the
// background, off the write's path: listing every port of a subnet takes
// a second and more on a large one, and a copy a few minutes old costs at
// worst a 409 on an address another node took meanwhile, after which
// Assign lists again before its next try. One listing at a time; the
// caller holds p.mu.
func (p *Provider) refreshUsedLater() {
	if p.usedListing {
		return
	}
	p.usedListing = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout.Duration)
		defer cancel()
		used, err := p.listUsed(ctx)
		mu := &p.mu
		if p.parent != nil {
			mu = &p.parent.mu // the IPv6 side runs under the IPv4 side's lock
		}
		mu.Lock()
		defer mu.Unlock()
		p.usedListing = false
		// A conflict meanwhile may have dropped the copy for a fresh one:
		// that one is newer than this.
		if err == nil && p.used != nil {
			p.used, p.usedAt = used, time.Now()
		}
	}()
}
