package agent

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/store"
)

// noticing is the static provider that, on its first Assign, reports a
// race the way the openstack provider does (provider.Node.Notify).
type noticing struct {
	provider.Provider
	notify func(provider.Notice)
	once   sync.Once
}

func (p *noticing) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	p.once.Do(func() {
		p.notify(provider.Notice{Reason: provider.ReasonWriteRace, Kind: "overlapped",
			Message: "vpcni's write landed over another", Attrs: []any{"port", "p1", "revisionRead", 4}})
	})
	return p.Provider.Assign(ctx, req)
}

func init() {
	registerWrapped("test-noticing", func(p provider.Provider, node provider.Node) provider.Provider {
		return &noticing{Provider: p, notify: node.Notify}
	})
}

// warnings is a Cluster that records the node warnings it hears.
type warnings struct {
	clusterLog
	mu   sync.Mutex
	told []string
}

func (w *warnings) NodeWarning(reason, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.told = append(w.told, reason+": "+message)
}

func (w *warnings) heard() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.told...)
}

// What the provider notices reaches the log (with its figures), the race
// counter by kind, and the cluster as a node warning.
func TestProviderNoticeIsLoggedCountedAndTold(t *testing.T) {
	n := newNode(t, "10.9.40.0/24", func(c *config.Config) {
		c.Provider = config.Provider{Type: "test-noticing", Settings: &static.Config{Ranges: []static.Range{{CIDR: "10.9.40.0/24"}}}}
	})
	st, err := store.Open(n.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	a, err := newAgent(context.Background(), n.cfg, slog.New(slog.NewTextHandler(&logged, nil)), st, n.dp)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	w := &warnings{clusterLog: clusterLog{a: a}}
	a.SetCluster(w)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() { a.Run(ctx); close(r.done) }()
	t.Cleanup(r.stop)

	r.add(t, "c1", n.pod("p1"))
	waitUntil(t, "the node warning", func() bool { return len(w.heard()) > 0 })
	if got := w.heard(); len(got) != 1 || got[0] != provider.ReasonWriteRace+": vpcni's write landed over another" {
		t.Errorf("the cluster heard %q", got)
	}
	if v := counterValue(t, a.metrics.CloudWriteRaces.WithLabelValues("overlapped")); v != 1 {
		t.Errorf("vpcni_cloud_write_races_total{kind=overlapped} = %v, want 1", v)
	}
	line := ""
	for _, l := range strings.Split(logged.String(), "\n") {
		if strings.Contains(l, "landed over another") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", "reason=" + provider.ReasonWriteRace, "kind=overlapped", "port=p1", "revisionRead=4"} {
		if !strings.Contains(line, want) {
			t.Errorf("the log line %q lacks %s", line, want)
		}
	}
}

// syncBuffer is a bytes.Buffer the agent's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
