package controller

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/k8s"
)

// WebhookPath is where vpcni-controller serves the pod mutation; the
// MutatingWebhookConfiguration in deploy/ names it.
const WebhookPath = "/mutate-pod"

// PodPatch is the JSON patch that makes a pod on the pod network request
// one vpcni.io/ip; nil when the pod needs none (host network) or already
// asks for it (set by hand, or a re-admission).
//
// The request goes on the first container, with an equal limit: an
// extended resource cannot be overcommitted, so the API server wants both.
// One container is enough: the scheduler sums the containers (and takes
// the larger of that and each init container). The patch replaces that
// container's whole resources object, which works whether or not the
// request serialised it.
func PodPatch(pod *corev1.Pod) ([]byte, error) {
	if !k8s.OnPodNetwork(pod) || k8s.RequestsIP(pod) || len(pod.Spec.Containers) == 0 {
		return nil, nil
	}
	res := *pod.Spec.Containers[0].Resources.DeepCopy()
	one := resource.MustParse("1")
	if res.Requests == nil {
		res.Requests = corev1.ResourceList{}
	}
	if res.Limits == nil {
		res.Limits = corev1.ResourceList{}
	}
	res.Requests[k8s.IPResource], res.Limits[k8s.IPResource] = one, one
	return json.Marshal([]map[string]any{{"op": "add", "path": "/spec/containers/0/resources", "value": res}})
}

// webhookSeconds times the handler, from the request read to the answer
// written (the API server's apiserver_admission_webhook_admission_duration_seconds
// adds the connection and TLS, in coarser buckets).
var webhookSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "vpcni_controller_webhook_duration_seconds",
	Help:    "Time the pod admission webhook took to answer one AdmissionReview, in this replica.",
	Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
})

// WebhookHandler answers AdmissionReviews for pods. It never refuses a
// pod: a pod it cannot read is admitted unchanged (the agent warns on it),
// as when the webhook is down.
func WebhookHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func(start time.Time) { webhookSeconds.Observe(time.Since(start).Seconds()) }(time.Now())
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
			return
		}
		req := review.Request
		resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
		if req.Kind.Group == "" && req.Kind.Kind == "Pod" && req.Operation == admissionv1.Create {
			var pod corev1.Pod
			patch, err := []byte(nil), json.Unmarshal(req.Object.Raw, &pod)
			if err == nil {
				patch, err = PodPatch(&pod)
			}
			switch {
			case err != nil:
				log.Warn("pod admitted without a vpcni.io/ip request: unreadable", "namespace", req.Namespace, "err", err)
				resp.Warnings = []string{fmt.Sprintf("vpcni: pod not read (%v); it requests no %s", err, k8s.IPResource)}
			case patch != nil:
				pt := admissionv1.PatchTypeJSONPatch
				resp.Patch, resp.PatchType = patch, &pt
			}
		}
		out, _ := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Response: resp,
		})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	})
}
