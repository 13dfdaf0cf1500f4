package k8se2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/kubectlplugin"
)

// checkKubectlPlugin runs kubectl-vpcni as an operator would, with the
// cluster's kubeconfig from outside the node: vpcnictl in the node's agent
// pod through pods/exec (the API server, the kubelet's streaming server,
// containerd), its output and exit code passed through, and the nodes
// summary from the API.
func checkKubectlPlugin(t *testing.T, n *node) {
	name := n.env["VPCNI_K8S_NODE"]
	plugin := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + nodeNS, "--",
			filepath.Join(binDir, "kubectl-vpcni"), "--kubeconfig", n.env["VPCNI_K8S_KUBECONFIG"]}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		var ee *exec.ExitError
		if err := cmd.Run(); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("kubectl-vpcni %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errOut.String(), code
	}

	out, stderr, code := plugin("--node", name, "status")
	if code != 0 || !strings.Contains(out, "node      "+name) || !strings.Contains(out, "agent     ready") || !strings.Contains(out, "pool      free ") {
		t.Fatalf("kubectl vpcni --node %s status: exit %d\n%s%s", name, code, out, stderr)
	}
	t.Logf("vpcni-test: kubectl vpcni --node %s status, through pods/exec:\n%s", name, out)

	// The same figures as the agent's socket on the node gives.
	out, stderr, code = plugin("--node", name, "status", "-o", "json")
	var remote api.State
	if err := json.Unmarshal([]byte(out), &remote); code != 0 || err != nil {
		t.Fatalf("status -o json: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	local, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	if remote.Node != name || remote.Pool.Capacity != local.Pool.Capacity || remote.StartedAt != local.StartedAt {
		t.Errorf("status through kubectl-vpcni: node %s, capacity %d, started %s; on the node: %s, %d, %s",
			remote.Node, remote.Pool.Capacity, remote.StartedAt, local.Node, local.Pool.Capacity, local.StartedAt)
	}

	// trace NS/POD finds the pod's node itself.
	web := n.pods("default", "app=web")
	if len(web) == 0 {
		t.Fatal("no web pod to trace")
	}
	target := "default/" + web[0].Metadata.Name
	out, stderr, code = plugin("trace", target, "-o", "json")
	var tr api.Trace
	if err := json.Unmarshal([]byte(out), &tr); code != 0 || err != nil || !tr.OK() {
		t.Errorf("kubectl vpcni trace %s: exit %d, %v\n%s%s", target, code, err, out, stderr)
	}

	// vpcnictl's exit code and stderr come back as they are: 2 for its
	// usage error, which kubectl-vpcni's own failures (1) never are.
	out, stderr, code = plugin("--node", name, "status", "-o", "yaml")
	if code != 2 || !strings.Contains(stderr, `vpcnictl: status: unknown output format "yaml"`) {
		t.Errorf("vpcnictl's usage error through kubectl-vpcni: exit %d, want 2\n%s%s", code, out, stderr)
	}

	out, stderr, code = plugin("nodes", "-o", "json")
	var sums []kubectlplugin.NodeSummary
	if err := json.Unmarshal([]byte(out), &sums); code != 0 || err != nil || len(sums) == 0 {
		t.Fatalf("kubectl vpcni nodes: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	s := sums[0]
	if s.Name != name || s.AgentStatus != "Ready" || s.PoolCapacity == "" || s.IPCapacity == "" || s.Ready != "True" {
		t.Errorf("kubectl vpcni nodes: %+v", s)
	}
	table, _, _ := plugin("nodes")
	t.Logf("vpcni-test: kubectl vpcni nodes:\n%s", table)
}
