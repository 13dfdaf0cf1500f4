package blocks

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// A static PodNetwork's ranges and gateway may be of either family, on the
// real API server with the generated CRD: IPv6 alone, both families, the
// longest an IPv6 prefix and address can be spelled; what is not a prefix
// or an address is still refused, saying what is wanted.
func TestPodNetworkStaticRangesOfEitherFamily(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pns, err := k8s.NewPodNetworks(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	static := func(gw string, ranges ...string) v1alpha1.PodNetworkSpec {
		return v1alpha1.PodNetworkSpec{Static: &v1alpha1.StaticPodNetwork{Ranges: ranges, Gateway: gw}}
	}
	for name, spec := range map[string]v1alpha1.PodNetworkSpec{
		"pn-v4":     static("10.30.0.1", "10.30.0.0/24"),
		"pn-v6":     static("", "fd00:30::/64"),
		"pn-dual":   static("fd00:30::1", "10.30.0.0/24", "fd00:30::/64"),
		"pn-v6-max": static("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
	} {
		if err := pns.Create(ctx, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}); err != nil {
			t.Errorf("%s %+v: %v", name, *spec.Static, err)
			continue
		}
		t.Cleanup(func() { _ = pns.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	for name, c := range map[string]struct {
		spec v1alpha1.PodNetworkSpec
		says string
	}{
		"v6 prefix too long":   {static("", "fd00:30::/129"), "IPv4 or IPv6 prefix"},
		"v6 address, no mask":  {static("", "fd00:30::1"), "IPv4 or IPv6 prefix"},
		"gateway not an IP":    {static("fd00:30::zz", "fd00:30::/64"), "gateway must be an IPv4 or IPv6 address"},
		"range longer than 43": {static("", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/0128"), "43"},
	} {
		err := pns.Create(ctx, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "pn-bad"}, Spec: c.spec})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.says) {
			_ = pns.Delete(ctx, "pn-bad", metav1.DeleteOptions{})
			t.Errorf("%s: %v, want Invalid saying %q", name, err, c.says)
		}
	}
}
