// Package k8se2e runs vpcni on a real Kubernetes node: etcd, the control
// plane, containerd, kubelet and kube-proxy from scripts/k8s-node.sh, all
// inside a lab node's network namespace, with addresses from the lab's
// Neutron-compatible endpoint. vpcni is installed the way users install it:
// the image imported into containerd and `kubectl apply -k` of deploy/
// (through an overlay that only points it at this node's paths and cloud).
package k8se2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/faultproxy"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

const (
	labPrefix = "vpcni-k8s"
	nodeNS    = labPrefix + "-n1"
	legacyNS  = labPrefix + "-legacy"
	// proxyAddr is where the agent reaches the cloud: a fault proxy in
	// the node's namespace in front of the lab's endpoint, so the test can
	// make the cloud fail.
	proxyAddr = "127.0.0.1:19796"
	// The agent's socket and state on the host (the DaemonSet's hostPaths,
	// patched away from /run/vpcni and /var/lib/vpcni).
	hostSocketDir = "/run/vpcni-k8s-e2e"
	hostStateDir  = "/var/tmp/vpcni-k8s/vpcni-state"
	// hostBPFDir stands in for the node's /sys/fs/bpf (the DaemonSet's
	// bpffs hostPath): a directory of the test's own, made a shared mount,
	// on which the init container mounts the BPF filesystem as it would on
	// /sys/fs/bpf. Not the machine's /sys/fs/bpf: here /sys is a private
	// mount, which the runtime refuses to propagate, and the pins of other
	// runs must not meet these.
	hostBPFDir = "/run/vpcni-k8s-e2e-bpffs"
)

var (
	repo   string
	binDir string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the Kubernetes node tests")
	wd, _ := os.Getwd()
	repo = filepath.Clean(filepath.Join(wd, "../.."))
	binDir = os.Getenv("VPCNI_BIN")
	if binDir == "" {
		binDir = filepath.Join(repo, "bin")
	}
	os.Exit(m.Run())
}

// node is the running Kubernetes node and what the test knows of it.
type node struct {
	t *testing.T
	// cloud is the lab's: "openstack" or "aws".
	cloud   string
	env     map[string]string
	lab     labState
	proxy   *faultproxy.Proxy
	overlay string
	// prev, set, makes overlays install the previous release (its
	// deploy/ and image) instead of this one.
	prev *release
	// joined are the nodes after the first (upNodes), each with its env
	// (scripts/k8s-node.sh join) and its own fault proxy.
	joined []joinedNode
	// registry, set, is the registry the node pulls vpcni's images from
	// (useRegistry); else they are imported.
	registry string
	// dualStack: the cluster and vpcni run IPv4 and IPv6 (upDualStack).
	dualStack bool
}

// joinedNode is a node that scripts/k8s-node.sh join added: its kubelet
// registered at the first node's API server.
type joinedNode struct {
	env   map[string]string
	proxy *faultproxy.Proxy
}

// release is a vpcni release to install: its deploy/ and image name.
type release struct{ deploy, image string }

type labState struct {
	URL      string `json:"endpoint"`
	SubnetID string `json:"subnetID"`
	Nodes    []struct {
		IP     netip.Addr `json:"ip"`
		IP6    netip.Addr `json:"ip6"`
		PortID string     `json:"portID"`
	} `json:"nodes"`
	Legacy struct {
		IP  netip.Addr `json:"ip"`
		IP6 netip.Addr `json:"ip6"`
	} `json:"legacy"`
}

