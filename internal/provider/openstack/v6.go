package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// IPv6: a dual-stack node's pods take their IPv6 addresses as more fixed
// IPs of the VM port, from an IPv6 subnet on the VM port's network, in the
// same way and the same writes as the IPv4 ones (explicit addresses,
// If-Match, read back, marks in the description: a "[vpcni6:...]" block
// beside the IPv4 one). What the real neutron-server does, checked by
// test/neutron's TestNeutronIPv6Facts:
//
//   - A subnet whose ipv6_address_mode or ipv6_ra_mode is slaac or
//     dhcpv6-stateless is "auto address": Neutron gives every port of the
//     network one address on it, formed from the port's MAC (EUI-64),
//     keeps it through fixed_ips PUTs that leave it out, and refuses any
//     address named on it (400 AllocationOnAutoAddressSubnet). Pods can
//     have no addresses there: such a subnet is refused at start.
//   - ipv6_address_mode dhcpv6-stateful or unset (with ipv6_ra_mode not
//     auto): a port holds as many named addresses as it is given, and
//     one PUT may add IPv4 and IPv6 ones at once.
//
// The IPv6 side is a Provider of its own (v6) sharing the IPv4 one's
// clients, VM port and lock: the caller of its methods holds the IPv4
// side's mu and hands it the port as last read (onV6), so one writer per
// VM port stays one writer.

// autoModes are the IPv6 modes in which Neutron forms a port's address
// itself and takes no other (neutron/common/ipv6_utils.py).
var autoModes = []string{"slaac", "dhcpv6-stateless"}

// autoAddress says why a subnet is an auto-address one ("" it is not).
func autoAddress(sn *subnets.Subnet) string {
	if !slices.Contains(autoModes, sn.IPv6AddressMode) && !slices.Contains(autoModes, sn.IPv6RAMode) {
		return ""
	}
	return fmt.Sprintf("IPv6 subnet %s (%s) has ipv6_address_mode %q and ipv6_ra_mode %q: Neutron gives each port one address of it from the port's MAC (SLAAC, EUI-64) and refuses any address named on it (400 AllocationOnAutoAddressSubnet), so pods cannot get addresses there; "+
		"give pods an IPv6 subnet whose ipv6_address_mode is dhcpv6-stateful or unset (and ipv6_ra_mode not slaac or dhcpv6-stateless) on the VM port's network, and set subnetIDv6 to it",
		sn.ID, sn.CIDR, sn.IPv6AddressMode, sn.IPv6RAMode)
}

// wantsV6: the node's pods get IPv6 addresses (its ipFamilies), or the
// config names an IPv6 subnet.
func wantsV6(cfg Config, fams []family.Family) bool {
	return cfg.SubnetIDv6 != "" || slices.Contains(fams, family.V6)
}

// v6Refused says why a configuration serves no IPv6 pod addresses (nil:
// it does), before anything is asked of Neutron. Secondary NICs carry no
// IPv6 addresses of pods: their ports are written with the IPv4 subnet's
// fixed IPs alone, and IPv6 ones kept on the VM port would stop a
// dual-stack node at maxAddresses pods whatever its NICs — every pod
// takes an address of each family — so the NICs would add none. (The
// veth datapath routes an IPv6 lease on a NIC; the provider does not give
// one.)
func (o *Config) v6Refused() error {
	switch {
	case o.Mode != "fixed-ips":
		return fmt.Errorf("IPv6 pod addresses are fixed IPs or a block on the VM port (mode fixed-ips); mode %s serves IPv4 only: drop ipv6 from ipFamilies or use mode fixed-ips", o.Mode)
	case o.SecondaryNICs > 0:
		return fmt.Errorf("secondaryNICs %d: secondary NICs carry IPv4 pod addresses only, and with the IPv6 ones on the VM port alone a dual-stack node would hold no more pods than maxAddresses (%d) whatever its NICs: drop ipv6 from ipFamilies, or set secondaryNICs 0 and serve dual-stack pods from the VM port", o.SecondaryNICs, o.MaxAddresses)
	}
	return nil
}

