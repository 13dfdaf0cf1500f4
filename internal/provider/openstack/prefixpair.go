package openstack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
)

// modeV6 prefix-pair: the node's IPv6 pod addresses come from a /96
// block of prefixRangeV6 that is one allowed address pair on the VM port,
// written once; handing out an address of it is a mark in the port's
// description ("[vpcni6b:...]", offsets in the block), so Held survives a
// restart and an address is never given twice. No Neutron IPAM is
// involved, so it works on SLAAC subnets, where Neutron refuses named
// fixed IPs. A pair reserves nothing (TestNeutronIPv6Facts): Neutron would
// hand an address inside it to a new port if an allocation pool reached
// into it, so the range must lie outside every pool, checked at start.
// Blocks are not coordinated between nodes: the node whose IPv4 address is
// the n-th of the IPv4 subnet takes the n-th block, and a block another
// port already allows is refused at start.

// blockBits is the length of a node's block.
const blockBits = 96

// setupBlock settles the node's block on the IPv6 side q.
func (p *Provider) setupBlock(ctx context.Context, q *Provider) error {
	rg, err := netip.ParsePrefix(p.cfg.PrefixRangeV6)
	if err != nil || !rg.Addr().Is6() || rg.Bits() < 64 || rg.Bits() > blockBits {
		return fmt.Errorf("prefixRangeV6 %q: modeV6 prefix-pair needs an IPv6 range of /64 to /%d", p.cfg.PrefixRangeV6, blockBits)
	}
	rg = rg.Masked()
	if !q.subnet.Contains(rg.Addr()) || rg.Bits() < q.subnet.Bits() {
		return fmt.Errorf("prefixRangeV6 %s lies outside the pods' IPv6 subnet %s: pod addresses must be on its link", rg, q.subnet)
	}
	last := lastOf(rg)
	for _, pool := range q.pools {
		if pool[0].Compare(last) <= 0 && pool[1].Compare(rg.Addr()) >= 0 {
			return fmt.Errorf("prefixRangeV6 %s overlaps the allocation pool %s-%s of subnet %s: an allowed address pair reserves nothing, so Neutron would give addresses of a node's block to new ports; shrink the pool or move the range outside it", rg, pool[0], pool[1], q.cfg.SubnetID)
		}
	}
	if rg.Contains(q.gateway) {
		return fmt.Errorf("prefixRangeV6 %s holds the subnet's gateway %s: move the range", rg, q.gateway)
	}
	// The node's place in its IPv4 subnet picks its block.
	var own netip.Addr
	for _, f := range p.port.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == p.cfg.SubnetID && a.Is4() {
			own = a
			break
		}
	}
	if !own.IsValid() {
		return fmt.Errorf("VM port %s has no IPv4 address on subnet %s to pick its block of prefixRangeV6 by", p.portID, p.cfg.SubnetID)
	}
	n := offset(p.subnet.Masked().Addr(), own)
	if blocks := uint64(1) << (blockBits - rg.Bits()); n >= blocks {
		return fmt.Errorf("prefixRangeV6 %s has %d blocks of /%d, and this node is address %d of IPv4 subnet %s: give a range of /%d or wider", rg, blocks, blockBits, n, p.subnet, blockBits-bitsFor(uint64(1)<<(32-p.subnet.Bits())))
	}
	b := rg.Addr().As16()
	binary.BigEndian.PutUint64(b[8:], be64(b[8:])+n<<32)
	q.block = netip.PrefixFrom(netip.AddrFrom16(b), blockBits)
	if b[11] == 0xff {
		// Interface IDs xx:xx:xx:ff:fe:… are the EUI-64 ones SLAAC forms
		// from MACs: a block there may hold a port's own address.
		return fmt.Errorf("the block %s of this node (address %d of %s) lies where SLAAC puts ports' EUI-64 addresses (…ff:fe…): move prefixRangeV6", q.block, n, p.subnet)
	}
	return p.blockFree(ctx, q.block)
}