func run(t testing.TB, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func mustRun(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(t, env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fetch asks addr for / over HTTP from the network namespace ns and
// returns the body.
func fetch(ns string, addr netip.AddrPort, timeout time.Duration) (string, error) {
	var c net.Conn
	err := netnsutil.Do(netnsutil.Path(ns), func() (err error) {
		c, err = net.DialTimeout("tcp", addr.String(), timeout)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	head, body, _ := strings.Cut(string(resp), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.") || !strings.Contains(strings.SplitN(head, "\r\n", 2)[0], " 200") {
		return "", fmt.Errorf("answer %q", head)
	}
	return strings.TrimSpace(body), nil
}

// upNode brings up the lab (one node, no vpcnid) and the Kubernetes node
// in it; everything is torn down when the test ends.
func upNode(t *testing.T) *node { return upNodes(t, 1) }

// nodeNSName is the lab's namespace of node i (0-based): the first is
// nodeNS.
func nodeNSName(i int) string { return fmt.Sprintf("%s-n%d", labPrefix, i+1) }

// privateHostDirs are the DaemonSet's hostPaths that are per node (its
// socket, state and BPF filesystem): a joined node gets its own copy of
// each (scripts/k8s-node.sh join PRIVATE=…), as separate hosts would.
var privateHostDirs = []string{hostSocketDir, hostStateDir, hostBPFDir}

// upNodes is upNode with count nodes in the lab: the first runs the
// control plane and a kubelet, the others join it.
func upNodes(t *testing.T, count int) *node { return upNodesOn(t, count, "openstack") }

// upNodesOn is upNodes on a lab of the given cloud ("openstack" or "aws").
func upNodesOn(t *testing.T, count int, cloud string) *node {
	return upNodesWith(t, count, cloud, false)
}

// upNodesWith is upNodesOn; with pull the first node installs vpcni by
// pulling from a registry (useRegistry) instead of importing the image.
func upNodesWith(t *testing.T, count int, cloud string, pull bool) *node {
	return upCluster(t, count, cloud, pull, false)
}

// labSubnet6 is the lab network's IPv6 subnet on a dual-stack cluster.
const labSubnet6 = "fd00:90::/64"

// upDualStack is upNodes on a dual-stack cluster: the lab's network with
// an IPv6 subnet too (every node and the legacy VM an address of it), the
// cluster's Services, node addresses and kube-proxy of both families
// (k8s-node.sh DUAL_STACK=1), and vpcni's pods of both (writeOverlay).
func upDualStack(t *testing.T, count int) *node { return upCluster(t, count, "openstack", false, true) }

// upCluster is upNodesWith, dual-stack or not.
func upCluster(t *testing.T, count int, cloud string, pull, dual bool) *node {
	script := filepath.Join(repo, "scripts/k8s-node.sh")
	var dualEnv, labArgs []string
	if dual {
		dualEnv, labArgs = []string{"DUAL_STACK=1"}, []string{"--subnet6", labSubnet6}
	}
	start := time.Now()
	mustRun(t, nil, "bash", script, "build")
	t.Logf("kubernetes build (cached): %s", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(binDir, "vpcni-image.tar")); err != nil {
		t.Fatalf("no vpcni image (make image): %v", err)
	}
	n := &node{t: t, cloud: cloud, dualStack: dual}
	vpcnictl := filepath.Join(binDir, "vpcnictl")
	mustRun(t, nil, vpcnictl, append([]string{"lab", "up", "--prefix", labPrefix, "--nodes", strconv.Itoa(count), "--agents=false", "--provider", cloud}, labArgs...)...)
	t.Cleanup(func() { _, _ = run(t, nil, vpcnictl, "lab", "down", "--prefix", labPrefix) })
	data, err := os.ReadFile(filepath.Join("/run/vpcni-lab", labPrefix, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &n.lab); err != nil || len(n.lab.Nodes) != count {
		t.Fatalf("lab state: %v %s", err, data)
	}
	// Every node's agent reaches the cloud at proxyAddr in its own
	// namespace.
	for i := 0; i < count; i++ {
		p, err := faultproxy.New(strings.TrimSuffix(n.lab.URL, "/"), 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if err := netnsutil.Do(netnsutil.Path(nodeNSName(i)), func() error { _, err := p.Listen(proxyAddr); return err }); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			n.proxy = p
		} else {
			n.joined = append(n.joined, joinedNode{proxy: p})
		}
	}

	sharedBPFDir(t)
	t.Cleanup(func() {
		if t.Failed() {
			n.dumpOnFailure()
		}
		out, err := run(t, nil, "bash", script, "down")
		if err != nil {
			t.Errorf("k8s-node down: %v", err)
		} else {
			t.Logf("k8s-node down: %s", lastLine(out))
		}
		_ = os.RemoveAll(hostSocketDir)
		_ = os.RemoveAll(hostStateDir)
	})
	start = time.Now()
	mustRun(t, append([]string{"NETNS=" + nodeNS}, dualEnv...), "bash", script, "up")
	t.Logf("kubernetes node up in %s", time.Since(start).Round(time.Millisecond))
	n.env = map[string]string{}
	envOut := mustRun(t, nil, "bash", script, "env")
	for _, line := range strings.Split(envOut, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			n.env[k] = v
		}
	}
	if pull {
		n.useRegistry(t)
	} else {
		mustRun(t, nil, "bash", script, "import", filepath.Join(binDir, "vpcni-image.tar"))
	}
	for i := range n.joined {
		start = time.Now()
		out := mustRun(t, append([]string{"NETNS=" + nodeNSName(i+1), "PRIVATE=" + strings.Join(privateHostDirs, " "),
			"IMAGES=" + filepath.Join(binDir, "vpcni-image.tar")}, dualEnv...), "bash", script, "join")
		t.Logf("kubernetes node %s joined in %s", nodeNSName(i+1), time.Since(start).Round(time.Millisecond))
		n.joined[i].env = parseEnv(out)
	}
	return n
}

// parseEnv reads the KEY=value lines scripts/k8s-node.sh prints.
func parseEnv(out string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.HasPrefix(k, "VPCNI_K8S_") {
			env[k] = v
		}
	}
	return env
}

// sharedBPFDir makes hostBPFDir a shared mount of its own (bound onto
// itself), so that the BPF filesystem the DaemonSet's init container
// mounts there (propagation Bidirectional) is the host's, and the agent's
// container sees it (HostToContainer). It goes, with the pins on it, once
// the node is down (cleanups run last-registered first).
func sharedBPFDir(t *testing.T) {
	// A run killed before its cleanup left its mounts: start afresh.
	_, _ = run(t, nil, "umount", "-R", hostBPFDir)
	if err := os.MkdirAll(hostBPFDir, 0o700); err != nil {
		t.Fatal(err)
	}
	mustRun(t, nil, "mount", "--bind", hostBPFDir, hostBPFDir)
	t.Cleanup(func() {
		if _, err := run(t, nil, "umount", "-R", hostBPFDir); err != nil {
			t.Errorf("unmount %s: %v", hostBPFDir, err)
		}
		_ = os.Remove(hostBPFDir)
	})
	mustRun(t, nil, "mount", "--make-shared", hostBPFDir)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// kubectl runs the node's kubectl in its namespace.
func (n *node) kubectl(args ...string) (string, error) {
	return run(n.t, nil, "nsenter", append([]string{"--net=/run/netns/" + nodeNS, "--", n.env["VPCNI_K8S_KUBECTL"], "--kubeconfig", n.env["VPCNI_K8S_KUBECONFIG"]}, args...)...)
}

func (n *node) mustKubectl(args ...string) string {
	n.t.Helper()
	out, err := n.kubectl(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

func (n *node) getJSON(v any, args ...string) error {
	out, err := n.kubectl(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

func (n *node) dumpOnFailure() {
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"-n", "vpcni-system", "logs", "-l", "app.kubernetes.io/name=vpcnid", "--tail=80"},
		{"-n", "vpcni-system", "logs", "-l", "app.kubernetes.io/name=vpcni-controller", "--tail=30"},
	} {
		out, _ := n.kubectl(args...)
		n.t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	}
}

func (n *node) nodeReady() bool {
	out, err := n.kubectl("get", "node", n.env["VPCNI_K8S_NODE"], "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	return err == nil && strings.TrimSpace(out) == "True"
}

func eventually(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last: %s)", what, d, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// daemonsetPaths is the overlay's patch that points the DaemonSet's host
// volumes at this node's directories. This release mounts the node's
// /sys/fs/bpf too (mode ebpf's pins); the previous one has no such volume
// to move, so bpffs is false for it.
func (n *node) daemonsetPaths(bpffs bool) string {
	patch := fmt.Sprintf(`apiVersion: apps/v1
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
`, n.env["VPCNI_K8S_CNI_BIN_DIR"], n.env["VPCNI_K8S_CNI_CONF_DIR"], hostSocketDir, hostStateDir)
	if bpffs {
		patch += fmt.Sprintf("        - name: bpffs\n          hostPath: {path: %s, type: DirectoryOrCreate}\n", hostBPFDir)
	}
	return patch
}

// writeOverlay copies deploy/ and puts an overlay on it that points vpcni at
// this node: its CNI dirs, host paths away from the machine's own, the
// lab's subnet through the fault proxy, and the controller's release grace.
// The e2e uses a small pool (smallPool) so that it sees the pool refill and
// shrink in seconds; the benchmark keeps vpcnid's defaults.
// currentImage is this release's image name (make image writes it).
func currentImage(t testing.TB) string {
	image, err := os.ReadFile(filepath.Join(binDir, "vpcni-image.name"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(image))
}

func (n *node) writeOverlay(controllerGrace string, maxAddresses int, smallPool bool) string {
	return n.writeOverlayWith(controllerGrace, maxAddresses, smallPool, "")
}

// writeOverlayWith is writeOverlay with extra vpcnid.yaml (a datapath
// section, say).
func (n *node) writeOverlayWith(controllerGrace string, maxAddresses int, smallPool bool, extra string) string {
	pool := ""
	if smallPool {
		pool = `cooldown: 5s
pool:
  warmTarget: 4
  batchSize: 4
  maxFree: 6
  surplusGrace: 8s
  addWait: 3s
`
	}
	pool += extra
	// With extra config (a datapath switch) the controller, which runs on
	// the pod network, stays scaled to 0 while the agent rolls: no pod may
	// be wired under one mode and deleted under the other.
	controllerScale := ""
	if extra != "" {
		controllerScale = `      - op: replace
        path: /spec/replicas
        value: 0
`
	}
	dir := n.t.TempDir()
	deploy, image := filepath.Join(repo, "deploy"), n.ref(currentImage(n.t))
	if n.prev != nil {
		deploy, image = n.prev.deploy, n.prev.image
	}
	mustRun(n.t, nil, "cp", "-r", deploy, filepath.Join(dir, "deploy"))
	ov := filepath.Join(dir, "overlay")
	if err := os.Mkdir(ov, 0o755); err != nil {
		n.t.Fatal(err)
	}
	name, tag := splitImage(image)
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../deploy
configMapGenerator:
  - name: vpcni-config
    behavior: replace
    files:
      - vpcnid.yaml
      - 10-vpcni.conflist
images:
  - name: vpcni/vpcni
    newName: %s
    # quoted: a tag of digits alone (a commit's short hash) is a number
    newTag: "%s"
patches:
  - path: daemonset-paths.yaml
  - target: {kind: Deployment, name: vpcni-controller}
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/command
        value: [/usr/local/bin/vpcni-controller, --release-grace=%s, --lease-duration=6s]
%s`, name, tag, controllerGrace, controllerScale),
		"daemonset-paths.yaml": n.daemonsetPaths(n.prev == nil),
		"vpcnid.yaml": fmt.Sprintf(`socketPath: /run/vpcni/vpcnid.sock
stateDir: /var/lib/vpcni
metricsAddr: 127.0.0.1:19695
%s%skubernetes:
  mode: "on"
%s`, n.familiesLine(), pool, n.providerSection(maxAddresses)),
		"10-vpcni.conflist": n.shippedConflist(),
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(ov, f), []byte(body), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
	return ov
}

// familiesLine is vpcnid.yaml's ipFamilies on a dual-stack cluster
// (IPv4 first, as the cluster's own families), "" otherwise.
func (n *node) familiesLine() string {
	if !n.dualStack {
		return ""
	}
	return "ipFamilies: [ipv4, ipv6]\n"
}

// providerSection is vpcnid.yaml's provider for the node's cloud, reached
// through the fault proxy.
func (n *node) providerSection(maxAddresses int) string {
	if n.cloud == "aws" {
		// No snat section: SNAT is on by default with this provider, the
		// VPC's CIDRs from the instance metadata. Credentials come from the
		// instance role the node's metadata serves, as on EC2.
		return fmt.Sprintf(`provider:
  type: aws
  aws:
    endpoint: http://%s/
    imdsEndpoint: http://127.0.0.1:%d
`, proxyAddr, lab.IMDSPort)
	}
	// SNAT on, the lab's subnet as the VPC: proves the image's nft runs (the
	// legacy VM, the node and the pods are all inside, so nothing is NATed).
	return fmt.Sprintf(`snat:
  enabled: true
  vpcCIDRs: [10.90.0.0/24]
provider:
  type: openstack
  openstack:
    endpoint: http://%s/
    subnetID: %s
    maxAddresses: %d
`, proxyAddr, n.lab.SubnetID, maxAddresses)
}

// shippedConflist is deploy/10-vpcni.conflist, chained plugins and all,
// with only vpcni's socket moved to this node's host path.
func (n *node) shippedConflist() string {
	data, err := os.ReadFile(filepath.Join(repo, "deploy", "10-vpcni.conflist"))
	if err != nil {
		n.t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(data, &list); err != nil {
		n.t.Fatal(err)
	}
	plugins, _ := list["plugins"].([]any)
	first, _ := plugins[0].(map[string]any)
	if first == nil || first["type"] != "vpcni" {
		n.t.Fatalf("deploy/10-vpcni.conflist: vpcni is not the first plugin: %s", data)
	}
	first["socket"] = hostSocketDir + "/vpcnid.sock"
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		n.t.Fatal(err)
	}
	return string(out) + "\n"
}

type podList struct {
	Items []pod `json:"items"`
}

type pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               string            `json:"uid"`
		Annotations       map[string]string `json:"annotations"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
	} `json:"metadata"`
	Status struct {
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True" && p.Metadata.DeletionTimestamp == nil
		}
	}
	return false
}

func (n *node) pods(ns, selector string) []pod {
	var l podList
	if err := n.getJSON(&l, "-n", ns, "get", "pods", "-l", selector); err != nil {
		n.t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Metadata.Name < l.Items[j].Metadata.Name })
	return l.Items
}

func (n *node) waitReady(ns, selector string, want int, d time.Duration) []pod {
	var ps []pod
	eventually(n.t, d, fmt.Sprintf("%d ready pods %s in %s", want, selector, ns), func() (bool, string) {
		ps = n.pods(ns, selector)
		ready := 0
		for _, p := range ps {
			if p.ready() {
				ready++
			}
		}
		return ready == want && len(ps) == want, fmt.Sprintf("%d pods, %d ready", len(ps), ready)
	})
	return ps
}

// podAddresses lists the PodAddress objects by pod namespace/name.
func (n *node) podAddresses() map[string]v1alpha1.PodAddressSpec {
	var l v1alpha1.PodAddressList
	if err := n.getJSON(&l, "get", "podaddresses"); err != nil {
		n.t.Fatal(err)
	}
	m := map[string]v1alpha1.PodAddressSpec{}
	for _, it := range l.Items {
		m[it.Spec.PodNamespace+"/"+it.Spec.PodName] = it.Spec
	}
	return m
}

// agentState asks the agent through its socket, as an operator would.
func (n *node) agentState() (*api.State, error) {
	out, err := run(n.t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", filepath.Join(binDir, "vpcnictl"), "status", "--socket", hostSocketDir+"/vpcnid.sock", "-o", "json")
	if err != nil {
		return nil, err
	}
	st := &api.State{}
	return st, json.Unmarshal([]byte(out), st)
}

// portIPs are the addresses on the node's VM port in the cloud.
func (n *node) portIPs() map[string]bool {
	var body struct {
		Port struct {
			FixedIPs []struct {
				IP string `json:"ip_address"`
			} `json:"fixed_ips"`
		} `json:"port"`
	}
	out, err := run(n.t, nil, "curl", "-fsS", n.lab.URL+"v2.0/ports/"+n.lab.Nodes[0].PortID)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil {
		n.t.Fatal(err)
	}
	m := map[string]bool{}
	for _, f := range body.Port.FixedIPs {
		m[f.IP] = true
	}
	return m
}

const webManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: %d
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: %s
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
          readinessProbe:
            tcpSocket: {port: 8080}
            periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
    - {port: 80, targetPort: 8080}
`

func (n *node) apply(manifest string) {
	n.t.Helper()
	f := filepath.Join(n.t.TempDir(), "m.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		n.t.Fatal(err)
	}
	n.mustKubectl("apply", "-f", f)
}

func (n *node) exec(pod string, cmd ...string) (string, error) {
	return n.kubectl(append([]string{"exec", pod, "--"}, cmd...)...)
}

// get asks url's host for / from inside pod, with busybox's nc (its
// static wget crashes in this image), and returns the body.
func (n *node) get(pod, hostport string) (string, error) {
	host, port, _ := strings.Cut(hostport, ":")
	if ap, err := netip.ParseAddrPort(hostport); err == nil {
		host, port = ap.Addr().String(), strconv.Itoa(int(ap.Port()))
	}
	out, err := n.exec(pod, "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s %s`, host, port))
	if err != nil {
		return out, err
	}
	head, body, _ := strings.Cut(out, "\r\n\r\n")
	if !strings.Contains(head, " 200") {
		return out, fmt.Errorf("answer %q", out)
	}
	return strings.TrimSpace(body), nil
}

func TestKubernetesNode(t *testing.T) {
	// Installed as a cluster gets vpcni: pulled from a registry by tag.
	n := upNodesWith(t, 1, "openstack", true)

	// No CNI yet: the node must stay NotReady, watched for a few seconds.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if n.nodeReady() {
			t.Fatal("the node is Ready before any CNI was installed")
		}
	}
	t.Log("vpcni-test: node NotReady without a CNI conflist, as it should be")
	// The kubelet registered it tainted (registerWithTaints, as deploy/
	// advises); vpcnid removes the taint once its pool is warm.
	if nd := n.getNode(); !notReadyTainted(nd) {
		t.Fatalf("the node registered without the %s taint: %v", nodeside.TaintNotReady, nd.Spec.Taints)
	}

	// The previous release first: the upgrade below is the real one, with
	// pods and a store it made.
	n.prev = previousRelease(t, n)
	n.overlay = n.writeOverlay("5s", 64, true)
	n.dropNodeChainedPlugins()
	applied := time.Now()
	n.mustKubectl("apply", "-k", n.overlay)
	n.waitInstalled("kubectl apply -k deploy (the previous release, "+n.prev.image+")", applied)
	checkPulled(t, n, n.prev.image)
	eventually(t, time.Minute, "the "+nodeside.TaintNotReady+" taint removed once the pool is warm", func() (bool, string) {
		nd := n.getNode()
		return !notReadyTainted(nd), fmt.Sprintf("taints %v", nd.Spec.Taints)
	})
	if st, err := n.agentState(); err != nil || st.Pool.Free < 4 {
		t.Fatalf("the taint is gone with the pool below warmTarget 4: %+v %v", st, err)
	}
	t.Logf("vpcni-test: node registered with the %s taint; vpcnid removed it with the pool warm; the webhook mutates pods", nodeside.TaintNotReady)

	web := n.runWeb()
	// This release over it; every check below runs on this release.
	t.Run("upgrade", func(t *testing.T) { checkUpgrade(t, n, web) })
	if n.prev != nil {
		t.Fatal("the node still runs the previous release: the checks below are this release's")
	}
	t.Run("addresses", func(t *testing.T) { checkAddresses(t, n, web) })
	t.Run("pod-to-pod", func(t *testing.T) { checkPodToPod(t, n, web) })
	t.Run("service", func(t *testing.T) { checkService(t, n, web) })
	t.Run("legacy-vm-to-pod", func(t *testing.T) { checkLegacyToPods(t, web[:3]) })
	t.Run("snat-table", func(t *testing.T) { checkSNATTable(t, n, web) })
	t.Run("chained-plugins-installed", func(t *testing.T) { checkChainedInstalled(t, n) })
	t.Run("hostport", func(t *testing.T) { checkHostPort(t, n) })
	t.Run("bandwidth", func(t *testing.T) { checkBandwidth(t, n) })
	t.Run("delete-releases", func(t *testing.T) { checkDeleteReleases(t, n) })
	t.Run("agent-restart", func(t *testing.T) { checkAgentRestart(t, n) })
	t.Run("trace-and-doctor-in-agent-pod", func(t *testing.T) { checkInAgentPod(t, n) })
	t.Run("kubectl-vpcni", func(t *testing.T) { checkKubectlPlugin(t, n) })
	t.Run("rollback", func(t *testing.T) { checkRollback(t, n) })
	t.Run("setup-failure-event", func(t *testing.T) { checkFailureEvent(t, n) })
	t.Run("controller-releases-orphans", func(t *testing.T) { checkOrphans(t, n) })
	t.Run("ip-capacity", func(t *testing.T) { checkIPCapacity(t, n) })
	t.Run("ebpf-mode", func(t *testing.T) { checkEBPFMode(t, n) })
	// Last: it drains the node and switches its datapath (and so also
	// takes mode ebpf's programs off, the Clear of every other mode).
	t.Run("macvlan-mode", func(t *testing.T) { checkMacvlanMode(t, n) })
}

// runWeb starts the 10-pod web Deployment and its Service and waits for
// every pod to be Ready.
func (n *node) runWeb() []pod {
	start := time.Now()
	n.apply(fmt.Sprintf(webManifest, 10, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	web := n.waitReady("default", "app=web", 10, 3*time.Minute)
	n.t.Logf("vpcni-test: 10-pod Deployment Ready in %s", time.Since(start).Round(100*time.Millisecond))
	return web
}

// checkLegacyToPods: the legacy VM reaches each pod at its address.
func checkLegacyToPods(t *testing.T, web []pod) {
	for _, p := range web {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if got, err := fetch(legacyNS, netip.AddrPortFrom(ip, 8080), 3*time.Second); err != nil || got != p.Metadata.Name {
			t.Errorf("legacy VM -> %s (%s): %q %v", p.Metadata.Name, ip, got, err)
		}
	}
}

// checkMacvlanMode proves the DaemonSet path in a second datapath mode: the
// node is drained of pods on the pod network (a mode is chosen per node
// and not switched under running pods), its VM port's port security is
// turned off (macvlan pods send from MACs of their own; fixed-ips mode
// cannot allow them otherwise), the ConfigMap selects macvlan, and the
// DaemonSet rolls. Then pods are wired as macvlan sub-interfaces, reach
// each other, a Service through the service veth, and are reached from
// the legacy VM; a hostPort answers the legacy VM and a bandwidth limit is
// refused with an event.
func checkMacvlanMode(t *testing.T, n *node) {
	n.mustKubectl("-n", "vpcni-system", "scale", "deployment/vpcni-controller", "--replicas=0")
	n.mustKubectl("delete", "deployment", "web", "--wait=true")
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 0, 2*time.Minute)
	eventually(t, 2*time.Minute, "no pod on the pod network", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		return st.Pool.Allocated == 0, fmt.Sprintf("%d allocated", st.Pool.Allocated)
	})
	off := false
	body, _ := json.Marshal(map[string]any{"port": map[string]any{"port_security_enabled": off, "allowed_address_pairs": []any{}, "security_groups": []any{}}})
	mustRun(t, nil, "curl", "-fsS", "-X", "PUT", "-H", "Content-Type: application/json", "-d", string(body), n.lab.URL+"v2.0/ports/"+n.lab.Nodes[0].PortID)

	n.overlay = n.writeOverlayWith("5s", 64, true, fmt.Sprintf("datapath:\n  mode: macvlan\n  macvlan:\n    serviceCIDRs: [%s]\n", n.env["VPCNI_K8S_SERVICE_CIDR"]))
	n.mustKubectl("apply", "-k", n.overlay)
	eventually(t, 3*time.Minute, "vpcnid in macvlan mode", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		return st.Datapath == "macvlan" && st.Ready, fmt.Sprintf("datapath %q ready %v", st.Datapath, st.Ready)
	})
	// The ebpf-mode check ran before: the macvlan agent's start took that
	// mode's program off the uplink (its Clear), or it would redirect into
	// host veths no one keeps.
	if st, err := n.agentState(); err != nil {
		t.Fatal(err)
	} else if out := ingressFilters(t, st.Uplink); strings.Contains(out, "vpcni_") {
		t.Errorf("mode ebpf's program is still on the uplink %s in macvlan mode:\n%s", st.Uplink, out)
	}
	n.mustKubectl("-n", "vpcni-system", "scale", "deployment/vpcni-controller", "--replicas=2")
	n.apply(fmt.Sprintf(webManifest, 4, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	web := n.waitReady("default", "app=web", 4, 3*time.Minute)
	for _, p := range web {
		out, err := n.exec(p.Metadata.Name, "cat", "/sys/class/net/eth0/address")
		want := alloc.AddressMAC(netip.MustParseAddr(p.Status.PodIP))
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("%s: eth0 MAC %q %v, want the macvlan pod MAC %s", p.Metadata.Name, out, err, want)
		}
		if out, err := n.exec(p.Metadata.Name, "ls", "/sys/class/net"); err != nil || !strings.Contains(out, "vpcni-svc") {
			t.Errorf("%s: interfaces %q %v, want eth0 and the service veth vpcni-svc", p.Metadata.Name, out, err)
		}
	}
	checkPodToPod(t, n, web)
	checkService(t, n, web)
	checkBandwidthRefused(t, n, "macvlan")
	// A hostPort works here too, for a client on the pods' subnet: the pod's
	// address is the subnet's /24 in the result, so portmap's hairpin SNAT
	// masquerades such a client to the node, and the pod answers it
	// through its service veth.
	checkHostPort(t, n)
	for _, p := range web {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if got, err := fetch(legacyNS, netip.AddrPortFrom(ip, 8080), 3*time.Second); err != nil || got != p.Metadata.Name {
			t.Errorf("legacy VM -> %s (%s): %q %v", p.Metadata.Name, ip, got, err)
		}
	}
	t.Logf("vpcni-test: macvlan mode through the DaemonSet: %d pods with their own MACs, pod->pod, pod->ClusterIP and legacy VM->pod answered", len(web))
}

func checkAddresses(t *testing.T, n *node, web []pod) {
	pas := n.podAddresses()
	onPort := n.portIPs()
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	allocated := map[string]string{}
	for _, a := range st.Allocations {
		allocated[a.Address.String()] = a.PodNamespace + "/" + a.PodName
	}
	seen := map[string]bool{}
	for _, p := range web {
		key := p.Metadata.Namespace + "/" + p.Metadata.Name
		ip := p.Status.PodIP
		if seen[ip] {
			t.Errorf("%s: address %s given twice", key, ip)
		}
		seen[ip] = true
		if got := p.Metadata.Annotations[nodeside.AnnotationIP]; got != ip {
			t.Errorf("%s: annotation %s=%q, pod IP %s", key, nodeside.AnnotationIP, got, ip)
		}
		if p.Metadata.Annotations[nodeside.AnnotationMAC] == "" || p.Metadata.Annotations[nodeside.AnnotationGateway] != "169.254.1.1" ||
			p.Metadata.Annotations[nodeside.AnnotationInterface] != "eth0" || p.Metadata.Annotations[nodeside.AnnotationProviderPort] != n.lab.Nodes[0].PortID {
			t.Errorf("%s: annotations %v", key, p.Metadata.Annotations)
		}
		if pa, ok := pas[key]; !ok || pa.Address != ip || pa.PodUID != p.Metadata.UID {
			t.Errorf("%s: PodAddress %+v (present %v), want address %s uid %s", key, pa, ok, ip, p.Metadata.UID)
		}
		if !onPort[ip] {
			t.Errorf("%s: %s is not on the node's VM port in the cloud", key, ip)
		}
		if allocated[ip] != key {
			t.Errorf("%s: the agent's store gives %s to %q", key, ip, allocated[ip])
		}
	}
	var node struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	eventually(t, 30*time.Second, "node pool annotations", func() (bool, string) {
		if err := n.getJSON(&node, "get", "node", n.env["VPCNI_K8S_NODE"]); err != nil {
			return false, err.Error()
		}
		a := node.Metadata.Annotations
		alloc, _ := strconv.Atoi(a[nodeside.AnnotationPoolAllocated])
		capacity, _ := strconv.Atoi(a[nodeside.AnnotationPoolCapacity])
		return alloc >= 12 && capacity > alloc, fmt.Sprintf("%v", a)
	})
	t.Logf("vpcni-test: 10 pods: annotations, PodAddresses, agent store and cloud port agree; node: %s=%s %s=%s",
		nodeside.AnnotationPoolAllocated, node.Metadata.Annotations[nodeside.AnnotationPoolAllocated], nodeside.AnnotationPoolCapacity, node.Metadata.Annotations[nodeside.AnnotationPoolCapacity])
}

func checkPodToPod(t *testing.T, n *node, web []pod) {
	for i, p := range web {
		q := web[(i+3)%len(web)]
		out, err := n.get(p.Metadata.Name, q.Status.PodIP+":8080")
		if err != nil || out != q.Metadata.Name {
			t.Errorf("%s -> %s (%s): %q %v", p.Metadata.Name, q.Metadata.Name, q.Status.PodIP, out, err)
		}
	}
	t.Logf("vpcni-test: pod -> pod by IP: %d pairs answered with the right hostname", len(web))
}

func checkService(t *testing.T, n *node, web []pod) {
	clusterIP := strings.TrimSpace(n.mustKubectl("get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"))
	names := map[string]bool{}
	for _, p := range web {
		names[p.Metadata.Name] = true
	}
	answered := map[string]bool{}
	for i := 0; i < 12; i++ {
		out, err := n.get(web[0].Metadata.Name, clusterIP+":80")
		if err != nil {
			t.Fatalf("pod -> Service %s: %v", clusterIP, err)
		}
		name := strings.TrimSpace(out)
		if !names[name] {
			t.Fatalf("Service %s answered %q, not a web pod", clusterIP, name)
		}
		answered[name] = true
	}
	t.Logf("vpcni-test: pod -> ClusterIP %s through kube-proxy: 12 requests, %d different pods answered", clusterIP, len(answered))
}

func checkDeleteReleases(t *testing.T, n *node) {
	before := n.pods("default", "app=web")
	n.mustKubectl("scale", "deploy/web", "--replicas=4")
	kept := n.waitReady("default", "app=web", 4, 2*time.Minute)
	keptIPs := map[string]bool{}
	for _, p := range kept {
		keptIPs[p.Status.PodIP] = true
	}
	var gone []string
	for _, p := range before {
		if !keptIPs[p.Status.PodIP] {
			gone = append(gone, p.Status.PodIP)
		}
	}
	if len(gone) != 6 {
		t.Fatalf("%d addresses of deleted pods, want 6", len(gone))
	}
	eventually(t, 30*time.Second, "PodAddresses of deleted pods removed", func() (bool, string) {
		web := 0
		for k := range n.podAddresses() {
			if strings.HasPrefix(k, "default/web-") {
				web++
			}
		}
		return web == 4, fmt.Sprintf("%d web PodAddresses", web)
	})
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Allocations {
		if slices.Contains(gone, a.Address.String()) {
			t.Errorf("the store still allocates %s to %s/%s", a.Address, a.PodNamespace, a.PodName)
		}
	}
	// The cloud: after the cooldown and the surplus grace, the node gives
	// back what it holds beyond maxFree (6) free addresses.
	eventually(t, 90*time.Second, "surplus addresses back in the cloud", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		held := len(n.portIPs()) - 1 // the node's own address
		return held <= st.Pool.Allocated+6, fmt.Sprintf("port holds %d pod addresses, %d allocated, pool %+v", held, st.Pool.Allocated, st.Pool)
	})
	t.Logf("vpcni-test: scaled 10 -> 4: 6 addresses released (store, PodAddresses), cloud port back to allocated+maxFree")
}

func checkAgentRestart(t *testing.T, n *node) {
	web := n.pods("default", "app=web")
	before, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	// Traffic from the legacy VM to a pod, all through the restart.
	target := netip.AddrPortFrom(netip.MustParseAddr(web[0].Status.PodIP), 8080)
	ok, failed := probeLegacy(target, func() {
		old := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
		n.mustKubectl("-n", "vpcni-system", "delete", "pod", old, "--wait=true")
		n.waitNewAgent(old)
	})
	if failed > 0 || ok == 0 {
		t.Errorf("legacy VM -> pod during the agent restart: %d ok, %d failed", ok, failed)
	}
	after, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held(before), held(after)) {
		t.Errorf("the restarted agent holds other allocations:\nbefore %v\nafter  %v", held(before), held(after))
	}
	for i, p := range web {
		q := web[(i+1)%len(web)]
		if out, err := n.get(p.Metadata.Name, q.Status.PodIP+":8080"); err != nil || out != q.Metadata.Name {
			t.Errorf("after the restart %s -> %s: %q %v", p.Metadata.Name, q.Metadata.Name, out, err)
		}
	}
	t.Logf("vpcni-test: agent pod deleted and restarted: %d probes from the legacy VM, 0 failed; %d allocations adopted", ok, len(after.Allocations))
}

