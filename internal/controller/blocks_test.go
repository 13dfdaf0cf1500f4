package controller

import (
	"net/netip"
	"testing"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// A gone node's block is kept while a PodAddress holds an address of it,
// of any family: a dual-stack pod's IPv6 address is in addresses only,
// and an object written before dual-stack has address alone.
func TestUsesBlock(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.50.0.0/28"), netip.MustParsePrefix("fd00:50::/96")
	pa := func(address string, all ...string) *v1alpha1.PodAddress {
		return &v1alpha1.PodAddress{Spec: v1alpha1.PodAddressSpec{Address: address, Addresses: all}}
	}
	for _, c := range []struct {
		name   string
		pa     *v1alpha1.PodAddress
		v4, v6 bool
	}{
		{"IPv4 written before dual-stack", pa("10.50.0.3"), true, false},
		{"dual-stack", pa("10.50.0.3", "10.50.0.3", "fd00:50::3"), true, true},
		{"dual-stack, IPv6 first", pa("fd00:50::3", "fd00:50::3", "10.50.0.3"), true, true},
		{"IPv6 only", pa("fd00:50::3", "fd00:50::3"), false, true},
		{"another block's", pa("10.60.0.3", "10.60.0.3", "fd00:60::3"), false, false},
		{"an address that does not parse keeps every block", pa("10.60.0.3", "10.60.0.3", "fd00:zz::3"), true, true},
	} {
		if got := usesBlock(c.pa, v4); got != c.v4 {
			t.Errorf("%s: uses %s = %v, want %v", c.name, v4, got, c.v4)
		}
		if got := usesBlock(c.pa, v6); got != c.v6 {
			t.Errorf("%s: uses %s = %v, want %v", c.name, v6, got, c.v6)
		}
	}
}
