package blocks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/routes"
)

// The routed pod subnet against the API server and the lab's Neutron
// endpoint (the API alone, on loopback): 40 nodes each ask for a block
// (the BlockAssigner gives them), the RouteReconciler routes 30 on a
// router with max_routes 30 and reports the other 10 — condition, Event,
// metric, each with the fix — with nothing half applied; the limit raised,
// the rest appear; a route and a pair removed by hand come back; a deleted
// node's route and pair stay while its block lives and go once it is
// reclaimed.
func TestRoutedBlocksWithinTheRouterBudget(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the reconcilers stopped
	ctx := context.Background()
	const nodes = 40
	srv := neutronapi.New() // MaxRoutes 30, MaxPairs 10: Neutron's defaults
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	nc := openstack.NoAuthClient("http://"+ln.Addr().String(), http.Client{Timeout: 10 * time.Second})
	const podRange = "10.91.0.0/16"
	bed, err := cluster.NewRouteBed(ctx, nc, "k8s", nodes, netip.MustParsePrefix("10.90.0.0/24"), netip.MustParsePrefix(podRange), 26, false)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes: bed node i's VM port holds 10.90.0.(11+i).
	cs := clientset(t)
	nodeName := func(i int) string { return fmt.Sprintf("routed-%d", i+1) }
	for i := range nodes {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i),
			Annotations: map[string]string{v1alpha1.AnnotationBlocksWanted: "1"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: bed.Blocks[i].NodeIP.String()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const grace = 2 * time.Second
	assigner(t, podRange, 26, grace)
	// max_routes not configured: learned from Neutron, and tried again
	// every second while blocks wait (one atomic add that changes nothing
	// when refused).
	rec, err := routes.New(bed.Routes(), routes.Options{Ranges: []netip.Prefix{netip.MustParsePrefix(podRange)}, MaxPairs: 10, Probe: time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := controller.NewRouteReconciler(fixture.Config, rec, controller.RouteOptions{Resync: 500 * time.Millisecond}, logger)
	if err != nil {
		t.Fatal(err)
	}
	metrics := &controller.RouteMetrics{}
	metrics.Set(rr)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rr.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("route reconciler: %v", err)
		}
	})

	// state reads the router and the ports: block -> next hop, node IP -> pairs.
	state := func() (map[string]string, map[string][]string) {
		srv.Lock()
		defer srv.Unlock()
		rts, prs := map[string]string{}, map[string][]string{}
		for _, r := range srv.Routers() {
			if r.ID == bed.RouterID {
				for _, rt := range r.Routes {
					rts[rt.Destination] = rt.NextHop
				}
			}
		}
		for _, p := range srv.Ports() {
			for _, ap := range p.Pairs {
				prs[p.FixedIPs[0].IPAddress] = append(prs[p.FixedIPs[0].IPAddress], ap.IPAddress)
			}
		}
		return rts, prs
	}
	// settled: routed blocks have route and pair, the others neither, and
	// the Routed conditions say the same; returns the NodeBlocks by state.
	settled := func(wantRouted int) (map[string][]v1alpha1.NodeBlock, error) {
		_, items := nodeBlocks(t)
		rts, prs := state()
		by := map[string][]v1alpha1.NodeBlock{}
		for _, nb := range items {
			c := meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionRouted)
			if c == nil {
				return nil, fmt.Errorf("%s has no Routed condition yet", nb.Name)
			}
			by[c.Reason] = append(by[c.Reason], nb)
			hop, routed := rts[nb.Spec.CIDR]
			node, err := cs.CoreV1().Nodes().Get(ctx, nb.Spec.Node, metav1.GetOptions{})
			ip := ""
			if err == nil {
				ip = node.Status.Addresses[0].Address
			} else {
				ip = hop
			}
			paired := strings.Contains(strings.Join(prs[ip], " ")+" ", nb.Spec.CIDR+" ")
			if routed != paired || routed && hop != ip {
				return nil, fmt.Errorf("%s half applied: route %v (via %s), pair on %s %v", nb.Name, routed, hop, ip, paired)
			}
			if routed != (c.Status == metav1.ConditionTrue) && c.Reason != string(routes.NodeGone) {
				return nil, fmt.Errorf("%s: route %v but condition %s %s", nb.Name, routed, c.Status, c.Reason)
			}
		}
		if len(rts) != wantRouted || len(by[string(routes.Routed)]) != wantRouted {
			return nil, fmt.Errorf("%d routes, %d blocks Routed; want %d", len(rts), len(by[string(routes.Routed)]), wantRouted)
		}
		return by, nil
	}

	t0 := time.Now()
	var by map[string][]v1alpha1.NodeBlock
	waitFor(t, 30*time.Second, "30 blocks routed, 10 reported", func() (err error) {
		by, err = settled(30)
		if err == nil && len(by[string(routes.NoRouteBudget)]) != 10 {
			err = fmt.Errorf("%d blocks report the budget", len(by[string(routes.NoRouteBudget)]))
		}
		if err == nil {
			// A block that began waiting while fewer nodes asked keeps the
			// figure of that pass until the next one rewrites it.
			c := meta.FindStatusCondition(by[string(routes.NoRouteBudget)][0].Status.Conditions, v1alpha1.ConditionRouted)
			if c == nil || !strings.Contains(c.Message, "raise max_routes to 40") {
				err = fmt.Errorf("a waiting block's condition does not say max_routes 40 yet: %v", c)
			}
		}
		return err
	})
	t.Logf("40 nodes' blocks: 30 routed, 10 reported in %s", time.Since(t0).Round(time.Millisecond))
	waiting := by[string(routes.NoRouteBudget)][0]
	waitFor(t, 10*time.Second, "a Warning Event on the node of a waiting block", func() error {
		return nodeEvent(t, waiting.Spec.Node, controller.EventRouteBudget, "raise max_routes to 40")
	})
	metric := func(name, label string) (float64, string) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if label == "" || l.GetValue() == label {
						return m.GetGauge().GetValue(), l.GetValue()
					}
				}
				if label == "" {
					return m.GetGauge().GetValue(), ""
				}
			}
		}
		return -1, ""
	}
	if v, fix := metric("vpcni_controller_route_shortfall", ""); v != 10 || !strings.Contains(fix, "raise max_routes to 40") {
		t.Errorf("vpcni_controller_route_shortfall %v {fix=%q}", v, fix)
	}
	if v, _ := metric("vpcni_controller_router_max_routes", ""); v != 30 {
		t.Errorf("vpcni_controller_router_max_routes %v, want the learned 30", v)
	}

	// The limit raised: the next try finds it, the rest appear.
	srv.Lock()
	srv.MaxRoutes = 40
	srv.Unlock()
	waitFor(t, 30*time.Second, "all 40 blocks routed", func() error { _, err := settled(40); return err })
	waitFor(t, 10*time.Second, "a Normal Event on the node whose block got its route", func() error {
		return nodeEvent(t, waiting.Spec.Node, controller.EventBlockRouted, "route "+waiting.Spec.CIDR)
	})

	// By hand: a route and a pair removed.
	rts, _ := state()
	_, items := nodeBlocks(t)
	victim, other := items[3], items[7]
	if _, err := extraroutes.Remove(ctx, nc, bed.RouterID, extraroutes.Opts{Routes: &[]routers.Route{{DestinationCIDR: victim.Spec.CIDR, NextHop: rts[victim.Spec.CIDR]}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	otherPort := bed.Ports[nodeIndex(t, other.Spec.Node)]
	if _, err := ports.Update(ctx, nc, otherPort, ports.UpdateOpts{AllowedAddressPairs: &[]ports.AddressPair{}}).Extract(); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	waitFor(t, 10*time.Second, "the route and the pair removed by hand restored", func() error { _, err := settled(40); return err })
	t.Logf("route and pair removed by hand restored in %s", time.Since(t0).Round(time.Millisecond))

	// A node deleted: its route and pair stay until its block is reclaimed
	// (after the grace, no PodAddress using it), then go.
	gone := items[5]
	deleteNode(t, gone.Spec.Node)
	waitFor(t, 10*time.Second, "the gone node's block says NodeGone and keeps its route", func() error {
		nb, err := nodeblocksGet(t, gone.Name)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionRouted)
		if c == nil || c.Reason != string(routes.NodeGone) {
			return fmt.Errorf("condition %+v", c)
		}
		rts, _ := state()
		if _, ok := rts[gone.Spec.CIDR]; !ok {
			return fmt.Errorf("route of %s gone before its block was reclaimed", gone.Spec.CIDR)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "the reclaimed block's route and pair gone", func() error {
		if _, err := nodeblocksGet(t, gone.Name); err == nil {
			return fmt.Errorf("%s not reclaimed yet", gone.Name)
		}
		rts, prs := state()
		if hop, ok := rts[gone.Spec.CIDR]; ok {
			return fmt.Errorf("route %s via %s still there", gone.Spec.CIDR, hop)
		}
		for ip, ps := range prs {
			if strings.Contains(strings.Join(ps, " "), gone.Spec.CIDR) {
				return fmt.Errorf("pair %s still on the port of %s", gone.Spec.CIDR, ip)
			}
		}
		_, err := settled(39)
		return err
	})
}

func nodeIndex(t *testing.T, node string) int {
	var i int
	if _, err := fmt.Sscanf(node, "routed-%d", &i); err != nil {
		t.Fatal(err)
	}
	return i - 1
}

func nodeblocksGet(t *testing.T, name string) (*v1alpha1.NodeBlock, error) {
	_, items := nodeBlocks(t)
	for _, nb := range items {
		if nb.Name == name {
			return &nb, nil
		}
	}
	return nil, fmt.Errorf("NodeBlock %s not found", name)
}

// The vpcni-controller binary with -cloud-config (a noauth endpoint: the
// lab's, on loopback), as its service account: 3 nodes' blocks on a
// router with max_routes 2 give 2 routes and 1 report, on /metrics with
// the fix, and no request is forbidden by deploy/rbac.yaml.
func TestControllerBinaryRoutes(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) })
	applyDeploy(t)
	ctx := context.Background()
	srv := neutronapi.New()
	srv.MaxRoutes = 2
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	url := "http://" + ln.Addr().String() + "/"
	bed, err := cluster.NewRouteBed(ctx, openstack.NoAuthClient(url, http.Client{Timeout: 10 * time.Second}), "bin", 3,
		netip.MustParsePrefix("10.90.0.0/24"), netip.MustParsePrefix("10.92.0.0/16"), 26, false)
	if err != nil {
		t.Fatal(err)
	}
	cs := clientset(t)
	for i := range 3 {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bin-%d", i+1),
			Annotations: map[string]string{v1alpha1.AnnotationBlocksWanted: "1"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: bed.Blocks[i].NodeIP.String()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cloud := filepath.Join(t.TempDir(), "cloud.yaml")
	if err := os.WriteFile(cloud, []byte(fmt.Sprintf("openstack:\n  endpoint: %s\n  subnetID: %s\nroutes:\n  routerID: %s\n  resync: 1s\n",
		url, bed.SubnetID, bed.RouterID)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "vpcni-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/vpcni/vpcni/cmd/vpcni-controller").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	c := startController(t, bin, kubeconfigAs(t, "vpcni-controller"), "routes-1", "-block-ranges", "10.92.0.0/16", "-block-size", "26",
		"-cloud-config", cloud, "-health-addr", "127.0.0.1:29699")
	waitFor(t, 30*time.Second, "2 routes and 1 report on /metrics", func() error {
		return metricsSay("127.0.0.1:29699", `vpcni_controller_router_routes{owner="vpcni"} 2`, `vpcni_controller_route_blocks{state="RouteBudgetExhausted"} 1`,
			`vpcni_controller_router_max_routes 2`, `vpcni_controller_route_max_routes_needed 3`)
	})
	// One block per node: no block size helps, and the fix says so.
	if err := metricsSay("127.0.0.1:29699", `vpcni_controller_route_shortfall{fix="raise max_routes to 3 (neutron.conf; now 2, 0 of them others'): each of the 3 nodes needs a route of its own, so no block size fits them in 2"} 1`); err != nil {
		t.Error(err)
	}
	if strings.Contains(c.Output(), "forbidden") {
		t.Errorf("a request was forbidden by RBAC:\n%s", c.Output())
	}
}
