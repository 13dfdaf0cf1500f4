package neutron

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
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

// The routed pod subnet for dual-stack nodes on the real neutron-server:
// IPv4 and IPv6 block ranges, a router with an interface on the VM
// network's IPv4 and IPv6 subnets, two nodes whose VM ports hold an
// address of each. Each IPv4 block is routed via its node's IPv4
// address and each IPv6 block via its IPv6 one, and both pairs are on the
// node's one port. The port's pair budget is one for both families: with
// one pair allowed, each node keeps its older (IPv4) block routed and
// its IPv6 block's route and pair go, nothing half applied.
func TestRoutedIPv6BlocksRealNeutron(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ep := realNeutron{}.ep()
	netID := newNetwork(t, ep)
	v4 := ep.AddSubnet(t, netID, "10.207.0.0/24", 100)
	v6 := ep.AddSubnet(t, netID, "fd00:207::/64", 100)
	r, err := routers.Create(c, nc, routers.CreateOpts{Name: "vpcni-test-routes-v6"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the network goes: its interfaces are ports of it
		c := context.Background()
		_, _ = routers.Update(c, nc, r.ID, routers.UpdateOpts{Routes: &[]routers.Route{}}).Extract()
		for _, sn := range []string{v4.ID, v6.ID} {
			_, _ = routers.RemoveInterface(c, nc, r.ID, routers.RemoveInterfaceOpts{SubnetID: sn}).Extract()
		}
		if err := routers.Delete(c, nc, r.ID).ExtractErr(); err != nil {
			t.Errorf("delete router: %v", err)
		}
	})
	for _, sn := range []string{v4.ID, v6.ID} {
		if _, err := routers.AddInterface(c, nc, r.ID, routers.AddInterfaceOpts{SubnetID: sn}).Extract(); err != nil {
			t.Fatalf("router interface on subnet %s: %v", sn, err)
		}
	}
	var blocks []routes.Block
	var portIDs []string
	for i := range 2 {
		ip4 := netip.MustParseAddr(fmt.Sprintf("10.207.0.%d", 11+i))
		ip6 := netip.MustParseAddr(fmt.Sprintf("fd00:207::%d", 11+i))
		p, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: netID, Name: fmt.Sprintf("vm-routes-v6-%d", i), DeviceOwner: "compute:vpcni-test",
			FixedIPs: []ports.IP{{SubnetID: v4.ID, IPAddress: ip4.String()}, {SubnetID: v6.ID, IPAddress: ip6.String()}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		portIDs = append(portIDs, p.ID)
		node := fmt.Sprintf("n%d", i+1)
		blocks = append(blocks,
			routes.Block{Name: node + "-v4", CIDR: netip.MustParsePrefix(fmt.Sprintf("10.208.%d.0/26", i)), Node: node, NodeIP: ip4, Created: time.Unix(int64(2*i), 0)},
			routes.Block{Name: node + "-v6", CIDR: netip.MustParsePrefix(fmt.Sprintf("fd00:208:0:0:%d::/80", i)), Node: node, NodeIP: ip6, Created: time.Unix(int64(2*i+1), 0)})
	}
	ranges := []netip.Prefix{netip.MustParsePrefix("10.208.0.0/16"), netip.MustParsePrefix("fd00:208::/64")}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sync := func(maxPairs int) routes.Result {
		t.Helper()
		rec, err := routes.New(cluster.NewRoutes(nc, r.ID, v4.ID, 10), routes.Options{Ranges: ranges, MaxRoutes: 30, MaxPairs: maxPairs}, log)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rec.Sync(c, blocks)
		if err != nil {
			t.Fatalf("sync (max pairs %d): %v", maxPairs, err)
		}
		return res
	}
	// check: the router's routes and each port's pairs are exactly those
	// of the blocks routed, each via its node's address of its family.
	check := func(res routes.Result, routed ...string) {
		t.Helper()
		rt, err := routers.Get(c, nc, r.ID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		hops := map[string]string{}
		for _, x := range rt.Routes {
			hops[x.DestinationCIDR] = x.NextHop
		}
		for i, b := range blocks {
			p, err := ports.Get(c, nc, portIDs[i/2]).Extract()
			if err != nil {
				t.Fatal(err)
			}
			paired := slices.ContainsFunc(p.AllowedAddressPairs, func(ap ports.AddressPair) bool { return ap.IPAddress == b.CIDR.String() })
			hop, has := hops[b.CIDR.String()]
			want := slices.Contains(routed, b.Name)
			if has != want || paired != want || has && hop != b.NodeIP.String() || (res.States[b.Name] == routes.Routed) != want {
				t.Errorf("block %s (%s): route %v via %q, pair %v, state %s; want routed %v via %s", b.Name, b.CIDR, has, hop, paired, res.States[b.Name], want, b.NodeIP)
			}
		}
		if len(hops) != len(routed) {
			t.Errorf("router routes %v, want %d", hops, len(routed))
		}
	}
	res := sync(10)
	check(res, "n1-v4", "n1-v6", "n2-v4", "n2-v6")
	t.Logf("vpcni-test: dual-stack routes: %d routed, router %v", res.Routes, res.States)
	res = sync(1)
	check(res, "n1-v4", "n2-v4")
	if res.States["n1-v6"] != routes.NoPairBudget || !strings.Contains(res.Messages["n1-v6"], "no room for the pair fd00:208::/80") {
		t.Errorf("IPv6 block of a port with no pair room: %s, %q", res.States["n1-v6"], res.Messages["n1-v6"])
	}
	check(sync(10), "n1-v4", "n1-v6", "n2-v4", "n2-v6") // room again: routed again
}
