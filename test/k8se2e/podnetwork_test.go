package k8se2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

// staticNetRange is the static PodNetwork's range in TestBlocksInstall: a
// routed range as the node's blocks range (blocksRange) is, apart from it
// and from the lab's segment, so nothing else on the node hands it out.
const staticNetRange = "10.20.16.0/24"

// staticNetManifest is a static PodNetwork (name, range, gateway) and the
// namespace it selects by a label (its own name).
const staticNetManifest = `apiVersion: vpcni.io/v1alpha1
kind: PodNetwork
metadata:
  name: %[1]s
spec:
  namespaceSelector:
    matchLabels: {vpcni-e2e/network: %[1]s}
  static:
    ranges: [%[2]s]
    gateway: %[3]s
---
apiVersion: v1
kind: Namespace
metadata:
  name: %[4]s
  labels: {vpcni-e2e/network: %[1]s}
`

// plainNamespace is a namespace no PodNetwork selects.
const plainNamespace = `apiVersion: v1
kind: Namespace
metadata:
  name: pn-plain
`

const staticNetWeb = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: pnweb
  namespace: %s
spec:
  replicas: %d
  selector:
    matchLabels: {app: pnweb}
  template:
    metadata:
      labels: {app: pnweb}
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

// checkStaticPodNetwork: a PodNetwork with a static range selects a
// labelled namespace; vpcni-controller's webhook records it on the pods of
// a Deployment there, and the agent gives them addresses of its range
// (not of the node's blocks), reachable from the node, from each other and
// from a pod of the default network (web, in default). A pod of another
// namespace stays on the node's blocks. The agent's state lists the
// network's pool. Everything it made is deleted at the end.
func checkStaticPodNetwork(t *testing.T, n *node, web []pod) {
	start := time.Now()
	netRange := netip.MustParsePrefix(staticNetRange)
	gateway := netRange.Addr().Next()
	n.apply(fmt.Sprintf(staticNetManifest, "e2e-static", netRange, gateway, "pn-static") + "---\n" + plainNamespace)
	t.Cleanup(func() {
		_, _ = n.kubectl("delete", "namespace", "pn-static", "pn-plain", "--wait=true", "--timeout=1m")
		_, _ = n.kubectl("delete", "podnetwork", "e2e-static", "--wait=true", "--timeout=30s")
	})
	// The webhook chooses from its caches of PodNetworks and namespaces:
	// a server-side dry run of a pod (admission runs, nothing is made)
	// says when they have the new ones.
	eventually(t, 30*time.Second, "the webhook choosing e2e-static for a pod in pn-static", func() (bool, string) {
		out, err := n.kubectl("-n", "pn-static", "run", "probe", "--image=none", "--restart=Never", "--dry-run=server", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		var p pod
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			return false, err.Error()
		}
		got := p.Metadata.Annotations[v1alpha1.AnnotationNetwork]
		return got == "e2e-static", fmt.Sprintf("%s=%q", v1alpha1.AnnotationNetwork, got)
	})
	busybox := n.env["VPCNI_K8S_BUSYBOX_IMAGE"]
	n.apply(fmt.Sprintf(staticNetWeb, "pn-static", 2, busybox) + "---\n" + fmt.Sprintf(staticNetWeb, "pn-plain", 1, busybox))
	onNet := n.waitReady("pn-static", "app=pnweb", 2, time.Minute)
	plain := n.waitReady("pn-plain", "app=pnweb", 1, time.Minute)
	t.Logf("vpcni-test: static PodNetwork: 2 pods in pn-static and 1 in pn-plain Ready %s after the PodNetwork was created", time.Since(start).Round(100*time.Millisecond))

	var blocks []netip.Prefix
	for _, b := range n.nodeBlocks(n.env["VPCNI_K8S_NODE"]) {
		blocks = append(blocks, netip.MustParsePrefix(b))
	}
	for _, p := range onNet {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if !netRange.Contains(ip) || ip == gateway {
			t.Errorf("%s/%s has %s, not an address of PodNetwork e2e-static's %s", p.Metadata.Namespace, p.Metadata.Name, ip, netRange)
		}
		if got := p.Metadata.Annotations[v1alpha1.AnnotationNetwork]; got != "e2e-static" {
			t.Errorf("%s/%s: %s=%q, want e2e-static", p.Metadata.Namespace, p.Metadata.Name, v1alpha1.AnnotationNetwork, got)
		}
	}
	for _, p := range plain {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if !slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return b.Contains(ip) }) {
			t.Errorf("%s/%s (no PodNetwork) has %s, outside the node's blocks %v", p.Metadata.Namespace, p.Metadata.Name, ip, blocks)
		}
		if got, ok := p.Metadata.Annotations[v1alpha1.AnnotationNetwork]; ok {
			t.Errorf("%s/%s: %s=%q on a pod no PodNetwork selects", p.Metadata.Namespace, p.Metadata.Name, v1alpha1.AnnotationNetwork, got)
		}
	}

	// Reachable as the default network's pods are: from the node, from
	// each other, from and to a pod of the default network.
	for i, p := range onNet {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if got, err := fetch(nodeNS, netip.AddrPortFrom(ip, 8080), 3*time.Second); err != nil || got != p.Metadata.Name {
			t.Errorf("node -> %s (%s): %q %v", p.Metadata.Name, ip, got, err)
		}
		q := onNet[(i+1)%len(onNet)]
		if got, err := n.getIn("pn-static", p.Metadata.Name, q.Status.PodIP+":8080"); err != nil || got != q.Metadata.Name {
			t.Errorf("%s -> %s (%s): %q %v", p.Metadata.Name, q.Metadata.Name, q.Status.PodIP, got, err)
		}
		if got, err := n.get(web[0].Metadata.Name, p.Status.PodIP+":8080"); err != nil || got != p.Metadata.Name {
			t.Errorf("default network's %s -> %s (%s): %q %v", web[0].Metadata.Name, p.Metadata.Name, p.Status.PodIP, got, err)
		}
		if got, err := n.getIn("pn-static", p.Metadata.Name, web[0].Status.PodIP+":8080"); err != nil || got != web[0].Metadata.Name {
			t.Errorf("%s -> default network's %s (%s): %q %v", p.Metadata.Name, web[0].Metadata.Name, web[0].Status.PodIP, got, err)
		}
	}

	if ev := n.mustKubectl("-n", "pn-static", "get", "events", "--field-selector", "reason="+nodeside.EventPodNetworkNotServed, "-o", "name"); strings.TrimSpace(ev) != "" {
		t.Errorf("%s on pods the agent put on their PodNetwork: %s", nodeside.EventPodNetworkNotServed, ev)
	}
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.PodNetworks, func(p api.PodNetworkState) bool { return p.Name == "e2e-static" })
	if i < 0 {
		t.Fatalf("the agent's state lists no PodNetwork e2e-static: %+v", st.PodNetworks)
	}
	pn := st.PodNetworks[i]
	if pn.Pool.Allocated != 2 || !pn.Ready || !strings.Contains(pn.Source, staticNetRange) {
		t.Errorf("the agent's pool of e2e-static: %+v; want 2 allocated, ready, its range as its source", pn)
	}
	t.Logf("vpcni-test: static PodNetwork e2e-static (%s): pods %s on it, annotated, reachable from the node, each other and the default network; pn-plain's pod on the node's blocks (%s); agent pool %d allocated, %d free (%s)",
		netRange, podIPs(onNet), plain[0].Status.PodIP, pn.Pool.Allocated, pn.Pool.Free, time.Since(start).Round(100*time.Millisecond))
}