// blockFree refuses a block another port on the network allows already.
func (p *Provider) blockFree(ctx context.Context, block netip.Prefix) error {
	c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	pages, err := ports.List(p.nc, ports.ListOpts{NetworkID: p.port.NetworkID}).AllPages(c)
	if err != nil {
		return explain(fmt.Errorf("list the ports of network %s to check this node's block %s is free: %w", p.port.NetworkID, block, err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return err
	}
	for _, port := range all {
		if port.ID == p.portID {
			continue
		}
		for _, ap := range port.AllowedAddressPairs {
			if pr, err := prefixOf(ap.IPAddress); err == nil && pr.Overlaps(block) {
				return fmt.Errorf("this node's IPv6 block %s overlaps the allowed address pair %s of port %s: another node's block, or someone else's; does another IPv4 subnet share prefixRangeV6?", block, ap.IPAddress, port.ID)
			}
		}
	}
	return nil
}

// prefixOf reads a pair's address or CIDR as a prefix.
func prefixOf(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.ParsePrefix(s)
}

// lastOf is a prefix's last address.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	host := 128 - p.Bits()
	lo := be64(b[8:])
	if host >= 64 {
		lo = ^uint64(0)
	} else {
		lo |= uint64(1)<<host - 1
	}
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}

// bitsFor is how many bits count n things.
func bitsFor(n uint64) int {
	b := 0
	for uint64(1)<<b < n {
		b++
	}
	return b
}

// pairOn says whether the port as last read allows the node's block.
func (q *Provider) pairOn() bool {
	return slices.ContainsFunc(q.port.AllowedAddressPairs, func(ap ports.AddressPair) bool {
		pr, err := prefixOf(ap.IPAddress)
		return err == nil && pr == q.block && (ap.MACAddress == "" || ap.MACAddress == q.port.MACAddress)
	})
}

// ensurePair puts the node's block on the VM port as an allowed address
// pair, unless it is there; the caller holds the lock (onV6). A write on
// a stale copy is planned again on the port as read then.
func (q *Provider) ensurePair(ctx context.Context) error {
	return q.replanned(ctx, func() error { return q.ensurePairOnce(ctx) })
}

func (q *Provider) ensurePairOnce(ctx context.Context) error {
	if err := q.refreshIfMissing(ctx); err != nil {
		return err
	}
	return q.untilHeld(ctx, "the block's allowed address pair", func() (bool, error) {
		if q.pairOn() {
			return true, nil
		}
		if len(q.port.AllowedAddressPairs) >= q.cfg.MaxAddressPairs {
			return false, fmt.Errorf("VM port %s has Neutron's %d allowed address pairs (maxAddressPairs) already, none left for this node's IPv6 block %s: %w", q.portID, q.cfg.MaxAddressPairs, q.block, provider.ErrExhausted)
		}
		list := append(slices.Clone(q.port.AllowedAddressPairs), ports.AddressPair{IPAddress: q.block.String()})
		if err := q.putPairs(ctx, list); err != nil {
			return false, err
		}
		if err := q.refresh(ctx); err != nil {
			return false, err
		}
		return q.pairOn(), nil
	})
}

// blockMarks reads the port as last read: the description without the
// block's marks and the marked addresses.
func (q *Provider) blockMarks() (string, map[netip.Addr]bool, error) {
	rest, marked, err := splitMarksAs(q.port.Description, q.block, markOpenBlock)
	if err != nil {
		return "", nil, fmt.Errorf("port %s: %w", q.portID, err)
	}
	return rest, marked, nil
}

// markBlock makes the description mark ours: the marked addresses as
// first read, with add and without remove; a racing write that takes
// some off is undone.
func (q *Provider) markBlock(ctx context.Context, add, remove map[netip.Addr]bool) error {
	return q.replanned(ctx, func() error { return q.markBlockOnce(ctx, add, remove) })
}

func (q *Provider) markBlockOnce(ctx context.Context, add, remove map[netip.Addr]bool) error {
	if err := q.refreshIfMissing(ctx); err != nil {
		return err
	}
	_, ours, err := q.blockMarks()
	if err != nil {
		return err
	}
	maps.Copy(ours, add)
	for a := range remove {
		delete(ours, a)
	}
	return q.untilHeld(ctx, "the IPv6 block's marks", func() (bool, error) {
		rest, marked, err := q.blockMarks()
		if err != nil {
			return false, err
		}
		if maps.Equal(marked, ours) {
			return true, nil
		}
		desc, err := joinMarksAs(rest, ours, q.block, markOpenBlock)
		if err != nil {
			return false, fmt.Errorf("%w: %w", err, provider.ErrExhausted)
		}
		if err := q.putDescription(ctx, desc); err != nil {
			return false, err
		}
		if err := q.refresh(ctx); err != nil {
			return false, err
		}
		_, now, err := q.blockMarks()
		return err == nil && maps.Equal(now, ours), err
	})
}

// putDescription writes the description under If-Match on the port as
// last read.
func (q *Provider) putDescription(ctx context.Context, desc string) error {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout.Duration)
	defer cancel()
	rev := q.port.RevisionNumber
	updated, err := answered(ports.Update(ctx, q.nc, q.portID, ports.UpdateOpts{Description: &desc, RevisionNumber: &rev}).Extract())
	if err != nil {
		return explain(fmt.Errorf("update the description of VM port %s: %w", q.portID, err))
	}
	q.port = updated
	return nil
}

