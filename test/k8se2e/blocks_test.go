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
	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
	"sigs.k8s.io/yaml"
)

// blocksRange is deploy/blocks' range (vpcnid.yaml and the controller's
// --block-ranges): the test installs the component as it is, only its
// paths moved to this node's.
const blocksRange = "10.20.0.0/22"

// TestBlocksInstall installs bare metal's mode, the static provider's
// per-node blocks, on a fresh node the way its users do: deploy/ with the
// deploy/blocks component, then (that install removed) the Helm chart
// with blockRanges. Nothing on the node has an address yet and
// vpcni-controller alone creates NodeBlocks, so the controller must run
// without vpcni (on the host network): the node must turn Ready, the
// controller give the node a block, and workloads start on addresses of
// that block, reachable from each other, through a Service and from the
// node.
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
	t.Run("static-podnetwork", func(t *testing.T) { checkStaticPodNetwork(t, n, n.pods("default", "app=web")) })
	t.Run("podnetwork-capacity", func(t *testing.T) { checkPodNetworkCapacity(t, n) })
	t.Run("helm-install", func(t *testing.T) { checkBlocksHelmInstall(t, n) })
}

// checkBlocksHelmInstall installs the same mode through the chart, on the
// same node once deploy/'s install is removed: the NodeBlocks go with
// their CRD, so the controller the chart runs must again give the node its
// first block before any pod on the pod network can start. (The node
// stays Ready meanwhile: kubectl delete leaves vpcni's conflist on the
// node.)
func checkBlocksHelmInstall(t *testing.T, n *node) {
	start := time.Now()
	n.mustKubectl("delete", "deployment/web", "service/web", "--wait=true")
	eventually(t, 2*time.Minute, "the web pods gone", func() (bool, string) {
		ps := n.pods("default", "app=web")
		return len(ps) == 0, fmt.Sprintf("%d pods", len(ps))
	})
	n.mustKubectl("delete", "-k", n.overlay, "--wait=true", "--timeout=2m")
	t.Logf("vpcni-test: kubectl delete -k: web and vpcni gone in %s", time.Since(start).Round(100*time.Millisecond))
	helmBin := strings.TrimSpace(mustRun(t, nil, "bash", filepath.Join(repo, "scripts", "helm.sh")))
	home := t.TempDir()
	// The chart installs into the release's namespace and makes none: as
	// the chart's README says, create it labelled for privileged pods
	// (kubectl delete -k took deploy/'s).
	n.mustKubectl("create", "namespace", "vpcni-system")
	n.mustKubectl("label", "namespace", "vpcni-system", "pod-security.kubernetes.io/enforce=privileged")
	installed := time.Now()
	mustRun(t, []string{"HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config", "HELM_DATA_HOME=" + home + "/data"},
		"nsenter", "--net=/run/netns/"+nodeNS, "--", helmBin, "--kubeconfig", n.env["VPCNI_K8S_KUBECONFIG"],
		"install", "vpcni", filepath.Join(repo, "deploy", "helm", "vpcni"), "--namespace", "vpcni-system", "-f", n.writeBlocksValues())
	n.waitBlocksInstalled("helm install with blockRanges", installed)
	n.checkBlocksWorkloads()
}

