package k8se2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

// blocksRange is deploy/blocks' range (vpcnid.yaml and the controller's
// --block-ranges): the test installs the component as it is, only its
// paths moved to this node's.
const blocksRange = "10.20.0.0/22"

// TestBlocksInstall installs bare metal's mode, the static provider's
// per-node blocks, on a fresh node the way its users do: deploy/ with the
// deploy/blocks component. Nothing on the node has an address yet and
// vpcni-controller alone creates NodeBlocks, so the controller must run
// without vpcni: the node must turn Ready, the controller give the node a
// block, and workloads start on addresses of that block, reachable from
// each other, through a Service and from the node.
func TestBlocksInstall(t *testing.T) {
	n := upNode(t)
	if n.nodeReady() {
		t.Fatal("the node is Ready before any CNI was installed")
	}
	n.overlay = n.writeBlocksOverlay()
	applied := time.Now()
	n.mustKubectl("apply", "-k", n.overlay)
	n.waitBlocksInstalled("kubectl apply -k deploy/ with components: [blocks]", applied)
	n.checkBlocksWorkloads()
}

// waitBlocksInstalled waits for what a blocks-mode install must reach on
// its own: the node Ready (vpcni's conflist in place), the agent Ready,
// a NodeBlock of the range for the node, the not-ready taint lifted and
// the webhook serving.
func (n *node) waitBlocksInstalled(how string, since time.Time) {
	t := n.t
	t.Helper()
	nodeName := n.env["VPCNI_K8S_NODE"]
	eventually(t, 2*time.Minute, "the node Ready with vpcni's conflist", func() (bool, string) {
		if !n.nodeReady() {
			return false, "NotReady"
		}
		if conf := filepath.Join(n.env["VPCNI_K8S_CNI_CONF_HOST_DIR"], "10-vpcni.conflist"); !fileExists(conf) {
			t.Fatalf("the node turned Ready without vpcni's conflist %s", conf)
		}
		return true, ""
	})
	t.Logf("vpcni-test: node Ready %s after %s", time.Since(since).Round(100*time.Millisecond), how)
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcnid", 1, 2*time.Minute)
	var blocks []string
	eventually(t, 2*time.Minute, "a NodeBlock for "+nodeName, func() (bool, string) {
		blocks = n.nodeBlocks(nodeName)
		return len(blocks) > 0, "none"
	})
	within := netip.MustParsePrefix(blocksRange)
	for _, b := range blocks {
		if p, err := netip.ParsePrefix(b); err != nil || !within.Contains(p.Addr()) || p.Bits() != 26 {
			t.Errorf("NodeBlock %s: not a /26 of %s", b, blocksRange)
		}
	}
	t.Logf("vpcni-test: vpcni-controller gave %s the block(s) %v %s after %s", nodeName, blocks, time.Since(since).Round(100*time.Millisecond), how)
	eventually(t, time.Minute, "the "+nodeside.TaintNotReady+" taint lifted", func() (bool, string) {
		nd := n.getNode()
		return !notReadyTainted(nd), fmt.Sprintf("taints %v", nd.Spec.Taints)
	})
	n.waitWebhook(time.Minute)
	t.Logf("vpcni-test: blocks mode installed: node Ready, agent Ready, block given, taint lifted, webhook serving %s after %s",
		time.Since(since).Round(100*time.Millisecond), how)
}

// checkBlocksWorkloads runs the web Deployment and proves its pods took
// addresses of the node's blocks and are reachable: pod to pod, a
// ClusterIP, and from the node itself (a routed range: nothing else on
// the lab's segment routes it in this one-node cluster).
func (n *node) checkBlocksWorkloads() {
	t := n.t
	t.Helper()
	web := n.runWeb()
	var blocks []netip.Prefix
	for _, b := range n.nodeBlocks(n.env["VPCNI_K8S_NODE"]) {
		blocks = append(blocks, netip.MustParsePrefix(b))
	}
	for _, p := range web {
		ip := netip.MustParseAddr(p.Status.PodIP)
		in := false
		for _, b := range blocks {
			in = in || b.Contains(ip)
		}
		if !in {
			t.Errorf("%s has %s, outside the node's blocks %v", p.Metadata.Name, ip, blocks)
		}
		if got, err := fetch(nodeNS, netip.AddrPortFrom(ip, 8080), 3*time.Second); err != nil || got != p.Metadata.Name {
			t.Errorf("node -> %s (%s): %q %v", p.Metadata.Name, ip, got, err)
		}
	}
	checkPodToPod(t, n, web)
	checkService(t, n, web)
	t.Logf("vpcni-test: %d pods on addresses of the blocks %v: node -> pod, pod -> pod, pod -> ClusterIP answered", len(web), blocks)
}

// nodeBlocks lists the CIDRs of node's NodeBlocks.
func (n *node) nodeBlocks(node string) []string {
	var l v1alpha1.NodeBlockList
	if err := n.getJSON(&l, "get", "nodeblocks"); err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, b := range l.Items {
		if b.Spec.Node == node {
			out = append(out, b.Spec.CIDR)
		}
	}
	return out
}

// writeBlocksOverlay is writeOverlay for blocks mode: deploy/ and the
// deploy/blocks component as users combine them, only pointed at this
// node (its CNI dirs, host paths away from the machine's own, the agent's
// socket in the conflist, a metrics port of its own).
func (n *node) writeBlocksOverlay() string {
	dir := n.t.TempDir()
	mustRun(n.t, nil, "cp", "-r", filepath.Join(repo, "deploy"), filepath.Join(dir, "deploy"))
	ov := filepath.Join(dir, "overlay")
	if err := os.Mkdir(ov, 0o755); err != nil {
		n.t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(repo, "deploy", "blocks", "vpcnid.yaml"))
	if err != nil {
		n.t.Fatal(err)
	}
	agentConfig := strings.Replace(string(shipped), "metricsAddr: 127.0.0.1:9695", "metricsAddr: 127.0.0.1:19695", 1)
	if agentConfig == string(shipped) || !strings.Contains(agentConfig, "cidr: "+blocksRange) {
		n.t.Fatalf("deploy/blocks/vpcnid.yaml: no metricsAddr 127.0.0.1:9695 or range %s to run with:\n%s", blocksRange, shipped)
	}
	name, tag, _ := strings.Cut(currentImage(n.t), ":")
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../deploy
components:
  - ../deploy/blocks
configMapGenerator:
  - name: vpcni-config
    behavior: replace
    files:
      - vpcnid.yaml
      - 10-vpcni.conflist
images:
  - name: vpcni/vpcni
    newName: %s
    newTag: %s
patches:
  - path: daemonset-paths.yaml
`, name, tag),
		"daemonset-paths.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: vpcnid
spec:
  template:
    spec:
      volumes:
        - name: cni-bin
          hostPath: {path: %s, type: DirectoryOrCreate}
        - name: cni-conf
          hostPath: {path: %s, type: DirectoryOrCreate}
        - name: socket-dir
          hostPath: {path: %s, type: DirectoryOrCreate}
        - name: state-dir
          hostPath: {path: %s, type: DirectoryOrCreate}
        - name: bpffs
          hostPath: {path: %s, type: DirectoryOrCreate}
`, n.env["VPCNI_K8S_CNI_BIN_DIR"], n.env["VPCNI_K8S_CNI_CONF_DIR"], hostSocketDir, hostStateDir, hostBPFDir),
		"vpcnid.yaml":       agentConfig,
		"10-vpcni.conflist": n.shippedConflist(),
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(ov, f), []byte(body), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
	return ov
}
