// The reconciler over Neutron's door (internal/provider/openstack/cluster)
// against the lab's Neutron endpoint: what a real router and ports end up
// holding.
package routes_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/routes"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// labBed serves the lab's Neutron endpoint on loopback (no namespaces:
// the API alone) and builds a bed of n nodes on it. refused counts the
// endpoint's 4xx answers to route writes.
type labBed struct {
	*cluster.RouteBed
	srv     *neutronapi.Server
	mu      sync.Mutex
	refused []string
}

func newLabBed(t *testing.T, nodes int) *labBed {
	t.Helper()
	lb := &labBed{srv: neutronapi.New()}
	h := lb.srv.Handler()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		h.ServeHTTP(rec, r)
		if strings.Contains(r.URL.Path, "extraroutes") && rec.status >= 400 {
			lb.mu.Lock()
			lb.refused = append(lb.refused, r.URL.Path)
			lb.mu.Unlock()
		}
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	nc := openstack.NoAuthClient("http://"+ln.Addr().String(), http.Client{Timeout: 10 * time.Second})
	b, err := cluster.NewRouteBed(context.Background(), nc, "bed", nodes, netip.MustParsePrefix("10.90.0.0/24"), netip.MustParsePrefix("10.91.0.0/16"), 26, false)
	if err != nil {
		t.Fatal(err)
	}
	lb.RouteBed = b
	return lb
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(c int) { s.status = c; s.ResponseWriter.WriteHeader(c) }

func (lb *labBed) refusals() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return len(lb.refused)
}

