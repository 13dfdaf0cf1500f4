package controller

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vpcni/vpcni/internal/k8s"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func testPod(mut func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "x"}, {Name: "b", Image: "y"}}}}
	if mut != nil {
		mut(p)
	}
	return p
}

// applyPatch applies the webhook's patch the way the API server does (a
// JSON patch on the pod's JSON) and reads the pod back.
func applyPatch(t *testing.T, pod *corev1.Pod, patch []byte) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(pod)
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("apply %s to %s: %v", patch, raw, err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func TestPodPatch(t *testing.T) {
	one := resource.MustParse("1")
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		patch bool
	}{
		{"plain pod", testPod(nil), true},
		{"cpu request and memory limit kept", testPod(func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}
		}), true},
		{"host network", testPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), false},
		{"already requests it on another container", testPod(func(p *corev1.Pod) {
			p.Spec.Containers[1].Resources.Limits = corev1.ResourceList{k8s.IPResource: resource.MustParse("2")}
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			patch, err := PodPatch(tc.pod, "")
			if err != nil {
				t.Fatal(err)
			}
			if (patch != nil) != tc.patch {
				t.Fatalf("patch %s, want one: %v", patch, tc.patch)
			}
			if patch == nil {
				return
			}
			got := applyPatch(t, tc.pod, patch)
			c := got.Spec.Containers[0].Resources
			if q := c.Requests[k8s.IPResource]; q.Cmp(one) != 0 {
				t.Errorf("request %s = %s, want 1", k8s.IPResource, q.String())
			}
			if q := c.Limits[k8s.IPResource]; q.Cmp(one) != 0 {
				t.Errorf("limit %s = %s, want 1", k8s.IPResource, q.String())
			}
			for k, v := range before.Spec.Containers[0].Resources.Requests {
				if q := c.Requests[k]; q.Cmp(v) != 0 {
					t.Errorf("request %s = %s, was %s", k, q.String(), v.String())
				}
			}
			for k, v := range before.Spec.Containers[0].Resources.Limits {
				if q := c.Limits[k]; q.Cmp(v) != 0 {
					t.Errorf("limit %s = %s, was %s", k, q.String(), v.String())
				}
			}
			if len(got.Spec.Containers[1].Resources.Requests) != 0 || !k8s.RequestsIP(got) {
				t.Errorf("second container %+v, RequestsIP %v", got.Spec.Containers[1].Resources, k8s.RequestsIP(got))
			}
			if again, err := PodPatch(got, ""); err != nil || again != nil {
				t.Errorf("a patched pod patched again: %s, %v", again, err)
			}
		})
	}
}

func review(t *testing.T, srv *httptest.Server, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, int) {
	t.Helper()
	body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	resp, err := http.Post(srv.URL+WebhookPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("answer: %v %+v", err, out)
	}
	return out.Response, resp.StatusCode
}

func TestWebhookHandler(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, WebhookHandler(slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	podKind := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	raw, _ := json.Marshal(testPod(nil))

	r, _ := review(t, srv, &admissionv1.AdmissionRequest{UID: "u1", Kind: podKind, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}})
	if !r.Allowed || r.UID != "u1" || r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("pod create: %+v", r)
	}
	if got := applyPatch(t, testPod(nil), r.Patch); !k8s.RequestsIP(got) {
		t.Errorf("the answer's patch does not add the request: %s", r.Patch)
	}

	hostRaw, _ := json.Marshal(testPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }))
	for name, req := range map[string]*admissionv1.AdmissionRequest{
		"host network": {UID: "u2", Kind: podKind, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: hostRaw}},
		"update":       {UID: "u3", Kind: podKind, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: raw}},
		"not a pod":    {UID: "u4", Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	} {
		if r, _ := review(t, srv, req); !r.Allowed || r.Patch != nil || r.UID != req.UID {
			t.Errorf("%s: %+v, want allowed unchanged", name, r)
		}
	}
	// A pod it cannot read is admitted as it is, with a warning: the
	// webhook fails open like its configuration.
	r, _ = review(t, srv, &admissionv1.AdmissionRequest{UID: "u5", Kind: podKind, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(`{"spec":{"containers":"no"}}`)}})
	if !r.Allowed || r.Patch != nil || len(r.Warnings) != 1 {
		t.Errorf("unreadable pod: %+v", r)
	}
	resp, err := http.Post(srv.URL+WebhookPath, "application/json", bytes.NewReader([]byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a review without a request: HTTP %d, want 400", resp.StatusCode)
	}
}

// A pod on a PodNetwork requests one of the network's resource beside its
// address, whether the webhook records the network now or it was there
// already; a name too long for a resource is recorded but not counted.
func TestPodPatchRequestsNetworkResource(t *testing.T) {
	web, _ := k8s.NetworkResource("web")
	db, _ := k8s.NetworkResource("db")
	one := resource.MustParse("1")
	got := applyPatch(t, testPod(nil), mustPatch(t, testPod(nil), "web"))
	if r := got.Spec.Containers[0].Resources; !r.Requests[web].Equal(one) || !r.Limits[web].Equal(one) || !r.Requests[k8s.IPResource].Equal(one) {
		t.Errorf("a pod put on web requests %v, limits %v; want one %s and one %s", r.Requests, r.Limits, web, k8s.IPResource)
	}
	// Already annotated db and asking for its address: db's resource only.
	pre := testPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{"vpcni.io/network": "db"}
		p.Spec.Containers[1].Resources.Requests = corev1.ResourceList{k8s.IPResource: one}
		p.Spec.Containers[1].Resources.Limits = corev1.ResourceList{k8s.IPResource: one}
	})
	got = applyPatch(t, pre, mustPatch(t, pre, ""))
	if r := got.Spec.Containers[0].Resources; !r.Requests[db].Equal(one) || r.Requests[k8s.IPResource] != (resource.Quantity{}) {
		t.Errorf("a pod already on db requests %v on its first container; want db's resource alone", r.Requests)
	}
	long := "n" + string(bytes.Repeat([]byte("x"), 63))
	if _, ok := k8s.NetworkResource(long); ok {
		t.Fatalf("a %d-character name makes a resource", len(long))
	}
	got = applyPatch(t, testPod(nil), mustPatch(t, testPod(nil), long))
	if r := got.Spec.Containers[0].Resources; len(r.Requests) != 1 || got.Annotations["vpcni.io/network"] != long {
		t.Errorf("a pod on a PodNetwork with a long name: requests %v, network %q; want the address alone and the network recorded", r.Requests, got.Annotations["vpcni.io/network"])
	}
}

func mustPatch(t *testing.T, pod *corev1.Pod, network string) []byte {
	t.Helper()
	p, err := PodPatch(pod, network)
	if err != nil || p == nil {
		t.Fatalf("PodPatch: %s, %v", p, err)
	}
	return p
}