// setupV6 settles the pods' IPv6 subnet — subnetIDv6, or that of the VM
// port's first IPv6 fixed IP on a subnet that takes named addresses —
// and readies the IPv6 side.
func (p *Provider) setupV6(ctx context.Context) error {
	if err := p.cfg.v6Refused(); err != nil {
		return err
	}
	pairs := p.cfg.ModeV6 == "prefix-pair" // any IPv6 subnet: no Neutron IPAM
	var sn *subnets.Subnet
	how := "configured (subnetIDv6)"
	if p.cfg.SubnetIDv6 != "" {
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		s, err := answered(subnets.Get(c, p.nc, p.cfg.SubnetIDv6).Extract())
		cancel()
		if err != nil {
			return explain(fmt.Errorf("subnetIDv6 %s: %w", p.cfg.SubnetIDv6, err))
		}
		if why := autoAddress(s); why != "" && !pairs {
			return errors.New(why + ", or use modeV6 prefix-pair")
		}
		sn = s
	} else {
		s, err := p.discoverV6(ctx, pairs)
		if err != nil {
			return err
		}
		sn, how = s, fmt.Sprintf("discovered: the subnet of VM port %s's IPv6 fixed IP", p.portID)
	}
	prefix, err := netip.ParsePrefix(sn.CIDR)
	switch {
	case err != nil || !prefix.Addr().Is6():
		return fmt.Errorf("subnetIDv6 %s has CIDR %q: vpcni needs an IPv6 subnet there", sn.ID, sn.CIDR)
	case prefix.Bits() < 64:
		return fmt.Errorf("IPv6 subnet %s is a /%d: vpcni serves IPv6 subnets of /64 and longer", sn.ID, prefix.Bits())
	case sn.NetworkID != p.port.NetworkID:
		return fmt.Errorf("IPv6 subnet %s is on network %s, the VM port %s on network %s: the pods' IPv6 subnet must be on the VM port's network", sn.ID, sn.NetworkID, p.portID, p.port.NetworkID)
	}
	q := &Provider{nc: p.nc, cfg: p.cfg, calls: p.calls, portID: p.portID, nodeIP: p.nodeIP, parent: p, subnetHow: how}
	q.cfg.SubnetID, q.subnet = sn.ID, prefix.Masked()
	q.gateway, _ = netip.ParseAddr(sn.GatewayIP)
	for _, pool := range sn.AllocationPools {
		lo, err1 := netip.ParseAddr(pool.Start)
		hi, err2 := netip.ParseAddr(pool.End)
		if err1 == nil && err2 == nil {
			q.pools = append(q.pools, [2]netip.Addr{lo, hi})
		}
	}
	if pairs {
		if err := p.setupBlock(ctx, q); err != nil {
			return err
		}
		q.subnetHow += fmt.Sprintf("; modeV6 prefix-pair, this node's block %s", q.block)
	}
	p.v6 = q
	if pairs {
		return nil // no Neutron IPAM: nothing to learn of others
	}
	// As for IPv4: learn the used addresses now, not on the first ADD.
	_ = q.refreshUsed(ctx)
	return nil
}

// discoverV6 reads the subnets of the VM port's IPv6 fixed IPs and takes
// the first that takes named addresses (any: anyMode).
func (p *Provider) discoverV6(ctx context.Context, anyMode bool) (*subnets.Subnet, error) {
	var auto []string
	for _, f := range p.port.FixedIPs {
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil || !a.Is6() || f.SubnetID == "" {
			continue
		}
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		sn, err := answered(subnets.Get(c, p.nc, f.SubnetID).Extract())
		cancel()
		if err != nil {
			return nil, explain(fmt.Errorf("subnet %s of the VM port's IPv6 fixed IP %s: %w", f.SubnetID, a, err))
		}
		if why := autoAddress(sn); why != "" && !anyMode {
			auto = append(auto, why)
			continue
		}
		return sn, nil
	}
	if len(auto) > 0 {
		return nil, fmt.Errorf("VM port %s has IPv6 addresses on auto-address subnets only (or use modeV6 prefix-pair): %s", p.portID, strings.Join(auto, "; "))
	}
	return nil, fmt.Errorf("VM port %s has no IPv6 fixed IP to take the pods' IPv6 subnet from: set subnetIDv6 (an IPv6 subnet on network %s)", p.portID, p.port.NetworkID)
}