// writeBlocksValues writes the chart's values for blocks mode, as
// deploy/blocks has it (TestBlocksRenderDeployBlocks in test/helm keeps
// the two equal), pointed at this node as writeBlocksOverlay does.
func (n *node) writeBlocksValues() string {
	repoName, tag, _ := strings.Cut(currentImage(n.t), ":")
	values := map[string]any{
		"image": map[string]any{"repository": repoName, "tag": tag},
		"provider": map[string]any{"type": "static", "static": map[string]any{
			"ranges": []any{map[string]any{"cidr": blocksRange, "gateway": "10.20.0.1", "exclude": []string{"10.20.0.2", "10.20.0.3"}}},
			"blocks": map[string]any{"wait": "10s"}}},
		"agent": map[string]any{"hostPaths": map[string]any{
			"cniBin": n.env["VPCNI_K8S_CNI_BIN_DIR"], "cniConf": n.env["VPCNI_K8S_CNI_CONF_DIR"],
			"socketDir": hostSocketDir, "stateDir": hostStateDir, "bpffs": hostBPFDir,
		}},
		"controller": map[string]any{"blockRanges": []string{blocksRange}, "blockSize": 26},
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		n.t.Fatal(err)
	}
	f := filepath.Join(n.t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return f
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
		if conf := filepath.Join(n.env["VPCNI_K8S_CNI_CONF_HOST_DIR"], cniinstall.DefaultName); !fileExists(conf) {
			t.Fatalf("the node turned Ready without vpcni's conflist %s", conf)
		}
		return true, ""
	})
	n.checkOneConflist(t, how, cniinstall.DefaultName)
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
	n.checkControllerOnHost()
	t.Logf("vpcni-test: blocks mode installed: node Ready, agent Ready, block given, taint lifted, webhook serving %s after %s",
		time.Since(since).Round(100*time.Millisecond), how)
}

// checkControllerOnHost: one controller replica Ready on the node's own
// address (the host network), and the second, which would need the same
// host ports, left Pending by the scheduler on this one-node cluster
// rather than crash-looping on a port in use.
func (n *node) checkControllerOnHost() {
	t := n.t
	t.Helper()
	var l struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				HostNetwork bool `json:"hostNetwork"`
			} `json:"spec"`
			Status struct {
				Phase      string `json:"phase"`
				PodIP      string `json:"podIP"`
				HostIP     string `json:"hostIP"`
				Conditions []struct {
					Type, Status, Reason, Message string
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	var ready, pending []string
	eventually(t, time.Minute, "one controller replica Ready, the other Pending for its host ports", func() (bool, string) {
		ready, pending = nil, nil
		if err := n.getJSON(&l, "-n", "vpcni-system", "get", "pods", "-l", "app.kubernetes.io/name=vpcni-controller"); err != nil {
			return false, err.Error()
		}
		for _, p := range l.Items {
			if !p.Spec.HostNetwork || (p.Status.PodIP != "" && p.Status.PodIP != p.Status.HostIP) {
				t.Fatalf("controller pod %s is not on the host network (pod IP %s, node %s)", p.Metadata.Name, p.Status.PodIP, p.Status.HostIP)
			}
			for _, c := range p.Status.Conditions {
				switch {
				case c.Type == "Ready" && c.Status == "True":
					ready = append(ready, p.Metadata.Name+"@"+p.Status.PodIP)
				case c.Type == "PodScheduled" && c.Status == "False" && strings.Contains(c.Message, "free ports"):
					pending = append(pending, p.Metadata.Name+": "+c.Message)
				}
			}
		}
		return len(ready) == 1 && len(pending) == 1 && len(l.Items) == 2, fmt.Sprintf("ready %v, pending %v, %d pods", ready, pending, len(l.Items))
	})
	t.Logf("vpcni-test: vpcni-controller on the host network: %s Ready; the second replica Pending (%s)", ready[0], pending[0])
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
// deploy/blocks component as users combine them, with its vpcnid.yaml
// and controller flags as shipped, only pointed at this node (its CNI
// dirs, host paths away from the machine's own, the agent's socket in the
// conflist). The agent's metrics port is the node's namespace's own.
func (n *node) writeBlocksOverlay() string {
	dir := n.t.TempDir()
	mustRun(n.t, nil, "cp", "-r", filepath.Join(repo, "deploy"), filepath.Join(dir, "deploy"))
	ov := filepath.Join(dir, "overlay")
	if err := os.Mkdir(ov, 0o755); err != nil {
		n.t.Fatal(err)
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
    behavior: merge
    files:
      - 10-vpcni.conflist
images:
  - name: vpcni/vpcni
    newName: %s
    # quoted: a tag of digits alone (a commit's short hash) is a number
    newTag: "%s"
patches:
  - path: daemonset-paths.yaml
`, name, tag),
		"daemonset-paths.yaml": n.daemonsetPaths(true),
		"10-vpcni.conflist":    n.shippedConflist(),
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(ov, f), []byte(body), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
	return ov
}
