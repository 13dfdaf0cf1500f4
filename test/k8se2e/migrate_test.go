package k8se2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

// oldManifest is a Deployment started before vpcni, on the node's
// previous CNI.
const oldManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: old
spec:
  replicas: 3
  selector:
    matchLabels: {app: old}
  template:
    metadata:
      labels: {app: old}
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
`

// TestMigrateFromBridge replaces a running CNI, Debian's bridge plugin
// with host-local addresses from the node's podCIDR, with vpcni, as
// docs/install-bare-metal.md's "Replacing another CNI" says: vpcni is
// installed as usual (kubectl apply -k deploy/) over a node whose pods run
// on the bridge. vpcni's 00-vpcni.conflist sorts before the bridge's
// 10-vpcni-k8s-bridge.conflist, so new pods get vpcni addresses; the old
// pods keep running on their bridge addresses, reachable from the node and
// from the new pods and back; then a rollout restart replaces them: the
// runtime sends each old pod's DEL to vpcni, which never wired it, and
// must answer it without touching an address of its own (no pod stuck
// Terminating), and the new replicas come up on vpcni.
func TestMigrateFromBridge(t *testing.T) {
	n := upNode(t)
	script := filepath.Join(repo, "scripts/k8s-node.sh")
	bridgeConf := strings.TrimSpace(lastLine(mustRun(t, nil, "bash", script, "cni", "bridge")))
	// A cluster that ran another CNI registered its nodes without vpcni's
	// taint; the fixture's kubelet registers with it (deploy/'s advice).
	n.mustKubectl("taint", "node", n.env["VPCNI_K8S_NODE"], nodeside.TaintNotReady+":NoSchedule-")
	eventually(t, time.Minute, "the node Ready on the bridge plugin", func() (bool, string) { return n.nodeReady(), "NotReady" })
	bridgeNet := netip.MustParsePrefix("10.244.0.0/16")
	vpcniNet := netip.PrefixFrom(n.lab.Nodes[0].IP, 24).Masked()

	start := time.Now()
	n.apply(fmt.Sprintf(oldManifest, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	old := n.waitReady("default", "app=old", 3, 2*time.Minute)
	checkOn(t, old, bridgeNet, "bridge")
	t.Logf("vpcni-test: 3 pods on Debian's bridge plugin (%s) Ready in %s", filepath.Base(bridgeConf), time.Since(start).Round(100*time.Millisecond))

	// Step 1 of the procedure: install vpcni as usual.
	n.overlay = n.writeOverlay("5s", 64, true)
	applied := time.Now()
	n.mustKubectl("apply", "-k", n.overlay)
	// The node is Ready all along (the bridge's list): installed is when
	// vpcni's list is there and vpcni serves.
	conf := filepath.Join(n.env["VPCNI_K8S_CNI_CONF_HOST_DIR"], cniinstall.DefaultName)
	eventually(t, 2*time.Minute, "vpcni's conflist in the node's CNI dir", func() (bool, string) { return fileExists(conf), "not yet" })
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcnid", 1, 2*time.Minute)
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 2*time.Minute)
	n.waitWebhook(time.Minute)
	t.Logf("vpcni-test: vpcni installed over the bridge plugin in %s (conflist, agent, controller, webhook)", time.Since(applied).Round(100*time.Millisecond))
	n.checkOneConflist(t, "installed over the bridge plugin", cniinstall.DefaultName)
	if !fileExists(bridgeConf) {
		t.Fatalf("vpcni removed the bridge's %s: another CNI's file is not vpcni's to delete", bridgeConf)
	}
	logs := n.mustKubectl("-n", "vpcni-system", "logs", "daemonset/vpcnid", "-c", "vpcnid")
	if !strings.Contains(logs, "unused while vpcni's sorts first") || !strings.Contains(logs, filepath.Base(bridgeConf)) {
		t.Errorf("the agent's log does not name the bridge's %s as unused:\n%s", filepath.Base(bridgeConf), logs)
	}
	if ev := n.mustKubectl("get", "events", "-A", "--field-selector", "reason="+nodeside.EventConflistShadowed, "-o", "name"); strings.TrimSpace(ev) != "" {
		t.Errorf("%s with vpcni's list first: %s", nodeside.EventConflistShadowed, ev)
	}

	// New pods: vpcni.
	web := n.runWeb()
	checkOn(t, web, vpcniNet, "vpcni")
	// Old pods: untouched, and reachable both ways.
	if now := n.pods("default", "app=old"); !samePods(old, now) {
		t.Fatalf("the bridge pods changed once vpcni was installed:\nbefore %v\nafter  %v", podIPs(old), podIPs(now))
	}
	for i, o := range old {
		ip := netip.MustParseAddr(o.Status.PodIP)
		if got, err := fetch(nodeNS, netip.AddrPortFrom(ip, 8080), 3*time.Second); err != nil || got != o.Metadata.Name {
			t.Errorf("node -> bridge pod %s (%s): %q %v", o.Metadata.Name, ip, got, err)
		}
		w := web[i]
		if got, err := n.get(w.Metadata.Name, o.Status.PodIP+":8080"); err != nil || got != o.Metadata.Name {
			t.Errorf("vpcni pod %s -> bridge pod %s (%s): %q %v", w.Metadata.Name, o.Metadata.Name, o.Status.PodIP, got, err)
		}
		if got, err := n.get(o.Metadata.Name, w.Status.PodIP+":8080"); err != nil || got != w.Metadata.Name {
			t.Errorf("bridge pod %s -> vpcni pod %s (%s): %q %v", o.Metadata.Name, w.Metadata.Name, w.Status.PodIP, got, err)
		}
	}
	t.Logf("vpcni-test: with vpcni installed: 10 new pods on vpcni (%s), the 3 bridge pods unchanged and reachable from the node, from vpcni pods and back", vpcniNet)

	// Step 2: the old pods are replaced (here by a rollout restart).
	before, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	dels := n.cniCount("DEL", "ok")
	restarted := time.Now()
	n.mustKubectl("rollout", "restart", "deployment/old")
	var now []pod
	eventually(t, 2*time.Minute, "the old pods replaced, none left Terminating", func() (bool, string) {
		now = n.pods("default", "app=old")
		ready := 0
		for _, p := range now {
			if slices.ContainsFunc(old, func(o pod) bool { return o.Metadata.Name == p.Metadata.Name }) {
				return false, p.Metadata.Name + " still there"
			}
			if p.ready() {
				ready++
			}
		}
		return len(now) == 3 && ready == 3, fmt.Sprintf("%d pods, %d ready", len(now), ready)
	})
	checkOn(t, now, vpcniNet, "vpcni")
	// vpcni-controller's pods, created with the agent, may have started
	// on the bridge before the agent wrote its list: they are old pods too.
	if ctl := n.pods("vpcni-system", "app.kubernetes.io/name=vpcni-controller"); slices.ContainsFunc(ctl, func(p pod) bool { return onNet(p, bridgeNet) }) {
		t.Logf("vpcni-test: vpcni-controller started on the bridge (%v): restarted too", podIPs(ctl))
		n.mustKubectl("-n", "vpcni-system", "rollout", "restart", "deployment/vpcni-controller")
	}
	eventually(t, 2*time.Minute, "no pod left on the bridge", func() (bool, string) {
		var all podList
		if err := n.getJSON(&all, "get", "pods", "-A"); err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range all.Items {
			if onNet(p, bridgeNet) {
				left = append(left, p.Metadata.Namespace+"/"+p.Metadata.Name+"="+p.Status.PodIP)
			}
		}
		return len(left) == 0, fmt.Sprintf("%v", left)
	})
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 2*time.Minute)
	if got := n.cniCount("DEL", "ok") - dels; got < 3 {
		t.Errorf("vpcni answered %d DELs while 3 bridge pods were deleted: the runtime did not send their DEL to vpcni", got)
	}
	after, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	// Every allocation the agent held before is still held: the DEL of a
	// container it never saw released nothing.
	kept := held(after)
	for _, h := range held(before) {
		if !slices.Contains(kept, h) {
			t.Errorf("allocation %s gone after the bridge pods' DEL (held now: %v)", h, kept)
		}
	}
	t.Logf("vpcni-test: rollout restart of the bridge pods: replaced in %s, their DEL answered by vpcni (%d ok DELs), no allocation of vpcni's touched; the new replicas on vpcni, no pod left on the bridge",
		time.Since(restarted).Round(100*time.Millisecond), n.cniCount("DEL", "ok")-dels)
}

// checkOn fails unless every pod's address is in net.
func checkOn(t *testing.T, ps []pod, net netip.Prefix, what string) {
	t.Helper()
	for _, p := range ps {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !net.Contains(ip) {
			t.Errorf("%s has address %q, not one of %s (%s)", p.Metadata.Name, p.Status.PodIP, what, net)
		}
	}
}

// onNet: p has an address, in net.
func onNet(p pod, net netip.Prefix) bool {
	ip, err := netip.ParseAddr(p.Status.PodIP)
	return err == nil && net.Contains(ip)
}

func podIPs(ps []pod) []string {
	var s []string
	for _, p := range ps {
		s = append(s, p.Metadata.Name+"="+p.Status.PodIP)
	}
	return s
}

// samePods: the same pods, with the same addresses, all still Ready.
func samePods(a, b []pod) bool {
	if !slices.Equal(podIPs(a), podIPs(b)) {
		return false
	}
	for _, p := range b {
		if !p.ready() {
			return false
		}
	}
	return true
}

var cniCountLine = regexp.MustCompile(`^vpcni_cni_request_duration_seconds_count\{([^}]*)\} (\S+)$`)

// cniCount is how many requests of verb with result the node's agent has
// served, from its metrics.
func (n *node) cniCount(verb, result string) int {
	out := mustRun(n.t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", "curl", "-fsS", "http://127.0.0.1:19695/metrics")
	total := 0
	for _, line := range strings.Split(out, "\n") {
		m := cniCountLine.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[1], `verb="`+verb+`"`) || !strings.Contains(m[1], `result="`+result+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			n.t.Fatalf("metric line %q: %v", line, err)
		}
		total += int(v)
	}
	return total
}
