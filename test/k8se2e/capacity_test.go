package k8se2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/faultproxy"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

// fullPods lists pods with their spec and status, as the API has them.
func (n *node) fullPods(args ...string) []corev1.Pod {
	n.t.Helper()
	var l corev1.PodList
	if err := n.getJSON(&l, append([]string{"get", "pods"}, args...)...); err != nil {
		n.t.Fatal(err)
	}
	return l.Items
}

func (n *node) getNode() *corev1.Node {
	n.t.Helper()
	return n.getNodeNamed(n.env["VPCNI_K8S_NODE"])
}

func (n *node) getNodeNamed(name string) *corev1.Node {
	n.t.Helper()
	var nd corev1.Node
	if err := n.getJSON(&nd, "get", "node", name); err != nil {
		n.t.Fatal(err)
	}
	return &nd
}

func ipAllocatable(nd *corev1.Node) (int64, bool) {
	q, ok := nd.Status.Allocatable[k8s.IPResource]
	return q.Value(), ok
}

func notReadyTainted(nd *corev1.Node) bool {
	for _, t := range nd.Spec.Taints {
		if t.Key == nodeside.TaintNotReady && t.Effect == corev1.TaintEffectNoSchedule {
			return true
		}
	}
	return false
}

// podNetwork counts the node's live pods on the pod network that request
// vpcni.io/ip and those that do not.
func (n *node) podNetwork() (requested, unrequested int) {
	for _, p := range n.fullPods("-A") {
		if p.Spec.HostNetwork || p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if k8s.RequestsIP(&p) {
			requested++
		} else {
			unrequested++
		}
	}
	return requested, unrequested
}

// waitWebhook waits until the API server has the webhook (its caBundle and
// a ready replica behind the Service): a server-side dry run of a pod
// comes back with the request added.
func (n *node) waitWebhook(d time.Duration) {
	n.t.Helper()
	eventually(n.t, d, "the webhook mutates pods", func() (bool, string) {
		out, err := n.kubectl("run", "webhook-probe", "--image=none", "--restart=Never", "--dry-run=server", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, string(k8s.IPResource)), "no request in the dry-run pod"
	})
}

