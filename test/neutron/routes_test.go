package neutron

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/routes"
)

// refusals counts the route writes Neutron refuses.
type refusals struct {
	n atomic.Int64
}

func (c *refusals) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && strings.Contains(r.URL.Path, "extraroutes") && resp.StatusCode >= 400 {
		c.n.Add(1)
	}
	return resp, err
}

func maxRoutes(t *testing.T, n string) {
	t.Helper()
	cmd := exec.Command("bash", "../../scripts/neutron.sh", "max-routes", n)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/neutron.sh max-routes %s: %v", n, err)
	}
}

// The routed pod subnet on the real neutron-server's router API: 40
// nodes' blocks on a router with max_routes 30 get 30 routes and 10
// reports with the fix, nothing half applied, no request refused with
// the limit configured and one (changing nothing) to learn it; the limit
// raised in neutron.conf, the rest appear; a route and a pair removed by
// hand come back; a reclaimed block's route and pair go.
func TestRouteBudgetRealNeutron(t *testing.T) {
	maxRoutes(t, "30")
	t.Cleanup(func() { maxRoutes(t, "30") })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ref := &refusals{}
	rnc := openstack.NoAuthClient(endpoint, http.Client{Timeout: 60 * time.Second, Transport: ref})
	bed, err := cluster.NewRouteBed(ctx, rnc, "vpcni-test-routes", 40, netip.MustParsePrefix("10.97.0.0/24"), netip.MustParsePrefix("10.98.0.0/16"), 26, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(context.Background()); err != nil {
			t.Errorf("remove the bed: %v", err)
		}
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	newRec := func(max int, probe time.Duration) *routes.Reconciler {
		r, err := routes.New(bed.Routes(), routes.Options{Ranges: bed.Ranges, MaxRoutes: max, MaxPairs: 10, Probe: probe}, log)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// whole: every block has route and pair or neither, as the result says.
	whole := func(res routes.Result, blocks []routes.Block) int {
		t.Helper()
		r, err := routers.Get(ctx, rnc, bed.RouterID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		hops := map[string]string{}
		for _, rt := range r.Routes {
			hops[rt.DestinationCIDR] = rt.NextHop
		}
		routed := 0
		for i, b := range blocks {
			p, err := ports.Get(ctx, rnc, bed.Ports[i]).Extract()
			if err != nil {
				t.Fatal(err)
			}
			paired := false
			for _, ap := range p.AllowedAddressPairs {
				paired = paired || ap.IPAddress == b.CIDR.String()
			}
			hop, has := hops[b.CIDR.String()]
			if has != paired || has && hop != b.NodeIP.String() {
				t.Errorf("block %s half applied: route %v via %s, pair %v", b.CIDR, has, hop, paired)
			}
			if has != (res.States[b.Name] == routes.Routed) {
				t.Errorf("block %s: route %v, state %s", b.CIDR, has, res.States[b.Name])
			}
			if has {
				routed++
			}
		}
		return routed
	}

	t0 := time.Now()
	res, err := newRec(30, time.Hour).Sync(ctx, bed.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("40 blocks, max_routes 30 configured: %d routed, %d reported in %s", res.Routes, res.Waiting, time.Since(t0).Round(time.Millisecond))
	if n := whole(res, bed.Blocks); n != 30 || res.Waiting != 10 || !strings.Contains(res.Fix, "raise max_routes to 40") {
		t.Fatalf("routed %d, waiting %d, fix %q", n, res.Waiting, res.Fix)
	}
	if ref.n.Load() != 0 {
		t.Fatalf("with the limit configured, Neutron refused %d route writes", ref.n.Load())
	}
	// Learned instead, from an empty router: one refused atomic add, the
	// same end state.
	learner := newRec(0, time.Second)
	if _, err := routers.Update(ctx, rnc, bed.RouterID, routers.UpdateOpts{Routes: &[]routers.Route{}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if res, err = learner.Sync(ctx, bed.Blocks); err != nil {
		t.Fatal(err)
	}
	if n := whole(res, bed.Blocks); n != 30 || res.Limit != 30 || ref.n.Load() != 1 {
		t.Fatalf("learning the limit: routed %d, limit %d, %d refused", n, res.Limit, ref.n.Load())
	}

	// neutron.conf's max_routes raised: the learned limit is tried again
	// once its probe time (1s, shorter than the restart) has passed.
	maxRoutes(t, "40")
	if res, err = learner.Sync(ctx, bed.Blocks); err != nil {
		t.Fatal(err)
	}
	if n := whole(res, bed.Blocks); n != 40 || res.Waiting != 0 {
		t.Fatalf("after raising max_routes: %d routed, %d waiting", n, res.Waiting)
	}

	// By hand: a route and a pair removed; both come back.
	b3, b7 := bed.Blocks[3], bed.Blocks[7]
	if _, err := extraroutes.Remove(ctx, rnc, bed.RouterID, extraroutes.Opts{Routes: &[]routers.Route{{DestinationCIDR: b3.CIDR.String(), NextHop: b3.NodeIP.String()}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if _, err := ports.Update(ctx, rnc, bed.Ports[7], ports.UpdateOpts{AllowedAddressPairs: &[]ports.AddressPair{}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if res, err = learner.Sync(ctx, bed.Blocks); err != nil {
		t.Fatal(err)
	}
	if n := whole(res, bed.Blocks); n != 40 {
		t.Fatalf("after repair: %d routed (%s, %s removed by hand)", n, b3.CIDR, b7.CIDR)
	}
	// Block 5 reclaimed (its node gone): its route and pair go.
	rest := append(append([]routes.Block{}, bed.Blocks[:5]...), bed.Blocks[6:]...)
	if res, err = learner.Sync(ctx, rest); err != nil {
		t.Fatal(err)
	}
	if n := whole(res, bed.Blocks); n != 39 {
		t.Fatalf("after reclaiming %s: %d routed", bed.Blocks[5].CIDR, n)
	}
}
