package k8se2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestK8sBench measures, on the same node in the same run, how long a
// 10-pod Deployment takes from `kubectl apply` to all Ready with Debian's
// bridge plugin and with vpcni (alternating rounds, medians), then the
// agent's memory with 100 pods, and what iperf3 from the legacy VM gets
// through a pod's bandwidth annotations. `make bench` runs it
// (VPCNI_K8S_BENCH=1) with VPCNI_K8S_BENCH_ROUNDS=0: the 10-pod rounds are
// too small to tell the plugins apart, TestPodStartup (2 x 100 pods on two
// nodes) measures that now. It prints the lines
//
//	bandwidth: limit_mbit=L egress_mbit=E ingress_mbit=I egress_ratio=.. ingress_ratio=..
//	k8s-bench: vpcni_ready_s=X bridge_ready_s=Y agent_rss_mb_100pods=Z
//
// (without the two rounds' figures when there were no rounds).
func TestK8sBench(t *testing.T) {
	if os.Getenv("VPCNI_K8S_BENCH") == "" {
		t.Skip("vpcni-test: the Kubernetes benchmark runs from make bench (VPCNI_K8S_BENCH=1); NOT RUN here")
	}
	rounds := 3
	if s := os.Getenv("VPCNI_K8S_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	n := upNode(t)
	script := filepath.Join(repo, "scripts/k8s-node.sh")
	busybox := n.env["VPCNI_K8S_BUSYBOX_IMAGE"]

	// vpcni first: its init step writes its conflist once. Then rounds
	// alternate: Debian's bridge conflist sorts before vpcni's, so while it
	// is there containerd uses it; removed (after its pods are gone), vpcni
	// serves again.
	n.overlay = n.writeOverlay("30s", 128, false)
	n.dropNodeChainedPlugins() // the image's portmap and bandwidth are measured
	n.mustKubectl("apply", "-k", n.overlay)
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcnid", 1, 3*time.Minute)
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 3*time.Minute)
	var bridge, vpcni []float64
	for i := 0; i < rounds; i++ {
		bridgeConf := strings.TrimSpace(mustRun(t, nil, "bash", script, "cni", "bridge"))
		time.Sleep(2 * time.Second) // containerd reloads its CNI config
		t.Log("Debian's bridge plugin:")
		bridge = append(bridge, n.readyRounds(1, busybox, netip.MustParsePrefix("10.244.0.0/16"))...)
		if err := os.Remove(bridgeConf); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		t.Log("vpcni:")
		vpcni = append(vpcni, n.readyRounds(1, busybox, netip.MustParsePrefix(n.env["VPCNI_K8S_NODE_IP"]+"/24").Masked())...)
	}

	// The bandwidth annotations through the chained plugin, from the
	// legacy VM (prints the bandwidth: line).
	checkBandwidth(t, n)

	start := time.Now()
	n.apply(fmt.Sprintf(webManifest, 100, busybox))
	n.waitReady("default", "app=web", 100, 10*time.Minute)
	t.Logf("100 pods Ready in %s", time.Since(start).Round(100*time.Millisecond))
	time.Sleep(5 * time.Second) // the agent's annotations and PodAddresses settle
	rss, pid := agentRSS(t)
	t.Logf("vpcnid (pid %d) RSS with 100 pods: %.1f MB", pid, rss)
	if rounds == 0 {
		fmt.Printf("k8s-bench: agent_rss_mb_100pods=%.1f\n", rss)
		return
	}
	fmt.Printf("bench: bridge rounds %v s, vpcni rounds %v s\n", bridge, vpcni)
	fmt.Printf("k8s-bench: vpcni_ready_s=%.2f bridge_ready_s=%.2f agent_rss_mb_100pods=%.1f\n", median(vpcni), median(bridge), rss)
}

// readyRounds times apply -> all 10 Ready, checks the pods' addresses
// came from the plugin under test (within want), then deletes the
// Deployment and waits for its pods to be gone, rounds times.
func (n *node) readyRounds(rounds int, image string, want netip.Prefix) []float64 {
	var secs []float64
	for i := 0; i < rounds; i++ {
		start := time.Now()
		n.apply(fmt.Sprintf(webManifest, 10, image))
		pods := n.waitReady("default", "app=web", 10, 5*time.Minute)
		secs = append(secs, time.Since(start).Seconds())
		for _, p := range pods {
			if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !want.Contains(ip) {
				n.t.Fatalf("%s has address %q, not from %s: the wrong CNI served it", p.Metadata.Name, p.Status.PodIP, want)
			}
		}
		n.t.Logf("10 pods Ready %.2fs after kubectl apply", secs[len(secs)-1])
		n.mustKubectl("delete", "deploy/web", "svc/web", "--wait=true")
		eventually(n.t, 3*time.Minute, "web pods gone", func() (bool, string) {
			ps := n.pods("default", "app=web")
			return len(ps) == 0, fmt.Sprintf("%d pods", len(ps))
		})
	}
	return secs
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// agentRSS finds the vpcnid process running in the node's network
// namespace and reads its resident memory.
func agentRSS(t *testing.T) (float64, int) {
	nodeIno, err := os.Stat(filepath.Join("/run/netns", nodeNS))
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, err := os.Readlink(p + "/exe")
		if err != nil || filepath.Base(exe) != "vpcnid" {
			continue
		}
		ns, err := os.Stat(p + "/ns/net")
		if err != nil || !os.SameFile(ns, nodeIno) {
			continue
		}
		status, err := os.ReadFile(p + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				pid, _ := strconv.Atoi(filepath.Base(p))
				return kb / 1024, pid
			}
		}
	}
	t.Fatal("no vpcnid process in the node's namespace")
	return 0, 0
}
