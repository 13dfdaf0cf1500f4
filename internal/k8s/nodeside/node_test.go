package nodeside

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/agent"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/k8s"
)

// noAgent holds nothing: the node side's view of an agent without pods.
type noAgent struct{}

func (noAgent) Allocation(string, string) (*alloc.Allocation, error) { return nil, nil }
func (noAgent) Allocations() ([]*alloc.Allocation, error)            { return nil, nil }
func (noAgent) Release(string, string, time.Time, string) error      { return nil }
func (noAgent) ProviderPort() string                                 { return "" }
func (noAgent) Pool() agent.PoolFigures                              { return agent.PoolFigures{} }

// An API server that cannot be reached makes the node side not ready, and
// says so (the agent's STATUS carries this reason).
func TestNodeNotReadyWithoutAPIServer(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	n, err := New(&rest.Config{Host: "https://" + addr, Timeout: time.Second}, "n1", noAgent{},
		slog.New(slog.NewTextHandler(io.Discard, nil)), Options{ProbeEvery: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Ready(); err == nil {
		t.Fatal("ready before anything was reached")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := n.Ready()
		if err != nil && strings.Contains(err.Error(), "cannot reach the Kubernetes API server https://"+addr) && strings.Contains(err.Error(), "refused") {
			t.Logf("STATUS reason: %v", err)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v, want the unreachable API server named", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The agent's state becomes Node events on changes only: degraded once
// it has lasted 30 s (a single failed call is no news) and recovered after
// that, not ready once it has lasted a minute and again only for another
// kind of reason (its figures move all the time).
func TestStateEvents(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	n := &Node{name: "n1", recorder: k8s.Events{EventRecorder: rec}}
	var st stateEvents
	t0 := time.Now()
	degraded := agent.PoolFigures{Ready: true, Degraded: true, Reason: "neutron: 503"}
	notReady := func(r string) agent.PoolFigures { return agent.PoolFigures{Ready: false, Reason: r} }
	steps := []struct {
		p    agent.PoolFigures
		at   time.Duration
		want string // the event's reason, "" none
	}{
		{notReady("connecting the provider"), 0, ""},
		{agent.PoolFigures{Ready: true}, 2 * time.Second, ""},
		{degraded, 3 * time.Second, ""},                       // a blip …
		{agent.PoolFigures{Ready: true}, 4 * time.Second, ""}, // … over: nothing told
		{degraded, 5 * time.Second, ""},
		{degraded, 20 * time.Second, ""},
		{degraded, 36 * time.Second, EventDegraded},
		{degraded, 50 * time.Second, ""},
		{agent.PoolFigures{Ready: true}, 51 * time.Second, EventRecovered},
		{notReady("all 64 addresses are allocated (60) or cooling down (4)"), 52 * time.Second, ""},
		{notReady("all 64 addresses are allocated (61) or cooling down (3)"), 100 * time.Second, ""},
		{notReady("all 64 addresses are allocated (62) or cooling down (2)"), 113 * time.Second, EventNotReady},
		{notReady("all 64 addresses are allocated (63) or cooling down (1)"), 120 * time.Second, ""},
		{notReady("provider refused: policy"), 125 * time.Second, EventNotReady},
	}
	for i, s := range steps {
		n.stateEvents(&st, s.p, t0.Add(s.at))
		var got string
		select {
		case e := <-rec.Events:
			got = strings.Fields(e)[1]
			if !strings.Contains(e, "n1") {
				t.Errorf("step %d: event %q does not name the node", i, e)
			}
		default:
		}
		if got != s.want {
			t.Errorf("step %d (%+v at %s): event %q, want %q", i, s.p, s.at, got, s.want)
		}
	}
}

func TestIsPodOf(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(uid string, mirror string, at time.Time) *corev1.Pod {
		p := &corev1.Pod{}
		p.UID = types.UID(uid)
		p.CreationTimestamp = metav1.NewTime(at)
		if mirror != "" {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: mirror}
		}
		return p
	}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		uid  string
		want bool
	}{
		{"same UID", pod("u1", "", created), "u1", true},
		{"another pod of that name", pod("u2", "", created), "u1", false},
		{"static pod: the mirror names the kubelet's UID", pod("api-uid", "u1", created), "u1", true},
		{"no UID recorded, pod older than the attachment", pod("u9", "", created.Add(-time.Hour)), "", true},
		{"no UID recorded, pod made after it", pod("u9", "", created.Add(time.Hour)), "", false},
	} {
		if got := isPodOf(c.pod, &alloc.Allocation{PodUID: c.uid, Created: created}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