// checkIPCapacity proves the scheduler sees vpcni's addresses: pods on the
// pod network request vpcni.io/ip (the webhook), the node advertises what
// it can address, a Deployment larger than that leaves the rest Pending
// (unschedulable, not stuck in ContainerCreating), the node is tainted
// not-ready while its pool is below warmTarget, and the Pending pods start
// once the cloud allows more. With the webhook down, pods are admitted
// without the request and get an event.
func checkIPCapacity(t *testing.T, n *node) {
	nodeName := n.env["VPCNI_K8S_NODE"]
	for _, p := range n.fullPods("-l", "app=web") {
		if !k8s.RequestsIP(&p) {
			t.Errorf("%s requests no %s: the webhook did not mutate it (resources %+v)", p.Name, k8s.IPResource, p.Spec.Containers[0].Resources)
		}
	}
	var alloc int64
	eventually(t, 30*time.Second, "the node advertises capacity less unrequested pods", func() (bool, string) {
		nd := n.getNode()
		_, unrequested := n.podNetwork()
		alloc, _ = ipAllocatable(nd)
		return alloc == int64(64-unrequested) && !notReadyTainted(nd), fmt.Sprintf("allocatable %d, %d unrequested, taints %v", alloc, unrequested, nd.Spec.Taints)
	})
	t.Logf("vpcni-test: every web pod requests %s=1 (webhook); node %s allocatable %s=%d (maxAddresses 64 less pods without the request), no %s taint",
		k8s.IPResource, nodeName, k8s.IPResource, alloc, nodeside.TaintNotReady)

	// The webhook down: a pod is admitted as it is, and its node's agent
	// says so on it.
	n.mustKubectl("-n", "vpcni-system", "scale", "deployment/vpcni-controller", "--replicas=0")
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 0, 2*time.Minute)
	n.mustKubectl("run", "unaccounted", "--image="+n.env["VPCNI_K8S_BUSYBOX_IMAGE"], "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "3600")
	var msg string
	eventually(t, time.Minute, "a "+nodeside.EventIPNotRequested+" event on the pod admitted without the webhook", func() (bool, string) {
		out, err := n.kubectl("get", "events", "--field-selector", "reason="+nodeside.EventIPNotRequested+",involvedObject.name=unaccounted", "-o", "jsonpath={.items[*].message}")
		msg = strings.TrimSpace(out)
		return err == nil && msg != "", fmt.Sprintf("%v", err)
	})
	var un corev1.Pod
	if err := n.getJSON(&un, "get", "pod", "unaccounted"); err != nil {
		t.Fatal(err)
	}
	if k8s.RequestsIP(&un) {
		t.Errorf("the pod admitted with the webhook down requests %s", k8s.IPResource)
	}
	t.Logf("vpcni-test: webhook down: pod admitted without the request (failurePolicy Ignore); event: %s", msg)
	n.mustKubectl("delete", "pod", "unaccounted", "--grace-period=0", "--force", "--wait=true")
	n.mustKubectl("-n", "vpcni-system", "scale", "deployment/vpcni-controller", "--replicas=2")
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 2*time.Minute)
	n.waitWebhook(time.Minute)

	// A node that can address 6 more pods.
	n.mustKubectl("delete", "deployment", "web", "--wait=true")
	requested, unrequested := 0, 0
	eventually(t, 2*time.Minute, "only the controller pods hold addresses", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		requested, unrequested = n.podNetwork()
		return st.Pool.Allocated == requested+unrequested, fmt.Sprintf("%d allocated, %d+%d pods", st.Pool.Allocated, requested, unrequested)
	})
	maxAddresses := 6 + requested + unrequested
	oldAgent := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
	n.overlay = n.writeOverlay("5s", maxAddresses, true)
	n.mustKubectl("apply", "-k", n.overlay)
	eventually(t, 2*time.Minute, "the agent rolled with maxAddresses "+fmt.Sprint(maxAddresses), func() (bool, string) {
		ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
		alloc, _ = ipAllocatable(n.getNode())
		return len(ps) == 1 && ps[0].Metadata.Name != oldAgent && ps[0].ready() && alloc == int64(maxAddresses-unrequested),
			fmt.Sprintf("%d agent pods, allocatable %d", len(ps), alloc)
	})
	if free := alloc - int64(requested); free != 6 {
		t.Fatalf("allocatable %d less %d requested = %d, want 6", alloc, requested, free)
	}

	start := time.Now()
	n.apply(fmt.Sprintf(webManifest, 10, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	var pending []corev1.Pod
	eventually(t, 2*time.Minute, "6 web pods Ready, 4 Pending unschedulable", func() (bool, string) {
		pending = pending[:0]
		ready, other := 0, []string{}
		for _, p := range n.fullPods("-l", "app=web") {
			switch {
			case podReady(&p):
				ready++
			case p.Status.Phase == corev1.PodPending && p.Spec.NodeName == "" && unschedulable(&p) != "":
				pending = append(pending, p)
			default:
				other = append(other, fmt.Sprintf("%s %s node=%q", p.Name, p.Status.Phase, p.Spec.NodeName))
			}
		}
		return ready == 6 && len(pending) == 4 && len(other) == 0, fmt.Sprintf("%d ready, %d pending, others %v", ready, len(pending), other)
	})
	t.Logf("vpcni-test: 10 replicas, room for 6: 6 Ready, 4 Pending in %s; kubectl get pods:\n%s", time.Since(start).Round(100*time.Millisecond),
		n.mustKubectl("get", "pods", "-l", "app=web", "-o", "wide"))
	for _, p := range pending {
		if why := unschedulable(&p); !strings.Contains(why, "Insufficient "+string(k8s.IPResource)) {
			t.Errorf("%s Pending for another reason: %s", p.Name, why)
		}
	}
	t.Logf("vpcni-test: %s PodScheduled=False: %s", pending[0].Name, unschedulable(&pending[0]))

	// More room, but the cloud down: the restarted agent's pool (all its
	// addresses in use) is below warmTarget, so the node is tainted and
	// the Pending pods stay off it; once the cloud answers the pool fills,
	// the taint goes and they start.
	n.proxy.SetFaults(faultproxy.Faults{ServerError: 1})
	defer n.proxy.SetFaults(faultproxy.Faults{})
	oldAgent = n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
	n.overlay = n.writeOverlay("5s", 64, true)
	n.mustKubectl("apply", "-k", n.overlay)
	eventually(t, 2*time.Minute, "the node tainted "+nodeside.TaintNotReady+" by the restarted agent", func() (bool, string) {
		ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
		nd := n.getNode()
		return len(ps) == 1 && ps[0].Metadata.Name != oldAgent && notReadyTainted(nd), fmt.Sprintf("%d agent pods, taints %v", len(ps), nd.Spec.Taints)
	})
	// Not ready (no free address and the cloud fails): vpcnictl says so
	// with exit status 1 and prints the state all the same.
	out, _ := run(t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", filepath.Join(binDir, "vpcnictl"), "status", "--socket", hostSocketDir+"/vpcnid.sock", "-o", "json")
	st := &api.State{}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(st); err != nil { // the JSON, then its complaint
		t.Fatalf("vpcnictl status: %v\n%s", err, out)
	}
	stillPending := 0
	for _, p := range n.fullPods("-l", "app=web") {
		if p.Spec.NodeName == "" {
			stillPending++
		}
	}
	if stillPending != 4 {
		t.Errorf("%d web pods unscheduled while the node is tainted, want 4", stillPending)
	}
	if st.Pool.Free >= 4 {
		t.Errorf("tainted with %d free addresses (warmTarget 4)", st.Pool.Free)
	}
	t.Logf("vpcni-test: cloud down, agent restarted: pool free %d < warmTarget 4 (agent: %q): node tainted %s:NoSchedule, %d pods still Pending", st.Pool.Free, st.Reason, nodeside.TaintNotReady, stillPending)
	n.proxy.SetFaults(faultproxy.Faults{})
	start = time.Now()
	eventually(t, 2*time.Minute, "the taint gone once the pool is warm", func() (bool, string) {
		nd := n.getNode()
		return !notReadyTainted(nd), fmt.Sprintf("taints %v", nd.Spec.Taints)
	})
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	if st.Pool.Free < 4 && st.Pool.Free+st.Pool.Allocated+st.Pool.Cooling < st.Pool.Capacity {
		t.Errorf("taint removed with the pool below warmTarget: %+v", st.Pool)
	}
	tookTaint := time.Since(start).Round(100 * time.Millisecond)
	n.waitReady("default", "app=web", 10, 2*time.Minute)
	alloc, _ = ipAllocatable(n.getNode())
	t.Logf("vpcni-test: cloud back: taint removed after %s (pool free %d), allocatable %s=%d, all 10 web pods Ready after %s",
		tookTaint, st.Pool.Free, k8s.IPResource, alloc, time.Since(start).Round(100*time.Millisecond))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// unschedulable is the scheduler's message on a pod it could not place,
// "" if there is none.
func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}
