package k8s

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/agent"
	"github.com/vpcni/vpcni/internal/alloc"
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
	n, err := NewNode(&rest.Config{Host: "https://" + addr, Timeout: time.Second}, "n1", noAgent{},
		slog.New(slog.NewTextHandler(io.Discard, nil)), NodeOptions{ProbeEvery: 100 * time.Millisecond})
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

// The agent's state becomes Node events on changes only: degraded and
// recovered at once, not ready once it has lasted a minute and again only
// for another reason.
func TestStateEvents(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	n := &Node{name: "n1", recorder: rec}
	var st stateEvents
	t0 := time.Now()
	steps := []struct {
		p    agent.PoolFigures
		at   time.Duration
		want string // the event's reason, "" none
	}{
		{agent.PoolFigures{Ready: false, Reason: "connecting the provider"}, 0, ""},
		{agent.PoolFigures{Ready: true}, 2 * time.Second, ""},
		{agent.PoolFigures{Ready: true, Degraded: true, Reason: "neutron: 503"}, 3 * time.Second, EventDegraded},
		{agent.PoolFigures{Ready: true, Degraded: true, Reason: "neutron: 503"}, 4 * time.Second, ""},
		{agent.PoolFigures{Ready: true}, 5 * time.Second, EventRecovered},
		{agent.PoolFigures{Ready: false, Reason: "provider refused: policy"}, 6 * time.Second, ""},
		{agent.PoolFigures{Ready: false, Reason: "provider refused: policy"}, 50 * time.Second, ""},
		{agent.PoolFigures{Ready: false, Reason: "provider refused: policy"}, 67 * time.Second, EventNotReady},
		{agent.PoolFigures{Ready: false, Reason: "provider refused: policy"}, 90 * time.Second, ""},
		{agent.PoolFigures{Ready: false, Reason: "no VM port with 10.0.0.5"}, 95 * time.Second, EventNotReady},
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