// reconciler finds the ports by listing the VM subnet's; with maxRoutes 0
// (learned) by one lookup per node address instead, so both ways are run.
// now is its clock (nil: time.Now).
func (lb *labBed) reconciler(t *testing.T, maxRoutes int, probe time.Duration, now func() time.Time) *routes.Reconciler {
	t.Helper()
	nt := lb.Routes()
	if maxRoutes == 0 {
		nt = cluster.NewRoutes(lb.NC, lb.RouterID, "", 10)
	}
	r, err := routes.New(nt, routes.Options{Ranges: lb.Ranges, MaxRoutes: maxRoutes, Probe: probe, Now: now}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// state reads what the endpoint holds: route destination -> next hop,
// and each node's pairs.
func (lb *labBed) state() (map[string]string, map[string][]string) {
	lb.srv.Lock()
	defer lb.srv.Unlock()
	onRouter := map[string]string{}
	for _, r := range lb.srv.Routers() {
		if r.ID == lb.RouterID {
			for _, rt := range r.Routes {
				onRouter[rt.Destination] = rt.NextHop
			}
		}
	}
	pairs := map[string][]string{}
	for _, p := range lb.srv.Ports() {
		for i, id := range lb.Ports {
			if id == p.ID {
				for _, ap := range p.Pairs {
					pairs[lb.Blocks[i].Node] = append(pairs[lb.Blocks[i].Node], ap.IPAddress)
				}
			}
		}
	}
	return onRouter, pairs
}

// checkWhole: every block is routed and paired on its node, or neither;
// exactly the blocks Routed are.
func (lb *labBed) checkWhole(t *testing.T, res routes.Result, blocks []routes.Block) (routed int) {
	t.Helper()
	onRouter, pairs := lb.state()
	for _, b := range blocks {
		hop, hasRoute := onRouter[b.CIDR.String()]
		hasPair := false
		for _, p := range pairs[b.Node] {
			hasPair = hasPair || p == b.CIDR.String()
		}
		if hasRoute != hasPair {
			t.Errorf("block %s of %s half applied: route %v, pair %v", b.CIDR, b.Node, hasRoute, hasPair)
		}
		if hasRoute && hop != b.NodeIP.String() {
			t.Errorf("block %s routed via %s, its node is %s", b.CIDR, hop, b.NodeIP)
		}
		if (res.States[b.Name] == routes.Routed) != hasRoute {
			t.Errorf("block %s: state %s, route on the router %v", b.CIDR, res.States[b.Name], hasRoute)
		}
		if hasRoute {
			routed++
		}
	}
	return routed
}

func count(res routes.Result, st routes.State) int {
	n := 0
	for _, s := range res.States {
		if s == st {
			n++
		}
	}
	return n
}

// 40 nodes' blocks on a router with max_routes 30: 30 routes, 10 blocks
// reported with the fix, nothing half applied; with the limit configured
// no request is refused, learning it costs exactly one refused (atomic)
// add; raising it brings the rest.
func TestBudget(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []struct {
		name      string
		maxRoutes int
		refused   int
	}{{"configured", 30, 0}, {"learned", 0, 1}} {
		t.Run(mode.name, func(t *testing.T) {
			lb := newLabBed(t, 40)
			clock := time.Now()
			r := lb.reconciler(t, mode.maxRoutes, time.Hour, func() time.Time { return clock })
			res, err := r.Sync(ctx, lb.Blocks)
			if err != nil {
				t.Fatal(err)
			}
			if n := lb.checkWhole(t, res, lb.Blocks); n != 30 || res.Routes != 30 || count(res, routes.NoRouteBudget) != 10 || res.Waiting != 10 {
				t.Fatalf("routed %d (result %d), waiting %d/%d; want 30 and 10", n, res.Routes, count(res, routes.NoRouteBudget), res.Waiting)
			}
			// The oldest blocks got the budget.
			for _, b := range lb.Blocks[:30] {
				if res.States[b.Name] != routes.Routed {
					t.Errorf("older block %s not routed: %s", b.Name, res.States[b.Name])
				}
			}
			if res.Needed != 40 || !strings.Contains(res.Fix, "raise max_routes to 40") {
				t.Errorf("fix %q (needed %d)", res.Fix, res.Needed)
			}
			if msg := res.Messages[lb.Blocks[35].Name]; !strings.Contains(msg, "raise max_routes to 40") {
				t.Errorf("message of a waiting block: %q", msg)
			}
			if got := lb.refusals(); got != mode.refused {
				t.Errorf("%d route writes refused, want %d (%v)", got, mode.refused, lb.refused)
			}
			// Steady: a second pass sends no route write that fails.
			before := lb.refusals()
			if _, err := r.Sync(ctx, lb.Blocks); err != nil {
				t.Fatal(err)
			}
			if lb.refusals() != before {
				t.Error("a pass over a full router sent a request that failed")
			}

			lb.srv.Lock()
			lb.srv.MaxRoutes = 40
			lb.srv.Unlock()
			if mode.maxRoutes > 0 {
				r = lb.reconciler(t, 40, time.Hour, nil) // the operator raises both
			} else {
				clock = clock.Add(time.Hour + time.Second) // the learned limit is tried again
			}
			res, err = r.Sync(ctx, lb.Blocks)
			if err != nil {
				t.Fatal(err)
			}
			if n := lb.checkWhole(t, res, lb.Blocks); n != 40 || res.Waiting != 0 || res.Fix != "" {
				t.Fatalf("after raising the limit: %d routed, %d waiting (%q)", n, res.Waiting, res.Fix)
			}
		})
	}
}

// A route and a pair removed by hand come back; a reclaimed block's route
// and pair go; a gone node's stay until its block is reclaimed; routes and
// pairs of others are counted and never touched.
func TestDriftAndStale(t *testing.T) {
	ctx := context.Background()
	lb := newLabBed(t, 3)
	// Others' route and 8 pairs on n1's port: n1 has room for 2 of ours.
	foreign := netip.MustParsePrefix("192.168.7.0/24")
	if _, err := extraroutes.Add(ctx, lb.NC, lb.RouterID, extraroutes.Opts{Routes: &[]routers.Route{{DestinationCIDR: foreign.String(), NextHop: "10.90.0.12"}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	var others []ports.AddressPair
	for i := range 8 {
		others = append(others, ports.AddressPair{IPAddress: netip.AddrFrom4([4]byte{10, 90, 0, byte(100 + i)}).String()})
	}
	if _, err := ports.Update(ctx, lb.NC, lb.Ports[0], ports.UpdateOpts{AllowedAddressPairs: &others}).Extract(); err != nil {
		t.Fatal(err)
	}
	blocks := append([]routes.Block{}, lb.Blocks...)
	// n1 gets two more blocks: the third does not fit its port.
	for i, c := range []string{"10.91.1.0/26", "10.91.1.64/26"} {
		blocks = append(blocks, routes.Block{Name: "extra" + c, CIDR: netip.MustParsePrefix(c), Node: "n1", NodeIP: lb.Blocks[0].NodeIP, Created: time.Unix(int64(100+i), 0)})
	}
	r := lb.reconciler(t, 0, time.Hour, nil)
	res, err := r.Sync(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	lb.checkWhole(t, res, blocks)
	if res.States["extra10.91.1.64/26"] != routes.NoPairBudget || res.Others != 1 || res.Routes != 4 {
		t.Fatalf("states %v, others %d, ours %d", res.States, res.Others, res.Routes)
	}
	if !strings.Contains(res.Messages["extra10.91.1.64/26"], "max_allowed_address_pair 10") {
		t.Errorf("message: %q", res.Messages["extra10.91.1.64/26"])
	}
	// By hand: n2's route and n3's pair go.
	if _, err := extraroutes.Remove(ctx, lb.NC, lb.RouterID, extraroutes.Opts{Routes: &[]routers.Route{{DestinationCIDR: lb.Blocks[1].CIDR.String(), NextHop: lb.Blocks[1].NodeIP.String()}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if _, err := ports.Update(ctx, lb.NC, lb.Ports[2], ports.UpdateOpts{AllowedAddressPairs: &[]ports.AddressPair{}}).Extract(); err != nil {
		t.Fatal(err)
	}
	res, err = r.Sync(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	if n := lb.checkWhole(t, res, blocks); n != 4 {
		t.Fatalf("after repair %d routed, want 4", n)
	}
	// n3 gone: kept. Then its block reclaimed: route and pair go.
	blocks[2].NodeGone = true
	res, err = r.Sync(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	onRouter, pairs := lb.state()
	if onRouter[lb.Blocks[2].CIDR.String()] == "" || len(pairs["n3"]) != 1 || res.States[blocks[2].Name] != routes.NodeGone {
		t.Fatalf("a gone node's block lost its route or pair before it was reclaimed: %v %v", onRouter, pairs)
	}
	blocks = append(blocks[:2], blocks[3:]...)
	if _, err := r.Sync(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	onRouter, pairs = lb.state()
	if _, ok := onRouter[lb.Blocks[2].CIDR.String()]; ok || len(pairs["n3"]) != 0 {
		t.Fatalf("a reclaimed block kept its route or pair: %v %v", onRouter, pairs)
	}
	if onRouter[foreign.String()] != "10.90.0.12" || len(pairs["n1"]) != 10 {
		t.Fatalf("others' route or pairs touched: %v, n1 pairs %v", onRouter, pairs["n1"])
	}
}
