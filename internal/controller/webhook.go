package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// WebhookPath is where vpcni-controller serves the pod mutation; the
// MutatingWebhookConfiguration in deploy/ names it.
const WebhookPath = "/mutate-pod"

// PodPatch is the JSON patch that makes a pod on the pod network request
// one vpcni.io/ip and, when network is not "", records that PodNetwork on
// it (v1alpha1.AnnotationNetwork); a pod on a PodNetwork (recorded now or
// before) also requests one of the network's resource
// (k8s.NetworkResource), which only nodes with room on that network
// advertise. nil when the pod needs none of it: host network, or it
// already asks for all and names its network (set by hand, or a
// re-admission: a network recorded on the pod is kept).
//
// The request goes on the first container, with an equal limit: an
// extended resource cannot be overcommitted, so the API server wants both.
// One container is enough: the scheduler sums the containers (and takes
// the larger of that and each init container). The patch replaces that
// container's whole resources object, which works whether or not the
// request serialised it.
func PodPatch(pod *corev1.Pod, network string) ([]byte, error) {
	if !k8s.OnPodNetwork(pod) || len(pod.Spec.Containers) == 0 {
		return nil, nil
	}
	var ops []map[string]any
	want := []corev1.ResourceName{k8s.IPResource}
	onNet := pod.Annotations[v1alpha1.AnnotationNetwork]
	if onNet == "" {
		onNet = network
	}
	if r, ok := k8s.NetworkResource(onNet); ok {
		want = append(want, r)
	}
	res := *pod.Spec.Containers[0].Resources.DeepCopy()
	added := false
	for _, r := range want {
		if k8s.Requests(pod, r) {
			continue
		}
		one := resource.MustParse("1")
		if res.Requests == nil {
			res.Requests = corev1.ResourceList{}
		}
		if res.Limits == nil {
			res.Limits = corev1.ResourceList{}
		}
		res.Requests[r], res.Limits[r] = one, one
		added = true
	}
	if added {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/containers/0/resources", "value": res})
	}
	if _, has := pod.Annotations[v1alpha1.AnnotationNetwork]; network != "" && !has {
		if pod.Annotations == nil {
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations",
				"value": map[string]string{v1alpha1.AnnotationNetwork: network}})
		} else {
			// "/" in a key is "~1" in a JSON pointer (RFC 6901).
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(v1alpha1.AnnotationNetwork, "/", "~1"),
				"value": network})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}

// choosesNetwork says whether pod's PodNetwork is to be chosen: a pod on
// the pod network that names none yet.
func choosesNetwork(pod *corev1.Pod) bool {
	_, has := pod.Annotations[v1alpha1.AnnotationNetwork]
	return k8s.OnPodNetwork(pod) && !has
}

// webhookSeconds times the handler, from the request read to the answer
// written (the API server's apiserver_admission_webhook_admission_duration_seconds
// adds the connection and TLS, in coarser buckets).
var webhookSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "vpcni_controller_webhook_duration_seconds",
	Help:    "Time the pod admission webhook took to answer one AdmissionReview, in this replica.",
	Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
})

// WebhookHandler answers AdmissionReviews for pods: it adds the vpcni.io/ip
// request and records the PodNetwork networks chooses (nil: none). It never
// refuses a pod: a pod it cannot read is admitted unchanged (the agent warns
// on it), as when the webhook is down, and a pod whose network cannot be
// chosen goes on its node's default network, with a warning.
func WebhookHandler(log *slog.Logger, networks PodNetworkChooser) http.Handler {
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
			var network string
			if err == nil && networks != nil && choosesNetwork(&pod) {
				choice, cerr := networks.Choose(r.Context(), req.Namespace, pod.Labels)
				switch {
				case cerr != nil:
					if !errors.Is(cerr, errNotListed) { // PodNetworkCache.Run says that one once
						log.Warn("pod admitted on its node's default network: its PodNetwork not chosen", "namespace", req.Namespace, "err", cerr)
					}
					resp.Warnings = append(resp.Warnings, fmt.Sprintf("vpcni: no PodNetwork chosen (%v); the pod goes on its node's default network", cerr))
				case len(choice.Others) > 0:
					resp.Warnings = append(resp.Warnings, fmt.Sprintf("vpcni: PodNetworks %s and %s select this pod; it goes on %s, whose name sorts first",
						choice.Network, strings.Join(choice.Others, ", "), choice.Network))
				}
				network = choice.Network
			}
			if err == nil {
				patch, err = PodPatch(&pod, network)
			}
			switch {
			case err != nil:
				log.Warn("pod admitted without a vpcni.io/ip request: unreadable", "namespace", req.Namespace, "err", err)
				resp.Warnings = append(resp.Warnings, fmt.Sprintf("vpcni: pod not read (%v); it requests no %s", err, k8s.IPResource))
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
