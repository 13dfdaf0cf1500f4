package controller

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/floatingip"
)

// The annotations a pod may carry: what they ask for, and every bad one
// named at once.
func TestParseFloating(t *testing.T) {
	f := &FloatingIPs{Network: "public"}
	for _, c := range []struct {
		ann     map[string]string
		wants   bool
		spec    fipSpec
		errHas  []string
		network string
	}{
		{ann: map[string]string{}, wants: false},
		{ann: map[string]string{AnnotationFloatingIP: "auto"}, wants: true, spec: fipSpec{network: "public", policy: floatingip.Release}},
		{ann: map[string]string{AnnotationFloatingIP: "203.0.113.9", AnnotationFloatingNetwork: "ext2", AnnotationFloatingPolicy: "retain"}, wants: true,
			spec: fipSpec{address: netip.MustParseAddr("203.0.113.9"), network: "ext2", policy: floatingip.Retain}},
		{ann: map[string]string{AnnotationFloatingIP: "yes", AnnotationFloatingPolicy: "keep"}, wants: true, errHas: []string{`"yes"`, `"keep"`}},
		{ann: map[string]string{AnnotationFloatingIP: "2001:db8::1"}, wants: true, errHas: []string{"IPv4"}},
		{ann: map[string]string{AnnotationFloatingIP: "0.0.0.0"}, wants: true, errHas: []string{"unicast"}},
	} {
		spec, wants, err := f.parseFloating(c.ann)
		if wants != c.wants {
			t.Errorf("%v: wants %v", c.ann, wants)
		}
		if len(c.errHas) == 0 {
			if err != nil || spec != c.spec {
				t.Errorf("%v: %+v, %v; want %+v", c.ann, spec, err, c.spec)
			}
			continue
		}
		for _, h := range c.errHas {
			if err == nil || !strings.Contains(err.Error(), h) {
				t.Errorf("%v: error %v does not name %s", c.ann, err, h)
			}
		}
	}
	none := &FloatingIPs{}
	if _, _, err := none.parseFloating(map[string]string{AnnotationFloatingIP: "auto"}); err == nil || !strings.Contains(err.Error(), "-floating-network") {
		t.Errorf("no network anywhere: %v", err)
	}
}

// A floating IP points at the pod's IPv4 address whichever family is its
// first; an IPv6-only pod has none to point at.
func TestFixedIPv4(t *testing.T) {
	for _, c := range []struct {
		address string
		all     []string
		want    string
	}{
		{"10.0.0.5", nil, "10.0.0.5"}, // written before dual-stack
		{"10.0.0.5", []string{"10.0.0.5", "fd00::5"}, "10.0.0.5"},
		{"fd00::5", []string{"fd00::5", "10.0.0.5"}, "10.0.0.5"},
		{"fd00::5", []string{"fd00::5"}, ""},
		{"", nil, ""},
	} {
		a, ok := fixedIPv4(&v1alpha1.PodAddress{Spec: v1alpha1.PodAddressSpec{Address: c.address, Addresses: c.all}})
		if ok != (c.want != "") || ok && a.String() != c.want {
			t.Errorf("%s %q: %v %v, want %q", c.address, c.all, a, ok, c.want)
		}
	}
}