// assignBlock hands out addresses of the node's block: the named ones,
// and Count more, lowest first; one description write.
func (q *Provider) assignBlock(ctx context.Context, req provider.AssignRequest) ([]netip.Addr, error) {
	if err := q.ensurePair(ctx); err != nil {
		return nil, err
	}
	_, marked, err := q.blockMarks()
	if err != nil {
		return nil, err
	}
	var errs []error
	var got []netip.Addr
	add := map[netip.Addr]bool{}
	for _, a := range req.Addresses {
		switch {
		case !q.block.Contains(a):
			errs = append(errs, fmt.Errorf("%s is outside this node's IPv6 block %s: %w", a, q.block, provider.ErrOutside))
		case marked[a]:
			got = append(got, a)
		default:
			add[a] = true
		}
	}
	room := q.cfg.MaxAddresses - len(marked) - len(add)
	need := min(max(req.Count, 0), max(room, 0))
	for a := q.block.Addr().Next(); need > 0 && q.block.Contains(a); a = a.Next() {
		if !marked[a] && !add[a] {
			add[a] = true
			need--
		}
	}
	if len(add) > 0 {
		if err := q.markBlock(ctx, add, nil); err != nil {
			return sorted(got), errors.Join(append(errs, err)...)
		}
		for a := range add {
			got = append(got, a)
		}
	}
	if req.Count > 0 && room < req.Count {
		errs = append(errs, fmt.Errorf("this node holds maxAddresses %d IPv6 addresses of block %s: %w", q.cfg.MaxAddresses, q.block, provider.ErrExhausted))
	}
	return sorted(got), errors.Join(errs...)
}

// heldBlock is the marked addresses of the node's block, the pair put
// back if a write took it off.
func (q *Provider) heldBlock(ctx context.Context) ([]netip.Addr, error) {
	if err := q.ensurePair(ctx); err != nil {
		return nil, err
	}
	_, marked, err := q.blockMarks()
	return sorted(slices.Collect(maps.Keys(marked))), err
}

// releaseBlock unmarks addresses of the node's block; one it did not
// hand out is not held, and nothing to do.
func (q *Provider) releaseBlock(ctx context.Context, addrs []netip.Addr) error {
	if err := q.refreshIfMissing(ctx); err != nil {
		return err
	}
	_, marked, err := q.blockMarks()
	if err != nil {
		return err
	}
	drop := map[netip.Addr]bool{}
	for _, a := range addrs {
		if marked[a] {
			drop[a] = true
		}
	}
	if len(drop) == 0 {
		return nil
	}
	return q.markBlock(ctx, nil, drop)
}
