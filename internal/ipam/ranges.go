package ipam

import (
	"fmt"
	"net/netip"
	"slices"
)

// Range is a subnet with the addresses that must never go to a pod. It is
// IPv4 or IPv6; an IPv6 range may hold 2^64 addresses (a /64) or more, so
// nothing here walks a range address by address but All and AllIn, which
// their caller stops.
type Range struct {
	Prefix  netip.Prefix
	Gateway netip.Addr
	Exclude []netip.Prefix
}

// NewRange builds a Range; a zero gateway means the subnet's first host.
func NewRange(prefix netip.Prefix, gateway netip.Addr, exclude []netip.Prefix) (Range, error) {
	if !prefix.IsValid() || prefix.Addr().Is4In6() {
		return Range{}, fmt.Errorf("range %s: not an IPv4 or IPv6 prefix", prefix)
	}
	prefix = prefix.Masked()
	if !gateway.IsValid() {
		gateway = prefix.Addr().Next()
	}
	if !prefix.Contains(gateway) {
		return Range{}, fmt.Errorf("range %s: gateway %s is outside it", prefix, gateway)
	}
	return Range{Prefix: prefix, Gateway: gateway, Exclude: exclude}, nil
}

// Usable says whether a may be handed to a pod: inside the subnet, not the
// gateway, not excluded, and not the subnet's reserved addresses: an IPv4
// subnet's network and broadcast addresses (none in a /31 or /32, RFC
// 3021), an IPv6 subnet's first address, its Subnet-Router anycast (RFC
// 4291 2.6.1; none in a /127 or /128). IPv6 has no broadcast: the last
// address is a host's.
func (r Range) Usable(a netip.Addr) bool {
	if !r.Prefix.Contains(a) || a == r.Gateway {
		return false
	}
	if r.reserved(a) {
		return false
	}
	for _, e := range r.Exclude {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

// reserved: a is the subnet's network (or Subnet-Router anycast) or IPv4
// broadcast address.
func (r Range) reserved(a netip.Addr) bool {
	if r.Prefix.Addr().Is4() {
		return r.Prefix.Bits() < 31 && (a == r.Prefix.Addr() || a == lastAddr(r.Prefix))
	}
	return r.Prefix.Bits() < 127 && a == r.Prefix.Addr()
}

// All calls yield for every usable address in order until yield says
// stop. An excluded prefix is stepped over at once, so a large exclusion
// inside an IPv6 range costs one step, not one per address.
func (r Range) All(yield func(netip.Addr) bool) { r.AllIn(r.Prefix, yield) }

// AllIn is All for the usable addresses inside p (a block of the range,
// say; all of them if p holds the range).
func (r Range) AllIn(p netip.Prefix, yield func(netip.Addr) bool) {
	p = p.Masked()
	if !p.Overlaps(r.Prefix) {
		return
	}
	if p.Bits() < r.Prefix.Bits() {
		p = r.Prefix
	}
	last := lastAddr(p)
	for a := p.Addr(); ; a = a.Next() {
		if e, ok := r.widestExclude(a); ok {
			end := lastAddr(e)
			if end.Compare(last) >= 0 {
				return
			}
			a = end // the loop steps past it
			continue
		}
		if r.Usable(a) && !yield(a) {
			return
		}
		if a == last {
			return
		}
	}
}

// widestExclude is the largest exclusion holding a, if one does.
func (r Range) widestExclude(a netip.Addr) (netip.Prefix, bool) {
	var w netip.Prefix
	for _, e := range r.Exclude {
		if e.Contains(a) && (!w.IsValid() || e.Bits() < w.Bits()) {
			w = e
		}
	}
	return w, w.IsValid()
}

// Size counts the usable addresses, in closed form (an IPv6 /64 is never
// walked), saturated at math.MaxInt: a /64 says MaxInt, and a caller that
// shows a capacity caps it at a number of its own.
func (r Range) Size() int { return r.countIn(r.Prefix).int() }

// SizeIn counts the usable addresses inside p (a block of the range, say;
// all of them if p holds the range), as Size does.
func (r Range) SizeIn(p netip.Prefix) int { return r.countIn(p).int() }

// countIn is SizeIn before saturation: p's addresses, less the union of
// the exclusions inside it (prefixes either nest or are apart, so the
// union is the outermost ones), less the range's reserved addresses and
// gateway where they lie in p and no exclusion took them already.
func (r Range) countIn(p netip.Prefix) num {
	p = p.Masked()
	if !p.Overlaps(r.Prefix) {
		return num{}
	}
	if p.Bits() < r.Prefix.Bits() {
		p = r.Prefix
	}
	var in []netip.Prefix
	for _, e := range r.Exclude {
		e = e.Masked()
		if !e.Overlaps(p) {
			continue
		}
		if e.Bits() <= p.Bits() {
			return num{} // it covers all of p
		}
		in = append(in, e)
	}
	// Ascending by address, wider first at one address: a prefix comes
	// before every prefix inside it.
	slices.SortFunc(in, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	n := span(p)
	var outer netip.Prefix
	for _, e := range in {
		if outer.IsValid() && outer.Contains(e.Addr()) {
			continue
		}
		outer = e
		n = n.sub(span(e))
	}
	var special []netip.Addr
	for _, a := range []netip.Addr{r.Prefix.Addr(), lastAddr(r.Prefix), r.Gateway} {
		if (a == r.Gateway || r.reserved(a)) && p.Contains(a) && !slices.Contains(special, a) {
			special = append(special, a)
		}
	}
	for _, a := range special {
		if _, excluded := r.widestExclude(a); !excluded {
			n = n.sub(num{lo: 1})
		}
	}
	return n
}
