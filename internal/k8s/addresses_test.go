package k8s

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// Every address of a PodAddress or a reservation, whichever release wrote
// it: address alone (before dual-stack), addresses with address first, and
// a bad entry named while the good ones still count.
func TestAddressesOf(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	for _, c := range []struct {
		name    string
		address string
		all     []string
		want    []netip.Addr
		errHas  string
	}{
		{"written before dual-stack", "10.0.0.5", nil, addrs("10.0.0.5"), ""},
		{"single-family with addresses", "10.0.0.5", []string{"10.0.0.5"}, addrs("10.0.0.5"), ""},
		{"dual-stack", "10.0.0.5", []string{"10.0.0.5", "fd00::5"}, addrs("10.0.0.5", "fd00::5"), ""},
		{"IPv6 first", "fd00::5", []string{"fd00::5", "10.0.0.5"}, addrs("fd00::5", "10.0.0.5"), ""},
		{"IPv6 only", "fd00::5", []string{"fd00::5"}, addrs("fd00::5"), ""},
		{"address missing from addresses", "10.0.0.9", []string{"fd00::5"}, addrs("10.0.0.9", "fd00::5"), ""},
		{"nothing recorded yet", "", nil, nil, ""},
		{"one bad entry", "10.0.0.5", []string{"10.0.0.5", "fd00::zz"}, addrs("10.0.0.5"), `"fd00::zz"`},
		{"v4-mapped is v4", "::ffff:10.0.0.5", []string{"10.0.0.5"}, addrs("10.0.0.5"), ""},
	} {
		for kind, got := range map[string]func() ([]netip.Addr, error){
			"PodAddress": func() ([]netip.Addr, error) {
				return AddressesOf(&v1alpha1.PodAddress{Spec: v1alpha1.PodAddressSpec{Address: c.address, Addresses: c.all}})
			},
			"AddressReservation": func() ([]netip.Addr, error) {
				return ReservedAddressesOf(&v1alpha1.AddressReservation{Spec: v1alpha1.AddressReservationSpec{Address: c.address, Addresses: c.all}})
			},
		} {
			a, err := got()
			if !slices.Equal(a, c.want) {
				t.Errorf("%s, %s: %v, want %v", kind, c.name, a, c.want)
			}
			if c.errHas == "" && err != nil || c.errHas != "" && (err == nil || !strings.Contains(err.Error(), c.errHas)) {
				t.Errorf("%s, %s: error %v, want one naming %s", kind, c.name, err, c.errHas)
			}
		}
	}
	if s := AddressStrings(addrs("10.0.0.5", "fd00::5")); !slices.Equal(s, []string{"10.0.0.5", "fd00::5"}) {
		t.Errorf("AddressStrings: %q", s)
	}
}
