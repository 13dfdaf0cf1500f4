package blocks

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
)

// The namespaces of the three-node test: a segment and nodes, all
// vpcni-blk-…, removed before (a crashed run's) and after.
const (
	nsPrefix = "vpcni-blk"
	segment  = "10.41.0.0/24"
	runDir   = "/run/vpcni-testbed/" + nsPrefix
)

func segNS() string         { return nsPrefix + "-seg" }
func nodeNS(i int) string   { return fmt.Sprintf("%s-n%d", nsPrefix, i) }
func podNS(i, j int) string { return fmt.Sprintf("%s-n%d-p%d", nsPrefix, i, j) }
func nodeIP(i int) string   { return fmt.Sprintf("10.41.0.%d", 10+i) }
func legacyNS() string      { return nsPrefix + "-legacy" }

const legacyIP = "10.41.0.200"

func downNamespaces() error {
	err := testbed.StopRecorded(runDir)
	for _, ns := range netnsutil.List(nsPrefix + "-") {
		if e := netnsutil.Delete(ns); e != nil && err == nil {
			err = e
		}
	}
	if e := os.RemoveAll(runDir); e != nil && err == nil {
		err = e
	}
	return err
}

// segmentUp builds an L2 segment (a bridge, gateway .1), a legacy host on
// it (.200) and n nodes (.11, .12, …), each able to reach the API server fixture on its own
// loopback (a forwarder, nothing added to the root namespace).
func segmentUp(t *testing.T, n int) {
	t.Helper()
	if err := downNamespaces(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := downNamespaces(); err != nil {
			t.Error(err)
		}
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(runDir, 0o700))
	must(netnsutil.Add(segNS()))
	for _, c := range [][]string{{"ip", "link", "add", "br0", "type", "bridge"}, {"ip", "link", "set", "br0", "up"},
		{"ip", "addr", "add", "10.41.0.1/24", "dev", "br0"}} {
		must(netnsutil.Exec(segNS(), c...))
	}
	// A host on the segment outside the cluster (a legacy VM or server).
	must(netnsutil.Add(legacyNS()))
	must(netnsutil.VethBetween(segNS(), "legacy", legacyNS(), "eth0", nil))
	must(netnsutil.Exec(segNS(), "ip", "link", "set", "legacy", "master", "br0", "up"))
	for _, c := range [][]string{{"ip", "addr", "add", legacyIP + "/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}} {
		must(netnsutil.Exec(legacyNS(), c...))
	}
	for i := 1; i <= n; i++ {
		ns, port := nodeNS(i), fmt.Sprintf("n%d", i)
		must(netnsutil.Add(ns))
		must(netnsutil.VethBetween(segNS(), port, ns, "eth0", nil))
		must(netnsutil.Exec(segNS(), "ip", "link", "set", port, "master", "br0", "up"))
		for _, c := range [][]string{{"ip", "addr", "add", nodeIP(i) + "/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"},
			{"ip", "link", "set", "lo", "up"}, {"ip", "route", "add", "default", "via", "10.41.0.1"}} {
			must(netnsutil.Exec(ns, c...))
		}
		hostPort := strings.TrimPrefix(fixture.URL, "https://")
		l, err := testbed.Forward(ns, hostPort, hostPort)
		must(err)
		t.Cleanup(func() { l.Close() })
	}
}

// Three real vpcnid processes, each in a node namespace of its own, all
// with the SAME configuration (only the node name differs, as the
// DaemonSet's downward API gives it), running as vpcni-agent's service
// account: the CNI plugin wires two pods on each node through libcni; the
// pods' addresses come from their node's block only, the blocks are
// disjoint, every pod reaches every pod on the other nodes, and a host on
// the segment outside the cluster reaches every pod.
func TestThreeVpcnidNodesOneConfig(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) })
	applyDeploy(t)
	bin, err := testbed.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	const nodes, pods = 3, 2
	segmentUp(t, nodes)
	assigner(t, segment, 28, time.Minute)
	kc := kubeconfigAs(t, "vpcni-agent")
	dir := t.TempDir()
	// The one configuration: the segment's range, the nodes' own
	// addresses (.8-.15) and the legacy host's excluded, blocks on.
	shared := func(node string) config.Config {
		cfg := config.Defaults()
		cfg.NodeName = node
		cfg.SocketPath = filepath.Join(dir, node, "vpcnid.sock")
		cfg.StateDir = filepath.Join(dir, node, "state")
		cfg.Kubernetes = config.Kubernetes{Mode: "on", Kubeconfig: kc}
		cfg.Pool.WarmTarget, cfg.Pool.BatchSize = 2, 2
		cfg.Provider = config.Provider{Type: "static", Settings: &static.Config{
			Ranges: []static.Range{{CIDR: segment, Gateway: "10.41.0.1", Exclude: []string{"10.41.0.8/29", legacyIP}}},
			Blocks: &static.Blocks{Wait: "10s"}}}
		return cfg
	}
	addrs := map[string][]netip.Addr{}
	var echo []string
	var agents []*testbed.Agent
	t0 := time.Now()
	for i := 1; i <= nodes; i++ {
		createNode(t, nodeNS(i))
		a, err := testbed.StartAgentIn(runDir, nodeNS(i), bin, shared(nodeNS(i)))
		agents = append(agents, a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			a := agents[i-1] // the one running at the end (restarted below)
			if t.Failed() {
				log, _ := os.ReadFile(a.LogPath)
				t.Logf("%s's vpcnid log:\n%s", nodeNS(i), log)
			}
			_ = a.Stop()
		})
		cni, err := newCNI(nodeNS(i), bin, dir, a)
		if err != nil {
			t.Fatal(err)
		}
		for j := 1; j <= pods; j++ {
			if err := netnsutil.Add(podNS(i, j)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := cni.Add(ctx, testbed.Runtime(fmt.Sprintf("c-%d-%d", i, j), netnsutil.Path(podNS(i, j)), "eth0", nil))
			cancel()
			if err != nil {
				t.Fatalf("ADD on %s: %v", nodeNS(i), err)
			}
			addr := podAddr(t, res)
			addrs[nodeNS(i)] = append(addrs[nodeNS(i)], addr)
			srv, err := netnsutil.ServeEcho(netnsutil.Path(podNS(i, j)), addr.String()+":7007")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			echo = append(echo, addr.String())
		}
	}
	t.Logf("3 vpcnid nodes, 6 pods wired in %s: %v", time.Since(t0).Round(time.Millisecond), addrs)
	byNode, items := nodeBlocks(t)
	disjoint(t, items)
	for node, as := range addrs {
		if len(byNode[node]) == 0 {
			t.Errorf("%s has no block: %v", node, byNode)
		}
		for _, a := range as {
			if !inBlocks(byNode[node], a) {
				t.Errorf("%s's pod has %s, outside its blocks %v", node, a, byNode[node])
			}
		}
	}
	// Every pod reaches every pod on the other nodes across the segment
	// (the nodes answer ARP for their pods).
	for i := 1; i <= nodes; i++ {
		for j := 1; j <= pods; j++ {
			for k, dst := range echo {
				if k/pods == i-1 {
					continue // same node: not what blocks are about
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := netnsutil.Probe(ctx, netnsutil.Path(podNS(i, j)), dst+":7007")
				cancel()
				if err != nil {
					t.Errorf("%s → %s: %v", podNS(i, j), dst, err)
				}
			}
		}
	}

	// And a host outside the cluster reaches every pod directly.
	for _, dst := range echo {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := netnsutil.Probe(ctx, netnsutil.Path(legacyNS()), dst+":7007")
		cancel()
		if err != nil {
			t.Errorf("legacy host → %s: %v", dst, err)
		}
	}

	// A restarted agent finds its blocks again before it looks at what
	// it holds: nothing is dropped as "outside its blocks", its pods keep
	// their addresses, and a new pod gets one from its block.
	before := poolOf(t, agents[0])
	if err := agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	a, err := testbed.StartAgentIn(runDir, nodeNS(1), bin, shared(nodeNS(1)))
	if err != nil {
		t.Fatal(err)
	}
	agents[0] = a
	waitFor(t, 10*time.Second, "the restarted agent holds what it held", func() error {
		after := poolOf(t, a)
		for _, state := range []string{"allocated", "free"} {
			if !slices.Equal(after[state], before[state]) {
				return fmt.Errorf("%s: %v, before the restart %v", state, after[state], before[state])
			}
		}
		return nil
	})
	cni, err := newCNI(nodeNS(1), bin, dir, a)
	if err != nil {
		t.Fatal(err)
	}
	if err := netnsutil.Add(podNS(1, 3)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := cni.Add(ctx, testbed.Runtime("c-1-3", netnsutil.Path(podNS(1, 3)), "eth0", nil))
	cancel()
	if err != nil {
		t.Fatalf("ADD after the restart: %v", err)
	}
	if addr := podAddr(t, res); !inBlocks(byNode[nodeNS(1)], addr) || slices.Contains(addrs[nodeNS(1)], addr) {
		t.Errorf("the new pod got %s: not a fresh address of the node's blocks %v", addr, byNode[nodeNS(1)])
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := netnsutil.Probe(ctx, netnsutil.Path(podNS(1, 3)), echo[pods]+":7007"); err != nil {
		t.Errorf("the new pod → %s on node 2: %v", echo[pods], err)
	}
}

func newCNI(ns, bin, dir string, a *testbed.Agent) (*testbed.CNI, error) {
	return testbed.NewCNIIn(ns, []string{bin}, filepath.Join(dir, ns, "cni-cache"), testbed.VpcniConfList("1.1.0", "vpcni", a.Config.SocketPath))
}

// poolOf is every address the node's agent holds, by state.
func poolOf(t *testing.T, a *testbed.Agent) map[string][]string {
	t.Helper()
	st, err := a.State()
	if err != nil {
		t.Fatal(err)
	}
	return st.Pool.Addresses
}

func podAddr(t *testing.T, res types.Result) netip.Addr {
	t.Helper()
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.IPs) != 1 {
		t.Fatalf("result IPs %v", r.IPs)
	}
	a, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	return a
}
