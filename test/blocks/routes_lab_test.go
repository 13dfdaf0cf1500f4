package blocks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/routes"
	"github.com/vpcni/vpcni/internal/testbed"
)

// The whole routed pod subnet on the lab (an OpenStack-style VPC: VM ports
// with port security, a router namespace driven by the lab's Neutron
// endpoint): two lab nodes run vpcnid in the static provider's blocks mode
// over a pod range of its own (10.77.0.0/24, not the VMs' 10.90.0.0/24),
// the BlockAssigner gives each a block, and the RouteReconciler puts each
// block's route on the router and its pair on the node's VM port. The
// legacy VM, outside the cluster, then reaches every pod through the
// router; each block's NodeBlock says Routed.
func TestRoutedPodSubnetOnTheLab(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) })
	applyDeploy(t)
	bin, err := testbed.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const prefix, podRange = "vpcni-blkrt", "10.77.0.0/24"
	l, err := lab.Up(ctx, lab.Config{Prefix: prefix, Nodes: 2, Subnet: netip.MustParsePrefix("10.90.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	run := filepath.Join("/run/vpcni-testbed", prefix)
	_ = testbed.StopRecorded(run)
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testbed.StopRecorded(run); _ = os.RemoveAll(run) })
	assigner(t, podRange, 26, time.Minute)
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 10 * time.Second})
	rec, err := routes.New(cluster.NewRoutes(nc, l.RouterID, l.SubnetID, 10), routes.Options{Ranges: []netip.Prefix{netip.MustParsePrefix(podRange)}, MaxPairs: 10}, logger)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := controller.NewRouteReconciler(fixture.Config, rec, controller.RouteOptions{Resync: time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rr.Run(rctx) }()
	t.Cleanup(func() {
		rcancel()
		if err := <-done; err != nil {
			t.Errorf("route reconciler: %v", err)
		}
	})

	kc := kubeconfigAs(t, "vpcni-agent")
	dir := t.TempDir()
	cs := clientset(t)
	var pods []netip.Addr
	for i, h := range l.Nodes {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.NS}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: h.IP.String()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		hostPort := strings.TrimPrefix(fixture.URL, "https://")
		fwd, err := testbed.Forward(h.NS, hostPort, hostPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fwd.Close() })
		cfg := config.Defaults()
		cfg.NodeName = h.NS
		cfg.SocketPath = filepath.Join(dir, h.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(dir, h.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Kubernetes = config.Kubernetes{Mode: "on", Kubeconfig: kc}
		cfg.Pool.WarmTarget, cfg.Pool.BatchSize = 2, 2
		cfg.Provider = config.Provider{Type: "static", Settings: &static.Config{
			Ranges: []static.Range{{CIDR: podRange}}, Blocks: &static.Blocks{Wait: "10s"}}}
		a, err := testbed.StartAgentIn(run, h.NS, bin, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				log, _ := os.ReadFile(a.LogPath)
				t.Logf("%s's vpcnid log:\n%s", h.Name, log)
			}
			_ = a.Stop()
		})
		cni, err := newCNI(h.NS, bin, dir, a)
		if err != nil {
			t.Fatal(err)
		}
		pod := fmt.Sprintf("%s-p%d", prefix, i+1)
		if err := netnsutil.Add(pod); err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := cni.Add(actx, testbed.Runtime(fmt.Sprintf("rt-%d", i+1), netnsutil.Path(pod), "eth0", nil))
		acancel()
		if err != nil {
			t.Fatalf("ADD on %s: %v", h.Name, err)
		}
		addr := podAddr(t, res)
		srv, err := netnsutil.ServeEcho(netnsutil.Path(pod), addr.String()+":7007")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		pods = append(pods, addr)
	}
	byNode, _ := nodeBlocks(t)
	for i, h := range l.Nodes {
		if !inBlocks(byNode[h.NS], pods[i]) {
			t.Fatalf("the pod on %s has %s, outside its blocks %v", h.Name, pods[i], byNode[h.NS])
		}
	}
	t0 := time.Now()
	waitFor(t, 20*time.Second, "the legacy VM reaches every pod through the router", func() error {
		for _, p := range pods {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			err := netnsutil.Probe(pctx, netnsutil.Path(l.Legacy.NS), p.String()+":7007")
			pcancel()
			if err != nil {
				return fmt.Errorf("legacy VM → %s: %w", p, err)
			}
		}
		return nil
	})
	t.Logf("pods %v reached from the legacy VM %s after the second ADD", pods, time.Since(t0).Round(time.Millisecond))
	// The route can carry traffic before the controller has written the
	// Routed condition (its status update follows the router's answer):
	// wait for the condition rather than read it once.
	waitFor(t, 20*time.Second, "every NodeBlock Routed", func() error {
		_, items := nodeBlocks(t)
		for _, nb := range items {
			c := meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionRouted)
			if c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("NodeBlock %s: Routed %+v", nb.Name, c)
			}
		}
		return nil
	})
	// vpcnictl trace on each node, with the controller's cloud file, sees
	// the block's route on the router via that node and its pair on the
	// node's VM port.
	cloudCfg := filepath.Join(dir, "cloud.yaml")
	if err := os.WriteFile(cloudCfg, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n  subnetID: %s\nroutes:\n  routerID: %s\n", l.URL, l.SubnetID, l.RouterID), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, h := range l.Nodes {
		out, err := exec.Command(filepath.Join(bin, "vpcnictl"), "trace", fmt.Sprintf("default/rt-%d", i+1), "--socket", filepath.Join(dir, h.Name, "vpcnid.sock"),
			"--cloud-config", cloudCfg, "-o", "json").CombinedOutput()
		var tr api.Trace
		if jerr := json.Unmarshal(out, &tr); err != nil || jerr != nil || !tr.OK() {
			t.Fatalf("trace of the pod on %s: %v %v\n%s", h.Name, err, jerr, out)
		}
		var route, pair bool
		for _, hop := range tr.Attachments[0].Hops {
			route = route || strings.HasPrefix(hop.What, "router "+l.RouterID+": route ") && strings.HasSuffix(hop.What, " via "+h.IP.String())
			pair = pair || strings.HasPrefix(hop.What, "pair ") && strings.Contains(hop.What, "on the VM port of "+h.IP.String())
		}
		if !route || !pair {
			t.Errorf("trace of the pod on %s lacks the block's route or pair: %+v", h.Name, tr.Attachments[0].Hops)
		}
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}
