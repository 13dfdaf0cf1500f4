// Package family is the vocabulary of IP address families (IPv4, IPv6)
// every part of vpcni shares: which families a node's pods get, in which
// order, and what each family's host prefix, default route and kernel
// names are. Standard library only: the CNI plugin and vpcnictl read it.
package family

import (
	"fmt"
	"net/netip"
	"strings"
)

// Family is an IP address family.
type Family int

// The families. The zero value is no family, so a Family left unset is
// never taken for IPv4 by accident.
const (
	V4 Family = 4
	V6 Family = 6
)

// All lists the families in their usual order.
var All = []Family{V4, V6}

// Of is the family of an address (0 for an invalid one). An IPv4 address
// mapped into IPv6 (::ffff:a.b.c.d) is IPv4, as the kernel routes it.
func Of(a netip.Addr) Family {
	switch {
	case !a.IsValid():
		return 0
	case a.Is4() || a.Is4In6():
		return V4
	default:
		return V6
	}
}

// Bits is the length of an address of the family.
func (f Family) Bits() int {
	if f == V6 {
		return 128
	}
	return 32
}

// Host is the prefix of one address alone: a /32 or a /128.
func Host(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// Default is the family's default route: 0.0.0.0/0 or ::/0.
func (f Family) Default() netip.Prefix {
	if f == V6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

// Sys is the family's directory under /proc/sys/net: "ipv4" or "ipv6".
func (f Family) Sys() string {
	if f == V6 {
		return "ipv6"
	}
	return "ipv4"
}

// String is how configuration and messages name the family.
func (f Family) String() string {
	switch f {
	case V4:
		return "ipv4"
	case V6:
		return "ipv6"
	}
	return fmt.Sprintf("family(%d)", int(f))
}

// Parse reads a family's name as configuration writes it: ipv4 or ipv6
// (4, 6, IPv4 and IPv6 are accepted too).
func Parse(s string) (Family, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "ipv4", "4", "v4":
		return V4, nil
	case "ipv6", "6", "v6":
		return V6, nil
	}
	return 0, fmt.Errorf("unknown address family %q (want ipv4 or ipv6)", s)
}

// MarshalText writes the family's name.
func (f Family) MarshalText() ([]byte, error) {
	if f != V4 && f != V6 {
		return nil, fmt.Errorf("no such address family %d", int(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText reads a family's name.
func (f *Family) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Has says whether fams holds f.
func Has(fams []Family, f Family) bool {
	for _, x := range fams {
		if x == f {
			return true
		}
	}
	return false
}

// Check refuses a list of families that is empty, names a family twice or
// holds one that is not IPv4 or IPv6.
func Check(fams []Family) error {
	if len(fams) == 0 {
		return fmt.Errorf("no address family (want ipv4, ipv6 or both)")
	}
	seen := map[Family]bool{}
	for _, f := range fams {
		if f != V4 && f != V6 {
			return fmt.Errorf("unknown address family %d", int(f))
		}
		if seen[f] {
			return fmt.Errorf("address family %s named twice", f)
		}
		seen[f] = true
	}
	return nil
}

// Join names families for a message: "ipv4, ipv6".
func Join(fams []Family) string {
	s := make([]string, len(fams))
	for i, f := range fams {
		s[i] = f.String()
	}
	return strings.Join(s, ", ")
}