// probeLegacy fetches target from the legacy VM every 100 ms while during
// runs, and 2 s after, and counts the answers and the failures.
func probeLegacy(target netip.AddrPort, during func()) (ok, failed int) {
	stop := make(chan struct{})
	result := make(chan [2]int, 1)
	go func() {
		ok, failed := 0, 0
		for {
			select {
			case <-stop:
				result <- [2]int{ok, failed}
				return
			default:
			}
			if _, err := fetch(legacyNS, target, time.Second); err == nil {
				ok++
			} else {
				failed++
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	func() {
		defer close(stop) // also when during fails the test (runtime.Goexit)
		during()
		time.Sleep(2 * time.Second)
	}()
	r := <-result
	return r[0], r[1]
}

// waitNewAgent waits for the one agent pod to be another than old, and
// Ready.
func (n *node) waitNewAgent(old string) {
	eventually(n.t, 2*time.Minute, "a new agent pod Ready", func() (bool, string) {
		ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
		return len(ps) == 1 && ps[0].Metadata.Name != old && ps[0].ready(), fmt.Sprintf("%d agent pods", len(ps))
	})
}

// held lists an agent's allocations as address=container, sorted.
func held(st *api.State) []string {
	var s []string
	for _, a := range st.Allocations {
		s = append(s, a.Address.String()+"="+a.ContainerID)
	}
	sort.Strings(s)
	return s
}

// checkFailureEvent makes the cloud fail while the pool is empty: new pods
// cannot get an address, and the pod says why in an event. Once the cloud
// answers again, they start.
func checkFailureEvent(t *testing.T, n *node) {
	eventually(t, 30*time.Second, "the agent ready with its pool filled", func() (bool, string) {
		st, err := n.agentState()
		return err == nil && st.Pool.Free > 0, fmt.Sprintf("%v", err)
	})
	n.proxy.SetFaults(faultproxy.Faults{ServerError: 1})
	defer n.proxy.SetFaults(faultproxy.Faults{})
	n.mustKubectl("scale", "deploy/web", "--replicas=14")
	msg := n.waitSetupFailed("web-")
	if !strings.Contains(msg, "try again later") || !strings.Contains(msg, "provider") {
		t.Errorf("the event does not say what failed and what to do: %s", msg)
	}
	t.Logf("vpcni-test: event on the pod: %s", msg)
	n.proxy.SetFaults(faultproxy.Faults{})
	n.waitReady("default", "app=web", 14, 3*time.Minute)
	t.Log("vpcni-test: the cloud answers again: all 14 pods Ready")
}

// checkOrphans: with the agent gone, a pod is force-deleted (the runtime's
// DEL cannot reach vpcni); vpcni-controller deletes its PodAddress, and
// the agent releases the address when it is back.
func checkOrphans(t *testing.T, n *node) {
	victim := n.pods("default", "app=web")[0]
	ip := victim.Status.PodIP
	key := "default/" + victim.Metadata.Name
	if _, ok := n.podAddresses()[key]; !ok {
		t.Fatalf("no PodAddress for %s", key)
	}
	n.mustKubectl("-n", "vpcni-system", "patch", "daemonset", "vpcnid", "--type=merge", "-p", `{"spec":{"template":{"spec":{"nodeSelector":{"vpcni.io/e2e-agent":"off"}}}}}`)
	eventually(t, 2*time.Minute, "the agent gone", func() (bool, string) {
		ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
		return len(ps) == 0, fmt.Sprintf("%d agent pods", len(ps))
	})
	n.mustKubectl("delete", "pod", victim.Metadata.Name, "--grace-period=0", "--force")
	eventually(t, time.Minute, "vpcni-controller deletes the PodAddress of the gone pod", func() (bool, string) {
		_, ok := n.podAddresses()[key]
		return !ok, "still there"
	})
	t.Logf("vpcni-test: agent down, %s force-deleted: the controller deleted its PodAddress", key)
	n.mustKubectl("-n", "vpcni-system", "patch", "daemonset", "vpcnid", "--type=json", "-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]`)
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcnid", 1, 2*time.Minute)
	eventually(t, 2*time.Minute, "the address of the gone pod released", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		for _, a := range st.Allocations {
			if a.Address.String() == ip && a.PodName == victim.Metadata.Name {
				return false, "still allocated to " + a.PodName
			}
		}
		return true, ""
	})
	n.waitReady("default", "app=web", 14, 3*time.Minute)
	t.Logf("vpcni-test: the agent is back: %s (of %s) released; the Deployment is whole again", ip, key)
}

// checkSNATTable: the agent in its image wrote the SNAT table through nft
// (knftables runs the binary the image carries), with every pod's address
// in its pods set.
func checkSNATTable(t *testing.T, n *node, web []pod) {
	out, err := run(t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", "nft", "list", "table", "ip", "vpcni_snat")
	if err != nil {
		logs, _ := n.kubectl("-n", "vpcni-system", "logs", "-l", "app.kubernetes.io/name=vpcnid", "--tail=40")
		t.Fatalf("the node has no SNAT table: %v\n%s\nagent log:\n%s", err, out, logs)
	}
	for _, p := range web {
		if !strings.Contains(out, p.Status.PodIP) {
			t.Errorf("pod %s (%s) is not in the SNAT table's pods set:\n%s", p.Metadata.Name, p.Status.PodIP, out)
		}
	}
	if !strings.Contains(out, "10.90.0.0/24") || !strings.Contains(out, "masquerade") {
		t.Errorf("SNAT table lacks the VPC CIDR or its masquerade rule:\n%s", out)
	}
}
