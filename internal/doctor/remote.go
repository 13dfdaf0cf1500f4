package doctor

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/provider"
)

// Cloud turns a provider's start-up steps (its provider.Doctor) into
// checks named "cloud <step>".
func Cloud(steps []provider.Step) []Result {
	var out []Result
	for _, s := range steps {
		r := Result{Name: "cloud " + s.Name, Status: OK, Detail: s.Detail}
		if s.Warn {
			r.Status, r.Fix = Warn, s.Fix
		}
		if s.Err != nil {
			r.Status, r.Detail, r.Fix = Fail, s.Err.Error(), s.Fix
		}
		out = append(out, r)
	}
	return out
}

// DateClock is an http.RoundTripper that remembers the Date header of the
// last answer and when its request was sent and answered, for Skew.
type DateClock struct {
	Next http.RoundTripper

	mu                   sync.Mutex
	date, sent, received time.Time
}

// RoundTrip implements http.RoundTripper.
func (c *DateClock) RoundTrip(r *http.Request) (*http.Response, error) {
	sent := time.Now()
	resp, err := c.Next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	if date, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		c.mu.Lock()
		c.date, c.sent, c.received = date, sent, time.Now()
		c.mu.Unlock()
	}
	return resp, nil
}

// Skew judges the clock of what answered last (see Skew).
func (c *DateClock) Skew(what string) Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Skew(what, c.date, c.sent, c.received)
}

// APIServer checks that the API server answers and accepts the agent's
// credentials, by reading the agent's own Node as the agent does; rc is
// nil with err when no client config could be made. Its requests go
// through clock.
func APIServer(ctx context.Context, rc *rest.Config, err error, nodeName string, clock *DateClock) Result {
	r := Result{Name: "apiserver"}
	if err != nil {
		r.Status, r.Detail = Fail, "no client configuration: "+err.Error()
		r.Fix = "set kubernetes.kubeconfig in the agent config, run doctor in vpcnid's pod (its service account), or kubernetes.mode: off"
		return r
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = 10 * time.Second
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { clock.Next = rt; return clock })
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		r.Status, r.Detail = Fail, fmt.Sprintf("client for %s: %v", rc.Host, err)
		r.Fix = "check the kubeconfig"
		return r
	}
	_, err = cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case err == nil:
		r.Status, r.Detail = OK, fmt.Sprintf("%s answers and accepts the credentials; Node %s found", rc.Host, nodeName)
	case apierrors.IsUnauthorized(err):
		r.Status, r.Detail = Fail, fmt.Sprintf("%s refused the credentials: %v", rc.Host, err)
		r.Fix = "renew the kubeconfig's credentials or the service account token"
	case apierrors.IsForbidden(err):
		r.Status, r.Detail = Fail, fmt.Sprintf("%s accepts the credentials but they may not read Nodes: %v", rc.Host, err)
		r.Fix = "apply vpcni's RBAC (deploy/rbac.yaml) for the agent's service account"
	case apierrors.IsNotFound(err):
		r.Status, r.Detail = Fail, fmt.Sprintf("%s has no Node %s", rc.Host, nodeName)
		r.Fix = "set nodeName in the agent config (or VPCNI_NODE_NAME) to the kubelet's node name"
	default:
		r.Status, r.Detail = Fail, fmt.Sprintf("%s: %v", rc.Host, err)
		r.Fix = "check that this node reaches the API server (kubeconfig server, firewall)"
	}
	return r
}