// onV6 runs f on the IPv6 side with the VM port as p last read it, and
// keeps what f read or wrote of it; the caller holds p.mu.
func (p *Provider) onV6(f func(q *Provider) error) error {
	q := p.v6
	q.port, q.portAt = p.port, p.portAt
	err := f(q)
	p.port, p.portAt = q.port, q.portAt
	return err
}

// assignV6 assigns IPv6 addresses on the VM port.
func (p *Provider) assignV6(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	if p.v6 == nil {
		return nil, fmt.Errorf("asked for IPv6 addresses, but this node's provider serves no IPv6 subnet (set subnetIDv6, or ipFamilies with ipv6): %w", provider.ErrOutside)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var got []netip.Addr
	err := p.onV6(func(q *Provider) error {
		var err error
		if q.block.IsValid() {
			got, err = q.assignBlock(ctx, req)
		} else {
			got, err = q.assignLocked(ctx, req)
		}
		return err
	})
	return p.v6.leases(got), err
}

// heldV6 is the IPv6 addresses of the port as last read that carry
// vpcni's marks; the caller holds p.mu and has just read the port.
func (p *Provider) heldV6(ctx context.Context) ([]alloc.Lease, error) {
	var out []netip.Addr
	err := p.onV6(func(q *Provider) error {
		if q.block.IsValid() {
			var err error
			out, err = q.heldBlock(ctx)
			return err
		}
		_, marked, on, err := q.state()
		for a := range marked {
			if on[a] {
				out = append(out, a)
			}
		}
		return err
	})
	return p.v6.leases(sorted(out)), err
}

// releaseV6 takes vpcni's IPv6 addresses off the VM port; the caller
// holds p.mu.
func (p *Provider) releaseV6(ctx context.Context, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	if p.v6 == nil {
		return fmt.Errorf("left %v: this node's provider serves no IPv6 subnet", addrs)
	}
	return p.onV6(func(q *Provider) error {
		if q.block.IsValid() {
			return q.releaseBlock(ctx, addrs)
		}
		return q.releaseFixed(ctx, addrs)
	})
}

// capacityV6 is how many IPv6 addresses the node may hold, and why.
func (p *Provider) capacityV6() provider.Capacity {
	q := p.v6
	subnet, pool0 := q.subnet, q.subnet.Addr()
	if len(q.pools) > 0 {
		pool0 = q.pools[0][0]
	}
	if q.block.IsValid() {
		subnet, pool0 = q.block, q.block.Addr() // picked lowest first in the block
	}
	if fit := marksFit6(subnet, pool0, p.subnet); fit < p.cfg.MaxAddresses {
		return provider.Capacity{Max: fit, Reason: fmt.Sprintf("the ownership marks of %d IPv6 addresses of subnet %s that fit the port's description beside the IPv4 ones", fit, q.subnet)}
	}
	return provider.Capacity{Max: p.cfg.MaxAddresses, Reason: fmt.Sprintf("maxAddresses %d", p.cfg.MaxAddresses)}
}

// byFamily splits addresses into IPv4 and IPv6 ones.
func byFamily(addrs []netip.Addr) (v4, v6 []netip.Addr) {
	for _, a := range addrs {
		if family.Of(a) == family.V6 {
			v6 = append(v6, a)
		} else {
			v4 = append(v4, a)
		}
	}
	return v4, v6
}
