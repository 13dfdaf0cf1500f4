package nodeside

import (
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// A pod whose address is not of the PodNetwork it names is told so once,
// as a Warning naming the network; a pod without one is not, nor one
// whose address is of its PodNetwork; the pod is forgotten once its
// address is released.
func TestPodNetworkNotServedWarnedOnce(t *testing.T) {
	mk := func(name, network string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c"}}}}
		if network != "" {
			p.Annotations = map[string]string{v1alpha1.AnnotationNetwork: network}
		}
		return p
	}
	web, plain, served := mk("web", "web-net"), mk("plain", ""), mk("served", "web-net")
	pods := cache.NewSharedIndexInformer(nil, &corev1.Pod{}, 0, cache.Indexers{})
	for _, p := range []*corev1.Pod{web, plain, served} {
		if err := pods.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	att := func(p string) *alloc.Allocation {
		return &alloc.Allocation{ContainerID: "c-" + p, IfName: "eth0", PodNamespace: "default", PodName: p, PodUID: "uid-" + p}
	}
	rec := record.NewFakeRecorder(10)
	n := &Node{name: "n1", pods: pods, recorder: k8s.Events{EventRecorder: rec}, warned: map[types.UID]bool{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), agent: podsAgent{atts: []*alloc.Allocation{att("web"), att("plain")}}}
	onNet := att("served")
	onNet.PodNetwork = "web-net"
	dual := att("web") // a dual-stack pod: the Warning names both addresses
	dual.Address = netip.MustParseAddr("10.0.0.5")
	dual.Others = []alloc.Lease{{Address: netip.MustParseAddr("fd00::5")}}
	for range 3 {
		n.warnNetworkNotServed(web, dual)
		n.warnNetworkNotServed(plain, att("plain"))
		n.warnNetworkNotServed(served, onNet)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.Events))
	}
	if ev := <-rec.Events; !strings.Contains(ev, "Warning "+EventPodNetworkNotServed) || !strings.Contains(ev, "web-net") ||
		!strings.Contains(ev, "addresses 10.0.0.5 and fd00::5") {
		t.Errorf("event %q, want a %s Warning naming web-net and both addresses", ev, EventPodNetworkNotServed)
	}
	if _, err := n.unrequested(); err != nil || len(n.notServed) != 1 {
		t.Fatalf("with its address held: %d pods remembered (%v), want 1", len(n.notServed), err)
	}
	n.agent = podsAgent{atts: []*alloc.Allocation{att("plain")}}
	if _, err := n.unrequested(); err != nil || len(n.notServed) != 0 {
		t.Errorf("after the release: %d pods remembered (%v), want 0", len(n.notServed), err)
	}
}
