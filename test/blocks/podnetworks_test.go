package blocks

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/k8s"
)

// warnings keeps the admission warnings the API server passes on.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.seen
	w.seen = nil
	return s
}

// The PodNetwork CRD and the pod webhook against the real API server: the
// controller's PodNetwork cache runs as vpcni-controller with the RBAC of
// deploy/rbac.yaml, its webhook handler is registered with a
// MutatingWebhookConfiguration, and pods created through the API server
// are stored with the network that selects them; the schema refuses a
// PodNetwork with two provider sections, or a range that is no prefix.
func TestPodNetworksChosenByTheWebhook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	applyDeploy(t)
	cs := kubernetes.NewForConfigOrDie(fixture.Config)
	pns, err := k8s.NewPodNetworks(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}

	// The schema's checks, answered 422 by the API server.
	for name, spec := range map[string]v1alpha1.PodNetworkSpec{
		"two providers": {OpenStack: &v1alpha1.OpenStackPodNetwork{NetworkID: "n", SubnetIDs: []string{"s"}},
			Static: &v1alpha1.StaticPodNetwork{Ranges: []string{"10.30.0.0/24"}}},
		"no provider":      {},
		"no subnet":        {AWS: &v1alpha1.AWSPodNetwork{SubnetIDs: []string{}}},
		"range not prefix": {Static: &v1alpha1.StaticPodNetwork{Ranges: []string{"10.30.0.300/24"}}},
	} {
		err := pns.Create(ctx, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "pn-bad"}, Spec: spec})
		if !apierrors.IsInvalid(err) {
			_ = pns.Delete(ctx, "pn-bad", metav1.DeleteOptions{})
			t.Errorf("%s: created or refused otherwise (%v), want 422 Invalid", name, err)
			continue
		}
		t.Logf("vpcni-test: %s refused: %v", name, err)
	}

	for _, pn := range []*v1alpha1.PodNetwork{
		{ObjectMeta: metav1.ObjectMeta{Name: "pn-web"}, Spec: v1alpha1.PodNetworkSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pn-team": "web"}},
			OpenStack: &v1alpha1.OpenStackPodNetwork{NetworkID: "net-web", SubnetIDs: []string{"subnet-web"},
				SecurityGroups: []string{"sg-web"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "pn-zz-api"}, Spec: v1alpha1.PodNetworkSpec{
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			Static:      &v1alpha1.StaticPodNetwork{Ranges: []string{"10.30.0.0/24"}}}},
	} {
		if err := pns.Create(ctx, pn); err != nil {
			t.Fatalf("create PodNetwork %s: %v", pn.Name, err)
		}
		t.Cleanup(func() { _ = pns.Delete(context.Background(), pn.Name, metav1.DeleteOptions{}) })
	}
	for name, labels := range map[string]map[string]string{"pn-shop": {"pn-team": "web"}, "pn-plain": nil} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}

	// The webhook as vpcni-controller serves it, with its rights.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctrlCfg := serviceAccount("vpcni-controller")
	networks, err := controller.NewPodNetworkCache(ctrlCfg, log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); networks.Run(runCtx, kubernetes.NewForConfigOrDie(ctrlCfg)) }()
	defer func() { stop(); <-done }()
	mux := http.NewServeMux()
	mux.Handle(controller.WebhookPath, controller.WebhookHandler(log, networks))
	srv := httptest.NewTLSServer(mux) // its certificate names 127.0.0.1
	defer srv.Close()

	// Only the test's namespaces: the package's other tests create pods
	// without this webhook.
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	url := srv.URL + controller.WebhookPath
	wh := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "pn-test-vpcni"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.vpcni.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{"pn-shop", "pn-plain"}}}},
			FailurePolicy:           &fail, // a webhook not called fails the pod's create here, not silently
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}}}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, wh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), wh.Name, metav1.DeleteOptions{})
	})

	warned := &warnings{}
	userCfg := rest.CopyConfig(fixture.Config)
	userCfg.WarningHandler = warned
	user := kubernetes.NewForConfigOrDie(userCfg)
	create := func(ns, name string, labels, annotations map[string]string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}
		if _, err := user.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s/%s: %v", ns, name, err)
		}
		got, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// The API server takes the new webhook configuration, and the cache
	// its first lists, a moment after: the first pod is retried until it
	// comes back with its network.
	start := time.Now()
	for i := 0; ; i++ {
		name := fmt.Sprintf("first-%d", i)
		p := create("pn-shop", name, nil, nil)
		if p.Annotations[v1alpha1.AnnotationNetwork] == "pn-web" && k8s.RequestsIP(p) {
			t.Logf("vpcni-test: webhook and cache ready after %s", time.Since(start).Round(time.Millisecond))
			break
		}
		_ = cs.CoreV1().Pods("pn-shop").Delete(ctx, name, metav1.DeleteOptions{})
		if time.Since(start) > 30*time.Second {
			t.Fatalf("pn-shop/%s stored with annotations %v, requests IP %v after 30s; want network pn-web", name, p.Annotations, k8s.RequestsIP(p))
		}
		time.Sleep(200 * time.Millisecond)
	}
	warned.take()

	for _, tc := range []struct {
		ns, name    string
		labels      map[string]string
		annotations map[string]string
		want        string
		warning     string
	}{
		{"pn-shop", "api", map[string]string{"app": "api"}, nil, "pn-web", "pn-zz-api"},
		{"pn-plain", "api", map[string]string{"app": "api"}, nil, "pn-zz-api", ""},
		{"pn-plain", "other", map[string]string{"app": "other"}, nil, "", ""},
		{"pn-plain", "by-hand", map[string]string{"app": "api"}, map[string]string{v1alpha1.AnnotationNetwork: "mine"}, "mine", ""},
	} {
		p := create(tc.ns, tc.name, tc.labels, tc.annotations)
		got, has := p.Annotations[v1alpha1.AnnotationNetwork]
		if got != tc.want || has != (tc.want != "") || !k8s.RequestsIP(p) {
			t.Errorf("%s/%s stored with annotations %v, requests IP %v; want network %q", tc.ns, tc.name, p.Annotations, k8s.RequestsIP(p), tc.want)
		}
		w := warned.take()
		if (tc.warning == "") != (len(w) == 0) || (tc.warning != "" && !strings.Contains(strings.Join(w, "\n"), tc.warning)) {
			t.Errorf("%s/%s: warnings %q, want one naming %q", tc.ns, tc.name, w, tc.warning)
		}
		t.Logf("vpcni-test: pod %s/%s network=%q warnings=%q", tc.ns, tc.name, got, w)
	}

	// The overlap is told once as an Event on the winning PodNetwork.
	for {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + controller.EventPodNetworkConflict})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) > 0 {
			e := evs.Items[0]
			if e.InvolvedObject.Kind != "PodNetwork" || e.InvolvedObject.Name != "pn-web" || !strings.Contains(e.Message, "pn-zz-api") {
				t.Errorf("event %s on %s %s: %q, want it on PodNetwork pn-web naming pn-zz-api", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no %s Event: %v", controller.EventPodNetworkConflict, ctx.Err())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// webhookAddr is where the vpcni-controller binary serves its webhook in
// TestControllerBinaryChoosesPodNetworks (the scale bench's is :29443).
const webhookAddr = "127.0.0.1:29453"

// The real vpcni-controller binary with its webhook on, as the service
// account deploy/rbac.yaml sets up, called by the API server through
// deploy/webhook.yaml's configuration (its Service made an ExternalName of
// localhost, as the scale bench does): a new pod in a namespace a
// PodNetwork selects is stored with it. Proves the wiring in main (the
// PodNetwork cache started beside the webhook) and the RBAC it needs.
func TestControllerBinaryChoosesPodNetworks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	applyDeploy(t)
	cs := kubernetes.NewForConfigOrDie(fixture.Config)
	bin := filepath.Join(os.Getenv("VPCNI_BIN"), "vpcni-controller")
	if os.Getenv("VPCNI_BIN") == "" {
		bin = filepath.Join(t.TempDir(), "vpcni-controller")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/vpcni/vpcni/cmd/vpcni-controller").CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	if err := applyWebhook(ctx, cs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(bg, "vpcni", metav1.DeleteOptions{})
		_ = cs.CoreV1().Services(namespace).Delete(bg, "vpcni-webhook", metav1.DeleteOptions{})
		_ = cs.CoreV1().Secrets(namespace).Delete(bg, "vpcni-webhook-cert", metav1.DeleteOptions{})
	})
	pns, err := k8s.NewPodNetworks(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	pn := &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "pn-bin"}, Spec: v1alpha1.PodNetworkSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pn-bin": "yes"}},
		AWS:               &v1alpha1.AWSPodNetwork{SubnetIDs: []string{"subnet-0a1b"}, SecurityGroups: []string{"sg-0c2d"}}}}
	if err := pns.Create(ctx, pn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pns.Delete(context.Background(), pn.Name, metav1.DeleteOptions{}) })

	c := startController(t, bin, kubeconfigAs(t, "vpcni-controller"), "pn-replica", "-webhook-addr", webhookAddr)
	waitFor(t, 30*time.Second, "the controller's caBundle and its PodNetworks listed", func() error {
		mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "vpcni", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(mwc.Webhooks[0].ClientConfig.CABundle) == 0 || !strings.Contains(c.Output(), "PodNetworks listed") {
			return fmt.Errorf("caBundle %d bytes; log so far:\n%s", len(mwc.Webhooks[0].ClientConfig.CABundle), c.Output())
		}
		return nil
	})
	// A namespace made just before its pod: the controller's cache may not
	// have it yet, and looks it up.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pn-bin", Labels: map[string]string{"pn-bin": "yes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), "pn-bin", metav1.DeleteOptions{}) })
	p, err := cs.CoreV1().Pods("pn-bin").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations[v1alpha1.AnnotationNetwork] != "pn-bin" || !k8s.RequestsIP(p) {
		t.Fatalf("pod stored with annotations %v, requests IP %v; want network pn-bin and the request\ncontroller log:\n%s", p.Annotations, k8s.RequestsIP(p), c.Output())
	}
	t.Logf("vpcni-test: the controller binary recorded network %q on pn-bin/web", p.Annotations[v1alpha1.AnnotationNetwork])
}

