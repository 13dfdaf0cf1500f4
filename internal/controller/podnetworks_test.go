package controller

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func podNetwork(name string, ns, pod *metav1.LabelSelector) *v1alpha1.PodNetwork {
	return &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: v1alpha1.PodNetworkSpec{NamespaceSelector: ns, PodSelector: pod,
			Static: &v1alpha1.StaticPodNetwork{Ranges: []string{"10.30.0.0/24"}}}}
}

func match(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

// namespaces is the cluster's namespaces' labels, for the cache's lookup.
type namespaces map[string]map[string]string

func (n namespaces) labels(_ context.Context, name string) (map[string]string, error) {
	l, ok := n[name]
	if !ok {
		return nil, errors.New("namespace " + name + " not found")
	}
	return l, nil
}

var testNamespaces = namespaces{
	"shop":  {"team": "web", "tier": "front"},
	"batch": {"team": "data"},
	"plain": {},
}

// Which PodNetwork a pod goes on: namespace and pod selectors both must
// select it, an absent or empty selector selects everything, none
// selecting it leaves the pod on its node's default network, and of
// several the name sorting first wins, the others named.
func TestChoosePodNetwork(t *testing.T) {
	for _, tc := range []struct {
		name      string
		nets      []*v1alpha1.PodNetwork
		namespace string
		pod       map[string]string
		want      string
		others    []string
	}{
		{"no PodNetworks", nil, "shop", nil, "", nil},
		{"namespace selected", []*v1alpha1.PodNetwork{podNetwork("web", match("team", "web"), nil)}, "shop", nil, "web", nil},
		{"namespace not selected", []*v1alpha1.PodNetwork{podNetwork("web", match("team", "web"), nil)}, "batch", nil, "", nil},
		{"pod selected in any namespace", []*v1alpha1.PodNetwork{podNetwork("db", nil, match("app", "db"))}, "plain", map[string]string{"app": "db"}, "db", nil},
		{"pod not selected", []*v1alpha1.PodNetwork{podNetwork("db", nil, match("app", "db"))}, "plain", map[string]string{"app": "web"}, "", nil},
		{"both selectors must select", []*v1alpha1.PodNetwork{podNetwork("db", match("team", "data"), match("app", "db"))}, "shop", map[string]string{"app": "db"}, "", nil},
		{"both select", []*v1alpha1.PodNetwork{podNetwork("db", match("team", "data"), match("app", "db"))}, "batch", map[string]string{"app": "db"}, "db", nil},
		{"empty selectors select every pod", []*v1alpha1.PodNetwork{podNetwork("all", &metav1.LabelSelector{}, &metav1.LabelSelector{})}, "plain", nil, "all", nil},
		{"expressions", []*v1alpha1.PodNetwork{podNetwork("notdata", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "team", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"data"}}}}, nil)}, "shop", nil, "notdata", nil},
		{"conflict: the first name wins, whatever the order listed", []*v1alpha1.PodNetwork{
			podNetwork("zeta", match("team", "web"), nil), podNetwork("alpha", nil, match("app", "web")), podNetwork("mid", match("tier", "front"), nil),
			podNetwork("other", match("team", "data"), nil)},
			"shop", map[string]string{"app": "web"}, "alpha", []string{"mid", "zeta"}},
		{"a selector that does not parse selects nothing", []*v1alpha1.PodNetwork{
			podNetwork("broken", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Near"}}}, nil),
			podNetwork("web", match("team", "web"), nil)}, "shop", nil, "web", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPodNetworkCache(discard, record.NewFakeRecorder(10), testNamespaces.labels)
			c.setPodNetworks(tc.nets)
			got, err := c.Choose(context.Background(), tc.namespace, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if got.Network != tc.want || !slices.Equal(got.Others, tc.others) {
				t.Errorf("chose %q (others %q), want %q (others %q)", got.Network, got.Others, tc.want, tc.others)
			}
		})
	}
}

// A conflict is told once (an Event on the winner), not once per pod.
func TestPodNetworkConflictEventOnce(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	c := newPodNetworkCache(discard, rec, testNamespaces.labels)
	c.setPodNetworks([]*v1alpha1.PodNetwork{podNetwork("b", nil, nil), podNetwork("a", nil, nil)})
	for range 5 {
		if got, err := c.Choose(context.Background(), "shop", nil); err != nil || got.Network != "a" {
			t.Fatalf("chose %+v, %v; want a", got, err)
		}
	}
	close(rec.Events)
	var events []string
	for e := range rec.Events {
		events = append(events, e)
	}
	if len(events) != 1 || !strings.Contains(events[0], EventPodNetworkConflict) || !strings.Contains(events[0], "PodNetworks a and b") {
		t.Errorf("events %q, want one %s naming a and b", events, EventPodNetworkConflict)
	}
}

