package aws

import (
	"bufio"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// flakyEC2 stands between the agent and the lab's EC2 endpoint. It answers
// a share of the requests with one of EC2's server errors (500
// InternalError, 503 Unavailable) without passing them on: EC2 did
// nothing, and the client is told it may retry. It also counts what the
// endpoint's own faults did: requests throttled (503 RequestLimitExceeded)
// and replies lost after the call took effect (the endpoint closes the
// connection unanswered, seen here as a hijack).
type flakyEC2 struct {
	next http.Handler

	mu          sync.Mutex
	rng         *rand.Rand
	serverError float64
	counts      map[string]int
}

func newFlakyEC2(next http.Handler, seed uint64) *flakyEC2 {
	return &flakyEC2{next: next, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995)), counts: map[string]int{}}
}

// setServerErrors sets the share of requests answered with a 5xx.
func (f *flakyEC2) setServerErrors(p float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.serverError = p
}

// Counts is what happened to the requests so far: passed, server_error,
// throttled, lost_reply, and lost_write (a lost reply of a call that
// changes something: it took effect, the client never heard).
func (f *flakyEC2) Counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.counts)
}

func (f *flakyEC2) count(what string) {
	f.mu.Lock()
	f.counts[what]++
	f.mu.Unlock()
}

func (f *flakyEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Parsed here, the form stays on r for the endpoint (ParseForm reads
	// the body once).
	_ = r.ParseForm()
	action := r.Form.Get("Action")
	f.mu.Lock()
	x, p := f.rng.Float64(), f.serverError
	f.mu.Unlock()
	if x < p {
		status, code := http.StatusInternalServerError, "InternalError"
		if x < p/2 {
			status, code = http.StatusServiceUnavailable, "Unavailable"
		}
		body := `<?xml version="1.0" encoding="UTF-8"?>` + "\n<Response><Errors><Error><Code>" + code +
			"</Code><Message>injected by the chaos test</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
		f.count("server_error")
		return
	}
	ww := &watched{ResponseWriter: w}
	f.next.ServeHTTP(ww, r)
	switch {
	case ww.hijacked:
		f.count("lost_reply")
		if !strings.HasPrefix(action, "Describe") {
			f.count("lost_write")
		}
	case ww.status == http.StatusServiceUnavailable:
		// The endpoint answers 503 only when it throttles.
		f.count("throttled")
	default:
		f.count("passed")
	}
}

// watched notes the status the endpoint answered, or that it dropped the
// connection.
type watched struct {
	http.ResponseWriter
	status   int
	hijacked bool
}

func (w *watched) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *watched) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("the connection cannot be hijacked")
	}
	w.hijacked = true
	return h.Hijack()
}

// serveIn serves h on addr inside namespace ns until the test ends.
func serveIn(t *testing.T, ns, addr string, h http.Handler) {
	t.Helper()
	ln, err := netnsutil.Listen(netnsutil.Path(ns), addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}
