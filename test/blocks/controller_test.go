package blocks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/testbed"
)

const namespace = "vpcni-system"

// applyDeploy creates what deploy/namespace.yaml and deploy/rbac.yaml
// hold, as `kubectl apply -k deploy/` would (namespaced objects into
// vpcni-system). Objects already there are left as they are.
func applyDeploy(t *testing.T) {
	t.Helper()
	if err := fixture.Apply(context.Background(), namespace, "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
}

// serviceAccount is the fixture's admin impersonating vpcni's service
// account sa: its requests get exactly the RBAC deploy/rbac.yaml grants.
func serviceAccount(sa string) *rest.Config { return fixture.As(namespace, sa) }

// kubeconfigAs writes serviceAccount(sa) as a kubeconfig for a process.
func kubeconfigAs(t *testing.T, sa string) string {
	t.Helper()
	path, err := fixture.KubeconfigAs(t.TempDir(), namespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// controllerProc is one vpcni-controller replica.
type controllerProc struct {
	id string
	*testbed.Logged
}

// startController runs the vpcni-controller binary as its service account
// (deploy/rbac.yaml), with leader election, blocks on, no webhook.
func startController(t *testing.T, bin, kubeconfig, id string, args ...string) *controllerProc {
	t.Helper()
	return &controllerProc{id: id, Logged: testbed.StartLogged(t, bin, append([]string{"-kubeconfig", kubeconfig, "-id", id, "-lease-namespace", namespace,
		"-lease-duration", "3s", "-webhook-addr", "", "-health-addr", ""}, args...)...)}
}

func (c *controllerProc) leading() bool {
	return strings.Contains(c.Output(), "leading: reconcilers start")
}

// The real vpcni-controller binary, two replicas with the leader lease,
// running as the service account deploy/rbac.yaml sets up, and the
// agents' side as theirs: only the leader assigns (three nodes, exactly
// one block each, no extra), and when it stops the other takes over and
// serves the next request. Proves the flags, the wiring in main and that
// RBAC grants both sides what blocks need.
func TestControllerBinaryWithLeaseAndRBAC(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) })
	applyDeploy(t)
	bin := filepath.Join(t.TempDir(), "vpcni-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/vpcni/vpcni/cmd/vpcni-controller").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	kc := kubeconfigAs(t, "vpcni-controller")
	args := []string{"-block-ranges", "10.34.0.0/25", "-block-size", "28", "-block-reclaim-grace", "1s"}
	c1 := startController(t, bin, kc, "replica-1", append(args, "-health-addr", "127.0.0.1:29697")...)
	waitFor(t, 20*time.Second, "replica-1 leads", func() error {
		if !c1.leading() {
			return fmt.Errorf("log so far:\n%s", c1.Output())
		}
		return nil
	})
	c2 := startController(t, bin, kc, "replica-2", append(args, "-health-addr", "127.0.0.1:29698")...)
	const rng = "10.34.0.0/25"
	agentCfg := serviceAccount("vpcni-agent")
	var agents []*agent
	for i := range 3 {
		node := fmt.Sprintf("lease-%d", i+1)
		createNode(t, node)
		agents = append(agents, newAgentAs(t, agentCfg, node, rng, "15s"))
	}
	for _, ag := range agents {
		ag.assign(t, 5)
	}
	byNode, items := nodeBlocks(t)
	disjoint(t, items)
	if len(items) != 3 {
		t.Fatalf("one leader, three nodes asking once: %d blocks %v, want 3", len(items), byNode)
	}
	if c2.leading() {
		t.Fatal("both replicas lead")
	}
	// The leader's figures on /metrics: 3 of the 8 blocks assigned; the
	// follower exports none.
	waitFor(t, 10*time.Second, "the leader's block metrics", func() error {
		return metricsSay("127.0.0.1:29697", `vpcni_controller_blocks{state="assigned"} 3`, `vpcni_controller_blocks{state="free"} 5`,
			`vpcni_controller_block_nodes_waiting 0`, `vpcni_controller_blocks_assigned_total 3`)
	})
	// From a scrape that worked: a refused one proves nothing.
	if lines, err := metricsLines("127.0.0.1:29698"); err != nil {
		t.Errorf("the follower's /metrics: %v", err)
	} else if got := grepLines(lines, "vpcni_controller_blocks{"); got != "" {
		t.Errorf("the follower exports block metrics:\n%s", got)
	}
	t0 := time.Now()
	c1.Stop()
	more := agents[0].assign(t, 14) // its block has 14 usable, 5 taken: a second block
	t.Logf("leader stopped; the follower took over and served a block in %s", time.Since(t0).Round(time.Millisecond))
	if !c2.leading() {
		t.Fatalf("replica-2 never led, yet a block came")
	}
	byNode, items = nodeBlocks(t)
	disjoint(t, items)
	if len(items) != 4 || len(byNode["lease-1"]) != 2 || !inBlocks(byNode["lease-1"], more[len(more)-1]) {
		t.Fatalf("after takeover: %v", byNode)
	}
	waitFor(t, 10*time.Second, "the new leader's block metrics", func() error {
		return metricsSay("127.0.0.1:29698", `vpcni_controller_blocks{state="assigned"} 4`, `vpcni_controller_blocks_assigned_total 1`)
	})
	waitFor(t, 10*time.Second, "the binary's Event on the node", func() error {
		return nodeEvent(t, "lease-1", "VpcniBlockAssigned", "assigned to node lease-1")
	})
	if log := c1.Output() + c2.Output(); strings.Contains(log, "forbidden") {
		t.Errorf("a request was forbidden by RBAC:\n%s", log)
	}
}

// metricsLines scrapes the /metrics at addr.
func metricsLines(addr string) ([]string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return strings.Split(string(body), "\n"), nil
}

// metricsSay: the /metrics at addr has every line of want.
func metricsSay(addr string, want ...string) error {
	lines, err := metricsLines(addr)
	if err != nil {
		return err
	}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			return fmt.Errorf("no line %q in:\n%s", w, grepLines(lines, "vpcni_"))
		}
	}
	return nil
}

func grepLines(lines []string, sub string) string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
