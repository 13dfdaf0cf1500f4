package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Blocks splits cluster-wide ranges into aligned blocks of one size: what
// vpcni-controller hands to nodes (a node's pods take addresses only from
// its blocks) and, for a routed pod subnet, what one router route and one
// allowed address pair cover. Aligned, so a block is one CIDR and two
// blocks either are the same or do not overlap.
//
// Pure arithmetic, no I/O: the controller feeds it the blocks already
// recorded (NodeBlocks) and writes the one it picks.
type Blocks struct {
	Ranges []netip.Prefix
	Bits   int // the blocks' prefix length, e.g. 26 for 64 addresses
}

// MaxBlocks bounds how many blocks the ranges may hold: the controller
// scans them for a free one, and a /8 in /32s would be 16M objects (an
// IPv6 /64 in /80s is exactly MaxBlocks).
const MaxBlocks = 1 << 16

// NewBlocks checks the ranges and the block size: one family (IPv4 or
// IPv6) for all ranges, no host bits, no two ranges overlapping, every
// range at least one block, and at most MaxBlocks blocks in all. Every
// problem is named at once.
func NewBlocks(ranges []netip.Prefix, bits int) (Blocks, error) {
	var errs []error
	if len(ranges) == 0 {
		errs = append(errs, errors.New("no range to split into blocks"))
	}
	var first netip.Prefix // the ranges' family is the first valid range's
	for _, r := range ranges {
		if r.IsValid() && !r.Addr().Is4In6() {
			first = r
			break
		}
	}
	maxBits := 32
	if first.IsValid() && first.Addr().Is6() {
		maxBits = 128
	}
	if bits < 1 || bits > maxBits {
		errs = append(errs, fmt.Errorf("block size /%d: must be /1 to /%d", bits, maxBits))
	}
	total := 0
	for i, r := range ranges {
		switch {
		case !r.IsValid() || r.Addr().Is4In6():
			errs = append(errs, fmt.Errorf("range %s is not an IPv4 or IPv6 CIDR", r))
			continue
		case r.Addr().BitLen() != first.Addr().BitLen():
			errs = append(errs, fmt.Errorf("range %s is not of the family of %s: the blocks of one set are all IPv4 or all IPv6", r, first))
			continue
		case r.Masked() != r:
			errs = append(errs, fmt.Errorf("range %s has host bits set (did you mean %s?)", r, r.Masked()))
			continue
		case bits >= 1 && r.Bits() > bits:
			errs = append(errs, fmt.Errorf("range %s is smaller than one block /%d", r, bits))
			continue
		}
		for _, o := range ranges[:i] {
			if o.IsValid() && o.Overlaps(r) {
				errs = append(errs, fmt.Errorf("ranges %s and %s overlap", o, r))
			}
		}
		if bits >= 1 && bits <= maxBits && bits-r.Bits() < 31 {
			total += 1 << (bits - r.Bits())
		} else {
			total = MaxBlocks + 1
		}
	}
	if total > MaxBlocks {
		errs = append(errs, fmt.Errorf("the ranges hold more than %d blocks of /%d: use larger blocks", MaxBlocks, bits))
	}
	if err := errors.Join(errs...); err != nil {
		return Blocks{}, err
	}
	return Blocks{Ranges: slices.Clone(ranges), Bits: bits}, nil
}

// Count is the number of blocks in all ranges (at most MaxBlocks for
// Blocks that NewBlocks built).
func (b Blocks) Count() int {
	n := 0
	for _, r := range b.Ranges {
		n += pow2(b.Bits - r.Bits()).int()
	}
	return n
}

// Size is the number of addresses in one block, saturated at
// math.MaxInt (an IPv6 block of /64 or larger).
func (b Blocks) Size() int { return b.step().int() }

// step is the distance from one block to the next: its size, unsaturated.
func (b Blocks) step() num {
	addrBits := 32
	if len(b.Ranges) > 0 {
		addrBits = b.Ranges[0].Addr().BitLen()
	}
	return pow2(addrBits - b.Bits)
}

// Contains says whether p is one of the blocks: inside a range, aligned
// and of the blocks' size.
func (b Blocks) Contains(p netip.Prefix) bool {
	if p.Bits() != b.Bits || p.Masked() != p {
		return false
	}
	return slices.ContainsFunc(b.Ranges, func(r netip.Prefix) bool { return r.Contains(p.Addr()) })
}

// All yields every block, range by range, in address order.
func (b Blocks) All(yield func(netip.Prefix) bool) {
	for _, r := range b.Ranges {
		a, step := numOf(r.Addr()), b.step()
		for range pow2(b.Bits - r.Bits()).int() {
			if !yield(netip.PrefixFrom(a.addr(r.Addr()), b.Bits)) {
				return
			}
			a = a.add(step)
		}
	}
}

// Free finds the first block that overlaps none of used. used may hold
// blocks of another size (recorded before the size changed) and blocks
// outside the ranges: a candidate overlapping any of them is skipped, so
// no address is ever in two nodes' blocks. false: the ranges are full.
func (b Blocks) Free(used []netip.Prefix) (netip.Prefix, bool) {
	u := newUsedSet(used)
	var found netip.Prefix
	b.All(func(p netip.Prefix) bool {
		if u.overlaps(p) {
			return true
		}
		found = p
		return false
	})
	return found, found.IsValid()
}

// usedSet answers "does p overlap a used prefix?" in O(log n + bits), not
// O(n): prefixes never partly overlap, so a used prefix overlapping p
// either contains p's first address (it is p's first address masked to
// its own length: at most 33 lookups, 129 for IPv6) or starts inside p (a
// binary search over the starts; netip orders IPv4 before IPv6).
type usedSet struct {
	set    map[netip.Prefix]bool
	starts []netip.Addr
}

func newUsedSet(used []netip.Prefix) usedSet {
	u := usedSet{set: make(map[netip.Prefix]bool, len(used))}
	for _, p := range used {
		p = p.Masked()
		u.set[p] = true
		u.starts = append(u.starts, p.Addr())
	}
	slices.SortFunc(u.starts, netip.Addr.Compare)
	return u
}

func (u usedSet) overlaps(p netip.Prefix) bool {
	for bits := 0; bits <= p.Bits(); bits++ {
		if c, _ := p.Addr().Prefix(bits); u.set[c] {
			return true
		}
	}
	i, _ := slices.BinarySearchFunc(u.starts, p.Addr(), netip.Addr.Compare)
	return i < len(u.starts) && p.Contains(u.starts[i])
}
