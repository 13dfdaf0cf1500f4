// Package k8s tests the real-node fixture, scripts/k8s-node.sh: a whole
// single-node Kubernetes (etcd, control plane, containerd, kubelet,
// kube-proxy) inside one lab node's network namespace. With Debian's bridge
// plugin standing in for a CNI it proves the fixture itself: the node is
// NotReady without a conflist and Ready with one, a busybox pod runs and
// gets an address, a ClusterIP Service reaches it through kube-proxy, a pod
// reaches the API through the kubernetes Service, vpcni's image imports and
// runs, and `down` leaves nothing behind.
package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

const (
	prefix = "vpcni-k8s"
	nodeNS = prefix + "-n1"
	state  = "/var/tmp/vpcni-k8s"
)

var repo, _ = filepath.Abs("../..")

func TestMain(m *testing.M) {
	testbed.RequireRoot("the k8s fixture tests")
	os.Exit(m.Run())
}

// script runs scripts/k8s-node.sh with env added and returns its stdout.
func script(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(repo, "scripts/k8s-node.sh")}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("k8s-node.sh %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return script(t, []string{"NETNS=" + nodeNS}, append([]string{"kubectl"}, args...)...)
}

// eventually retries f until it succeeds or the time is up.
func eventually(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readyCondition(t *testing.T) (status, message string) {
	out, err := kubectl(t, "get", "node", nodeNS, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}|{.status.conditions[?(@.type=="Ready")].message}`)
	if err != nil {
		return "", err.Error()
	}
	status, message, _ = strings.Cut(out, "|")
	return status, message
}

// leftovers lists what a stopped fixture must not leave: processes running
// its binaries, mounts under its state dir, the kubelet's cgroups, pod
// network namespaces it did not have before.
func leftovers(netnsBefore []string) []string {
	var left []string
	cache := "/var/cache/vpcni-k8s/"
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Dir(p) + "/cmdline")
		if strings.HasPrefix(exe, cache) || strings.Contains(string(cmdline), state+"/") {
			left = append(left, fmt.Sprintf("process %s %s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		left = append(left, "mounts unknown: "+err.Error())
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 1 && (strings.HasPrefix(f[1], state+"/") || f[1] == state) {
			left = append(left, "mount "+f[1])
		}
	}
	// kubepods, or a joined node's cgroupRoot (k8s-node.sh join)
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(cg) > 0 {
		left = append(left, fmt.Sprintf("cgroups %v", cg))
	}
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/vpcni-node-*"); len(cg) > 0 {
		left = append(left, fmt.Sprintf("cgroups %v", cg))
	}
	for _, ns := range netnsutil.List("") {
		if !slices.Contains(netnsBefore, ns) && !strings.HasPrefix(ns, prefix) {
			left = append(left, "netns "+ns)
		}
	}
	return left
}

// bridgePodYAML's pods tolerate vpcni.io/not-ready: the fixture registers
// the node with that taint (as deploy/ advises), and only vpcni's agent
// removes it; with the bridge plugin no agent runs.
const bridgePodYAML = `
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 1
  tolerations: [{key: vpcni.io/not-ready, operator: Exists, effect: NoSchedule}]
  containers:
  - name: web
    image: vpcni.local/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo vpcni-fixture > /www/index.html && exec httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: vpcni-image
spec:
  restartPolicy: Never
  tolerations: [{key: vpcni.io/not-ready, operator: Exists, effect: NoSchedule}]
  containers:
  - name: vpcni
    image: VPCNI_IMAGE
    imagePullPolicy: Never
    command: ["/usr/local/bin/vpcni"]
    env: [{name: CNI_COMMAND, value: VERSION}]
`

func TestFixtureWithBridgeCNI(t *testing.T) {
	t0 := time.Now()
	if _, err := script(t, nil, "build"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("vpcni-test: k8s-node build (cached unless the first) %.2fs\n", time.Since(t0).Seconds())
	mk := exec.Command("make", "-C", repo, "image")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}

	netnsBefore := netnsutil.List("")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, lab.Config{Prefix: prefix, Nodes: 1, Subnet: netip.MustParsePrefix("10.93.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			if _, err := script(t, nil, "down"); err != nil {
				t.Error(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if ns := netnsutil.List(prefix); len(ns) > 0 {
			t.Errorf("namespaces left after lab down: %v", ns)
		}
	})

	// up without a CNI: the node registers and stays NotReady.
	t0 = time.Now()
	env, err := script(t, []string{"NETNS=" + nodeNS}, "up")
	if err != nil {
		t.Fatal(err)
	}
	upTime := time.Since(t0)
	if !strings.Contains(env, "VPCNI_K8S_KUBECONFIG="+state+"/admin.kubeconfig") || !strings.Contains(env, "VPCNI_K8S_NODE_IP="+l.Nodes[0].IP.String()) {
		t.Fatalf("up printed\n%s", env)
	}
	if conf, _ := filepath.Glob(state + "/cni/net.d/*"); len(conf) != 0 {
		t.Fatalf("up installed a CNI conflist: %v", conf)
	}
	time.Sleep(6 * time.Second) // a node status update (nodeStatusUpdateFrequency 5s)
	if st, msg := readyCondition(t); st == "True" || !strings.Contains(strings.ToLower(msg), "network") {
		t.Fatalf("without a conflist the node is Ready=%q (%s); want NotReady for the network", st, msg)
	}
	fmt.Printf("vpcni-test: k8s-node up (no CNI, node registered, NotReady) %.2fs\n", upTime.Seconds())
	t0 = time.Now()
	if _, err := script(t, []string{"NETNS=" + nodeNS}, "up"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("vpcni-test: k8s-node up again (already up) %.2fs\n", time.Since(t0).Seconds())

	// The bridge conflist makes it Ready.
	t0 = time.Now()
	if _, err := script(t, nil, "cni", "bridge"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "node Ready", func() error {
		if st, msg := readyCondition(t); st != "True" {
			return fmt.Errorf("Ready=%s %s", st, msg)
		}
		return nil
	})
	fmt.Printf("vpcni-test: k8s-node conflist -> Ready %.2fs (up -> Ready %.2fs)\n", time.Since(t0).Seconds(), (upTime + time.Since(t0)).Seconds())

	if _, err := script(t, nil, "import", filepath.Join(repo, "bin/vpcni-image.tar")); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	// make image tags it with the version (bin/vpcni-image.name).
	image, err := os.ReadFile(filepath.Join(repo, "bin/vpcni-image.name"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, []byte(strings.ReplaceAll(bridgePodYAML, "VPCNI_IMAGE", strings.TrimSpace(string(image)))), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if out, err := kubectl(t, "apply", "-f", manifest); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var podIP string
	eventually(t, 90*time.Second, "pod web running with an address", func() error {
		out, err := kubectl(t, "get", "pod", "web", "-o", "jsonpath={.status.phase} {.status.podIP}")
		if err != nil {
			return err
		}
		if f := strings.Fields(out); len(f) == 2 && f[0] == "Running" {
			podIP = f[1]
			return nil
		}
		return fmt.Errorf("pod web: %q", out)
	})
	if ip, err := netip.ParseAddr(podIP); err != nil || !netip.MustParsePrefix("10.244.0.0/24").Contains(ip) {
		t.Fatalf("pod IP %q is not from the bridge conflist's 10.244.0.0/24", podIP)
	}
	fmt.Printf("vpcni-test: k8s-node pod running at %s %.2fs after apply\n", podIP, time.Since(t0).Seconds())

	svcIP, err := kubectl(t, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	// node -> ClusterIP -> pod: kube-proxy's DNAT in the node's namespace
	eventually(t, 60*time.Second, "node reaches the pod through ClusterIP "+svcIP, func() error {
		out, err := netnsutil.Output(nodeNS, "curl", "-fsS", "--max-time", "2", "http://"+svcIP+"/")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.TrimSpace(out) != "vpcni-fixture" {
			return fmt.Errorf("got %q", out)
		}
		return nil
	})
	// pod -> the kubernetes Service -> the API server on the node's address
	eventually(t, 30*time.Second, "pod reaches the API through the kubernetes Service", func() error {
		// Plain HTTP to the TLS port gets Go's "400 Bad Request" answer,
		// which proves the way there and back (the static busybox's wget
		// segfaults in this image, so nc).
		out, _ := kubectl(t, "exec", "web", "--", "sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 10.96.0.1 443 2>&1`)
		if !strings.Contains(out, "400 Bad Request") {
			return fmt.Errorf("HTTP to 10.96.0.1:443: %q", out)
		}
		return nil
	})
	fmt.Printf("vpcni-test: k8s-node ClusterIP %s -> pod %s and pod -> kubernetes Service: ok\n", svcIP, podIP)

	// vpcni's own image (make image) imports and runs.
	eventually(t, 60*time.Second, "pod vpcni-image succeeded", func() error {
		out, err := kubectl(t, "get", "pod", "vpcni-image", "-o", "jsonpath={.status.phase}")
		if err != nil || out != "Succeeded" {
			return fmt.Errorf("phase %q %v", out, err)
		}
		return nil
	})
	if out, err := kubectl(t, "logs", "vpcni-image"); err != nil || !strings.Contains(out, "cniVersion") {
		t.Fatalf("vpcni VERSION in the image printed %q (%v)", out, err)
	}
	fmt.Printf("vpcni-test: k8s-node %s image runs (vpcni VERSION)\n", strings.TrimSpace(string(image)))

	t0 = time.Now()
	downed = true
	if _, err := script(t, nil, "down"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("vpcni-test: k8s-node down %.2fs\n", time.Since(t0).Seconds())
	if left := leftovers(netnsBefore); len(left) > 0 {
		t.Fatalf("down left:\n%s", strings.Join(left, "\n"))
	}
	// Absent only from a listing that worked: a failed command (the
	// namespace gone, a tool missing) proves nothing.
	if out, err := netnsutil.Output(nodeNS, "ip", "-o", "link", "show"); err != nil {
		t.Errorf("list links in %s: %v\n%s", nodeNS, err, out)
	} else if strings.Contains(out, " vpcni-br0:") {
		t.Errorf("down left the bridge in %s:\n%s", nodeNS, out)
	}
	if out, err := netnsutil.Output(nodeNS, "iptables-save"); err != nil {
		t.Errorf("iptables-save in %s: %v\n%s", nodeNS, err, out)
	} else if strings.Contains(out, "KUBE-SERVICES") {
		t.Errorf("down left kube-proxy's rules in %s", nodeNS)
	}
}
