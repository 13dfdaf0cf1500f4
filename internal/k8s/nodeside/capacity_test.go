package nodeside

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/agent"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/k8s"
)

func TestIPCapacity(t *testing.T) {
	for _, tc := range []struct {
		name        string
		p           agent.PoolFigures
		unrequested int
		want        int64
	}{
		{"the provider's bound", agent.PoolFigures{Capacity: 8, Allocated: 3, Free: 4}, 0, 8},
		{"less pods the scheduler does not count", agent.PoolFigures{Capacity: 8, Allocated: 3}, 2, 6},
		{"no bound known: the kubelet's pod limit", agent.PoolFigures{}, 1, 109},
		{"never negative", agent.PoolFigures{Capacity: 2}, 5, 0},
	} {
		if got := ipCapacity(tc.p, 110, tc.unrequested); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPoolWarm(t *testing.T) {
	for _, tc := range []struct {
		p    agent.PoolFigures
		want bool
	}{
		{agent.PoolFigures{WarmTarget: 4, Free: 3, Capacity: 64}, false},
		{agent.PoolFigures{WarmTarget: 4, Free: 4, Capacity: 64}, true},
		// All it may hold is held: as warm as it gets.
		{agent.PoolFigures{WarmTarget: 4, Free: 1, Allocated: 5, Cooling: 2, Capacity: 8}, true},
		{agent.PoolFigures{WarmTarget: 4, Free: 0, Allocated: 5}, false}, // no bound known
	} {
		if got := poolWarm(tc.p); got != tc.want {
			t.Errorf("poolWarm(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

// The node as the API server has it after each sync: the resource in
// capacity and allocatable, the taint on until the pool is warm once and
// never again after, other taints kept.
func TestNodeCapacitySync(t *testing.T) {
	ctx := context.Background()
	other := corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoExecute}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{other}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("50")}}})
	c := nodeCapacity{cs: cs, ipResource: true, notReadyTaint: true}
	get := func() *corev1.Node {
		n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	state := func(n *corev1.Node) (ip string, tainted bool) {
		capQ, allocQ := n.Status.Capacity[k8s.IPResource], n.Status.Allocatable[k8s.IPResource]
		if capQ.Cmp(allocQ) != 0 {
			t.Fatalf("capacity %s, allocatable %s", capQ.String(), allocQ.String())
		}
		kept := false
		for _, tt := range n.Spec.Taints {
			tainted = tainted || (tt.Key == TaintNotReady && tt.Effect == corev1.TaintEffectNoSchedule)
			kept = kept || tt == other
		}
		if !kept {
			t.Fatalf("taint %v lost: %v", other, n.Spec.Taints)
		}
		if _, ok := n.Status.Capacity[k8s.IPResource]; !ok {
			return "", tainted
		}
		return capQ.String(), tainted
	}
	for i, step := range []struct {
		p           agent.PoolFigures
		unrequested int
		wantIP      string
		wantTaint   bool
	}{
		{agent.PoolFigures{WarmTarget: 4, Capacity: 8}, 0, "8", true},                                            // cold start
		{agent.PoolFigures{Connected: true, WarmTarget: 4, Capacity: 8, Free: 2}, 2, "6", true},                  // filling; two pods without the request
		{agent.PoolFigures{Connected: true, WarmTarget: 4, Capacity: 8, Free: 4}, 2, "6", false},                 // warm
		{agent.PoolFigures{Connected: true, WarmTarget: 4, Capacity: 8, Free: 0, Allocated: 6}, 0, "8", false},   // drained by pods: no taint again
		{agent.PoolFigures{Connected: true, WarmTarget: 4, Capacity: 16, Free: 0, Allocated: 6}, 0, "16", false}, // the cloud allows more
	} {
		tainted, err := c.sync(ctx, get(), step.p, step.unrequested)
		if err != nil {
			t.Fatal(err)
		}
		ip, hasTaint := state(get())
		if ip != step.wantIP || hasTaint != step.wantTaint || tainted != step.wantTaint {
			t.Errorf("step %d: %s=%q taint %v (reported %v), want %q %v", i, k8s.IPResource, ip, hasTaint, tainted, step.wantIP, step.wantTaint)
		}
	}
	// A restarted agent that has not reached its provider yet knows no
	// bound: the node keeps what it advertised.
	if _, err := c.sync(ctx, get(), agent.PoolFigures{WarmTarget: 4, Connected: false}, 0); err != nil {
		t.Fatal(err)
	}
	if ip, _ := state(get()); ip != "16" {
		t.Errorf("provider not connected: %s=%s, want the 16 advertised before", k8s.IPResource, ip)
	}
	// A PodNetwork's room is advertised beside it.
	web, _ := k8s.NetworkResource("web")
	if _, err := c.sync(ctx, get(), agent.PoolFigures{Capacity: 16, Connected: true, Networks: map[string]int{"web": 4}}, 0); err != nil {
		t.Fatal(err)
	}
	if q := get().Status.Allocatable[web]; q.Value() != 4 {
		t.Errorf("%s = %s, want 4", web, q.String())
	}
	// Turned off: the resources go.
	c.ipResource = false
	if _, err := c.sync(ctx, get(), agent.PoolFigures{Capacity: 8, Connected: true, Networks: map[string]int{"web": 4}}, 0); err != nil {
		t.Fatal(err)
	}
	if ip, _ := state(get()); ip != "" {
		t.Errorf("ipResource off: %s=%s still advertised", k8s.IPResource, ip)
	}
	if q, ok := get().Status.Capacity[web]; ok {
		t.Errorf("ipResource off: %s=%s still advertised", web, q.String())
	}
}

// podsAgent holds the given allocations.
type podsAgent struct {
	noAgent
	atts []*alloc.Allocation
}

func (a podsAgent) Allocations() ([]*alloc.Allocation, error) { return a.atts, nil }

// The agent counts the addresses the scheduler does not (pods without the
// request, or not known to it) and warns on such a pod once.
func TestUnrequestedPods(t *testing.T) {
	mk := func(name string, requests bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c"}}}}
		if requests {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{k8s.IPResource: resource.MustParse("1")}
		}
		return p
	}
	counted, bypassed := mk("counted", true), mk("bypassed", false)
	pods := cache.NewSharedIndexInformer(nil, &corev1.Pod{}, 0, cache.Indexers{})
	for _, p := range []*corev1.Pod{counted, bypassed} {
		if err := pods.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	att := func(p string) *alloc.Allocation {
		return &alloc.Allocation{ContainerID: "c-" + p, IfName: "eth0", PodNamespace: "default", PodName: p, PodUID: "uid-" + p}
	}
	rec := record.NewFakeRecorder(10)
	n := &Node{name: "n1", opts: Options{IPResource: true}, pods: pods, recorder: k8s.Events{EventRecorder: rec}, warned: map[types.UID]bool{},
		// "gone": a pod the informer does not have.
		agent: podsAgent{atts: []*alloc.Allocation{att("counted"), att("bypassed"), att("gone")}}}
	got, err := n.unrequested()
	if err != nil || got != 2 {
		t.Fatalf("unrequested = %d, %v; want 2 (bypassed, gone)", got, err)
	}
	for range 3 {
		n.warnUnrequested(counted)
		n.warnUnrequested(bypassed)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.Events))
	}
	if ev := <-rec.Events; !strings.Contains(ev, "Warning "+EventIPNotRequested) || !strings.Contains(ev, "webhook") {
		t.Errorf("event %q", ev)
	}
	// Once its address is released the pod is forgotten.
	n.agent = podsAgent{atts: []*alloc.Allocation{att("counted")}}
	if got, err := n.unrequested(); err != nil || got != 0 || len(n.warned) != 0 {
		t.Errorf("after the release: %d unrequested (%v), %d pods remembered", got, err, len(n.warned))
	}
}

// Each PodNetwork of the node's provider is advertised with the addresses
// of it the node may hold (the pod limit when unknown); one the node no
// longer serves is removed; one already right is left alone.
func TestNetworkResources(t *testing.T) {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	node := &corev1.Node{Status: corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"pn.vpcni.io/old": q("3"), "pn.vpcni.io/web": q("4"), corev1.ResourcePods: q("50")},
		Allocatable: corev1.ResourceList{"pn.vpcni.io/old": q("3"), "pn.vpcni.io/web": q("4")},
	}}
	got := networkResources(node, agent.PoolFigures{Networks: map[string]int{"web": 4, "db": -1, "api": 12, "full": 0}}, 50)
	want := map[string]any{"pn.vpcni.io/db": "50", "pn.vpcni.io/api": "12", "pn.vpcni.io/full": "0", "pn.vpcni.io/old": nil}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("networkResources = %v, want %v", got, want)
	}
	if got := networkResources(&corev1.Node{}, agent.PoolFigures{}, 50); len(got) != 0 {
		t.Errorf("a node without PodNetworks: %v", got)
	}
}