// getIn is get from a pod of namespace ns.
func (n *node) getIn(ns, pod, hostport string) (string, error) {
	host, port, _ := strings.Cut(hostport, ":")
	out, err := n.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s %s`, host, port))
	if err != nil {
		return out, err
	}
	head, body, _ := strings.Cut(out, "\r\n\r\n")
	if !strings.Contains(head, " 200") {
		return out, fmt.Errorf("answer %q", out)
	}
	return strings.TrimSpace(body), nil
}

// smallNetRange is checkPodNetworkCapacity's PodNetwork: a /29 whose
// gateway is its first address holds 5 pods.
const (
	smallNetRange = "10.20.17.0/29"
	smallNetRoom  = 5
)

// checkPodNetworkCapacity: the scheduler places a PodNetwork's pods only
// where the network has room. The node advertises pn.vpcni.io/e2e-small
// (what its range holds) before any pod of it; a Deployment of two more
// replicas than that in the selected namespace gets that many Ready, on
// the network, and the others Pending, unschedulable for
// "Insufficient pn.vpcni.io/e2e-small" — not stuck in ContainerCreating on
// a node that has no address for them.
func checkPodNetworkCapacity(t *testing.T, n *node) {
	start := time.Now()
	netRange := netip.MustParsePrefix(smallNetRange)
	n.apply(fmt.Sprintf(staticNetManifest, "e2e-small", netRange, netRange.Addr().Next(), "pn-small"))
	t.Cleanup(func() {
		_, _ = n.kubectl("delete", "namespace", "pn-small", "--wait=true", "--timeout=1m")
		_, _ = n.kubectl("delete", "podnetwork", "e2e-small", "--wait=true", "--timeout=30s")
	})
	res, _ := k8s.NetworkResource("e2e-small")
	n.waitNetworkRoom(t, res, smallNetRoom)
	t.Logf("vpcni-test: PodNetwork e2e-small (%s) created; node advertises %s=%d after %s, before any pod of it", netRange, res, smallNetRoom, time.Since(start).Round(100*time.Millisecond))

	replicas := smallNetRoom + 2
	n.apply(fmt.Sprintf(staticNetWeb, "pn-small", replicas, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	var ready, pending []corev1.Pod
	eventually(t, 2*time.Minute, fmt.Sprintf("%d pods Ready, %d Pending unschedulable", smallNetRoom, replicas-smallNetRoom), func() (bool, string) {
		ready, pending = ready[:0], pending[:0]
		var other []string
		for _, p := range n.fullPods("-n", "pn-small", "-l", "app=pnweb") {
			switch {
			case podReady(&p):
				ready = append(ready, p)
			case p.Status.Phase == corev1.PodPending && p.Spec.NodeName == "" && unschedulable(&p) != "":
				pending = append(pending, p)
			default:
				other = append(other, fmt.Sprintf("%s %s node=%q", p.Name, p.Status.Phase, p.Spec.NodeName))
			}
		}
		return len(ready) == smallNetRoom && len(pending) == replicas-smallNetRoom && len(other) == 0,
			fmt.Sprintf("%d ready, %d pending, others %v", len(ready), len(pending), other)
	})
	var ips []string
	for _, p := range ready {
		ips = append(ips, p.Status.PodIP)
		if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !netRange.Contains(ip) {
			t.Errorf("%s has %q, not an address of %s", p.Name, p.Status.PodIP, netRange)
		}
		if !k8s.Requests(&p, res) {
			t.Errorf("%s requests no %s: the webhook did not add it", p.Name, res)
		}
	}
	for _, p := range pending {
		if why := unschedulable(&p); !strings.Contains(why, "Insufficient "+string(res)) {
			t.Errorf("%s Pending for another reason: %s", p.Name, why)
		}
	}
	t.Logf("vpcni-test: %d replicas on e2e-small, room for %d: %d Ready on %s (%s), %d Pending in %s; %s PodScheduled=False: %s",
		replicas, smallNetRoom, len(ready), netRange, strings.Join(ips, " "), len(pending), time.Since(start).Round(100*time.Millisecond), pending[0].Name, unschedulable(&pending[0]))
}
