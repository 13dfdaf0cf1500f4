package k8se2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

// The cluster's nodes, for the tests that run on more than one (upNodes):
// the first runs the control plane, the others joined it. Each node's
// scripts/k8s-node.sh env says where its own dirs are on the host.

// envs is every node's env, the first node's first.
func (n *node) envs() []map[string]string {
	out := []map[string]string{n.env}
	for _, j := range n.joined {
		out = append(out, j.env)
	}
	return out
}

// nodeNames are the cluster's node names, the first node's first.
func (n *node) nodeNames() []string {
	var names []string
	for _, e := range n.envs() {
		names = append(names, e["VPCNI_K8S_NODE"])
	}
	return names
}

// importAll imports an image tarball into every node's containerd.
func (n *node) importAll(tar string) {
	script := filepath.Join(repo, "scripts/k8s-node.sh")
	for i, e := range n.envs() {
		var env []string
		if i > 0 {
			env = []string{"NODE=" + e["VPCNI_K8S_NODE"]}
		}
		mustRun(n.t, env, "bash", script, "import", tar)
	}
}

// installAll installs vpcni on every node the way users do (kubectl apply
// -k of n.overlay), waits for it to serve them all (waitInstalled) and for
// every node's not-ready taint to be lifted (vpcnid does that once its
// pool is warm).
func (n *node) installAll() {
	t := n.t
	t.Helper()
	applied := time.Now()
	n.mustKubectl("apply", "-k", n.overlay)
	n.waitInstalled("kubectl apply -k", applied)
	eventually(t, 2*time.Minute, "the "+nodeside.TaintNotReady+" taint lifted on every node", func() (bool, string) {
		for _, name := range n.nodeNames() {
			if notReadyTainted(n.getNodeNamed(name)) {
				return false, name + " still tainted"
			}
		}
		return true, ""
	})
}

// waitInstalled waits, once vpcni was installed (how, at since), for every
// node to turn Ready — never before vpcni's conflist is in that node's CNI
// dir — then for one vpcnid on each node, both controller replicas and the
// webhook.
func (n *node) waitInstalled(how string, since time.Time) {
	t := n.t
	t.Helper()
	names := n.nodeNames()
	conflist := n.conflistName()
	eventually(t, 3*time.Minute, fmt.Sprintf("%d nodes Ready after vpcni is installed", len(names)), func() (bool, string) {
		for i, e := range n.envs() {
			if !n.nodeReadyNamed(names[i]) {
				return false, names[i] + " NotReady"
			}
			// A joined node's conflist is in its own CNI dir (its mount
			// namespace binds it at the first node's path, the DaemonSet's
			// hostPath).
			if conf := filepath.Join(e["VPCNI_K8S_CNI_CONF_HOST_DIR"], conflist); !fileExists(conf) {
				t.Fatalf("%s turned Ready without vpcni's conflist %s", names[i], conf)
			}
		}
		return true, ""
	})
	t.Logf("vpcni-test: %d node(s) Ready %s after %s (vpcni's %s in each node's CNI dir)", len(names), time.Since(since).Round(100*time.Millisecond), how, conflist)
	agents := n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcnid", len(names), 2*time.Minute)
	on := n.podNodes(agents)
	for _, name := range names {
		if on[name] != 1 {
			t.Fatalf("vpcnid pods per node: %v, want one on each of %v", on, names)
		}
	}
	// The controller runs on the pod network: vpcni wires it too.
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 2*time.Minute)
	// Its webhook makes the tests' pods request vpcni.io/ip.
	n.waitWebhook(time.Minute)
}

// conflistName is the name vpcnid gives its network configuration in the
// node's CNI conf dir: this release's default, or the previous release's
// (named after its source in the ConfigMap).
func (n *node) conflistName() string {
	if n.prev != nil {
		return "10-vpcni.conflist"
	}
	return cniinstall.DefaultName
}

// vpcniConflists lists the files in dir the runtime would read as vpcni's
// (first plugin vpcni), by name.
func vpcniConflists(t testing.TB, dir string) []string {
	files, err := libcni.ConfFiles(dir, cniinstall.ConfExts)
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, f := range files {
		if cniinstall.IsVpcni(f) {
			ours = append(ours, filepath.Base(f))
		}
	}
	sort.Strings(ours)
	return ours
}

// checkOneConflist: the node's CNI conf dir holds exactly one vpcni list,
// under want.
func (n *node) checkOneConflist(t testing.TB, when, want string) {
	t.Helper()
	if got := vpcniConflists(t, n.env["VPCNI_K8S_CNI_CONF_HOST_DIR"]); !slices.Equal(got, []string{want}) {
		t.Errorf("%s: vpcni's network configurations in the node's CNI dir: %v, want exactly [%s]", when, got, want)
		return
	}
	t.Logf("vpcni-test: %s: exactly one vpcni network configuration in the node's CNI dir, %s", when, want)
}
