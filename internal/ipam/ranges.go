package ipam

import (
	"fmt"
	"net/netip"
)

// Range is a subnet with the addresses that must never go to a pod.
type Range struct {
	Prefix  netip.Prefix
	Gateway netip.Addr
	Exclude []netip.Prefix
}

// NewRange builds a Range; a zero gateway means the subnet's first host.
func NewRange(prefix netip.Prefix, gateway netip.Addr, exclude []netip.Prefix) (Range, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() {
		return Range{}, fmt.Errorf("range %s: only IPv4 is supported", prefix)
	}
	if !gateway.IsValid() {
		gateway = prefix.Addr().Next()
	}
	if !prefix.Contains(gateway) {
		return Range{}, fmt.Errorf("range %s: gateway %s is outside it", prefix, gateway)
	}
	return Range{Prefix: prefix, Gateway: gateway, Exclude: exclude}, nil
}

// Usable says whether a may be handed to a pod: inside the subnet, not its
// network or broadcast address, not the gateway, not excluded.
func (r Range) Usable(a netip.Addr) bool {
	if !r.Prefix.Contains(a) || a == r.Gateway {
		return false
	}
	if r.Prefix.Bits() < 31 && (a == r.Prefix.Addr() || a == lastAddr(r.Prefix)) {
		return false
	}
	for _, e := range r.Exclude {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

// All calls yield for every usable address in order until yield says stop.
func (r Range) All(yield func(netip.Addr) bool) {
	last := lastAddr(r.Prefix)
	for a := r.Prefix.Addr(); ; a = a.Next() {
		if r.Usable(a) && !yield(a) {
			return
		}
		if a == last {
			return
		}
	}
}

// Size counts the usable addresses (ranges are at most a /16, see config).
func (r Range) Size() int {
	n := 0
	r.All(func(netip.Addr) bool { n++; return true })
	return n
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	for i := 3; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	return netip.AddrFrom4(b)
}