// Before its caches are filled the cache chooses nothing and says so: the
// webhook then admits the pod on its node's default network, with a
// warning, rather than choosing from a partial list.
func TestPodNetworkCacheNotListed(t *testing.T) {
	c := newPodNetworkCache(discard, nil, testNamespaces.labels)
	c.setPodNetworks([]*v1alpha1.PodNetwork{podNetwork("web", nil, nil)})
	c.listed.Store(false)
	if _, err := c.Choose(context.Background(), "shop", nil); !errors.Is(err, errNotListed) {
		t.Errorf("Choose before the lists: %v, want errNotListed", err)
	}
}

// chooserFunc is a PodNetworkChooser of a function.
type chooserFunc func(ctx context.Context, namespace string, podLabels map[string]string) (PodNetworkChoice, error)

func (f chooserFunc) Choose(ctx context.Context, namespace string, podLabels map[string]string) (PodNetworkChoice, error) {
	return f(ctx, namespace, podLabels)
}

// The webhook records the chosen network on the pod, keeps one the pod
// already names (without choosing), gives none to a host-network pod,
// and admits a pod whose network cannot be chosen, with a warning.
func TestWebhookRecordsPodNetwork(t *testing.T) {
	c := newPodNetworkCache(discard, record.NewFakeRecorder(10), testNamespaces.labels)
	c.setPodNetworks([]*v1alpha1.PodNetwork{podNetwork("web", match("team", "web"), nil), podNetwork("web2", nil, match("app", "web"))})
	chosen := 0
	counting := chooserFunc(func(ctx context.Context, ns string, l map[string]string) (PodNetworkChoice, error) {
		chosen++
		return c.Choose(ctx, ns, l)
	})
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, WebhookHandler(discard, counting))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	admit := func(ns string, pod *corev1.Pod) (*corev1.Pod, *admissionv1.AdmissionResponse) {
		t.Helper()
		raw, _ := json.Marshal(pod)
		r, _ := review(t, srv, &admissionv1.AdmissionRequest{UID: "u", Namespace: ns, Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}})
		if !r.Allowed {
			t.Fatalf("pod refused: %+v", r)
		}
		if r.Patch == nil {
			return pod, r
		}
		return applyPatch(t, pod, r.Patch), r
	}

	got, r := admit("shop", testPod(nil))
	if got.Annotations[v1alpha1.AnnotationNetwork] != "web" || !k8s.RequestsIP(got) || len(r.Warnings) != 0 {
		t.Errorf("pod in shop: annotations %v, requests IP %v, warnings %q; want network web, the request, no warning", got.Annotations, k8s.RequestsIP(got), r.Warnings)
	}
	// Annotations already there: the key is added beside them.
	got, _ = admit("batch", testPod(func(p *corev1.Pod) {
		p.Labels = map[string]string{"app": "web"}
		p.Annotations = map[string]string{"keep": "me"}
	}))
	if got.Annotations[v1alpha1.AnnotationNetwork] != "web2" || got.Annotations["keep"] != "me" {
		t.Errorf("pod in batch: annotations %v, want network web2 beside keep=me", got.Annotations)
	}
	// Both select it: the first name, and a warning naming the other.
	got, r = admit("shop", testPod(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }))
	if got.Annotations[v1alpha1.AnnotationNetwork] != "web" || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "web2") {
		t.Errorf("pod both select: annotations %v, warnings %q; want web and a warning naming web2", got.Annotations, r.Warnings)
	}
	// None selects it: no annotation.
	if got, _ = admit("plain", testPod(nil)); got.Annotations[v1alpha1.AnnotationNetwork] != "" || !k8s.RequestsIP(got) {
		t.Errorf("pod in plain: annotations %v, want none (and the IP request)", got.Annotations)
	}

	before := chosen
	// A network the pod already names is kept, not chosen again.
	got, _ = admit("shop", testPod(func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationNetwork: "by-hand"} }))
	if got.Annotations[v1alpha1.AnnotationNetwork] != "by-hand" {
		t.Errorf("annotated pod: annotations %v, want by-hand kept", got.Annotations)
	}
	// A host-network pod has no pod network to choose.
	if got, r = admit("shop", testPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true })); r.Patch != nil || got.Annotations != nil {
		t.Errorf("host-network pod patched: %s", r.Patch)
	}
	if chosen != before {
		t.Errorf("the webhook chose a network %d times for pods that need no choice", chosen-before)
	}

	// A namespace the lookup cannot find: admitted, default network, warned.
	got, r = admit("nowhere", testPod(nil))
	if got.Annotations[v1alpha1.AnnotationNetwork] != "" || !k8s.RequestsIP(got) || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "default network") {
		t.Errorf("pod of an unknown namespace: annotations %v, warnings %q; want no network, the IP request, one warning", got.Annotations, r.Warnings)
	}
}