// applyWebhook creates deploy/webhook.yaml's objects in the fixture, the
// Service an ExternalName of localhost on webhookAddr's port (the API
// server dials it; the certificate still names the Service).
func applyWebhook(ctx context.Context, cs kubernetes.Interface) error {
	data, err := os.ReadFile("../../deploy/webhook.yaml")
	if err != nil {
		return err
	}
	_, portText, _ := strings.Cut(webhookAddr, ":")
	port, _ := strconv.Atoi(portText)
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return err
		}
		var err error
		switch tm.Kind {
		case "Service":
			var svc corev1.Service
			if err = yaml.Unmarshal(doc, &svc); err == nil {
				svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}
				_, err = cs.CoreV1().Services(namespace).Create(ctx, &svc, metav1.CreateOptions{})
			}
		case "MutatingWebhookConfiguration":
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			if err = yaml.Unmarshal(doc, &mwc); err == nil {
				for i := range mwc.Webhooks {
					p := int32(port)
					mwc.Webhooks[i].ClientConfig.Service.Port = &p
				}
				_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mwc, metav1.CreateOptions{})
			}
		case "Secret":
			var sec corev1.Secret
			if err = yaml.Unmarshal(doc, &sec); err == nil {
				_, err = cs.CoreV1().Secrets(namespace).Create(ctx, &sec, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("deploy/webhook.yaml: %s: %w", tm.Kind, err)
		}
	}
	return nil
}
