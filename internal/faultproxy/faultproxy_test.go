package faultproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is one request as the backend received it.
type seen struct{ Method, Path, Body, IfMatch, Token, Host string }

// backend is a stand-in neutron-server that records what reaches it.
type backend struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []seen
}

func newBackend(t *testing.T) *backend {
	b := &backend{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.reqs = append(b.reqs, seen{r.Method, r.URL.Path, string(body), r.Header.Get("If-Match"), r.Header.Get("X-Auth-Token"), r.Host})
		b.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"port": {"id": "abc", "echo": %q}}`, r.Method)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) received() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seen(nil), b.reqs...)
}

// start returns a listening proxy to b and its base URL.
func start(t *testing.T, b *backend, seed uint64, f Faults) (*Proxy, string) {
	return listen(t, b.srv.URL, seed, f)
}

// listen returns a listening proxy to the backend at url and its base URL.
func listen(t *testing.T, url string, seed uint64, f Faults) (*Proxy, string) {
	t.Helper()
	p, err := New(url, seed)
	if err != nil {
		t.Fatal(err)
	}
	p.SetFaults(f)
	addr, err := p.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, "http://" + addr
}

// client uses a fresh connection per request, so that Go's transport never
// retries a request whose reply was dropped on a reused connection.
func client(t *testing.T, timeout time.Duration) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

type answer struct {
	code     int
	body, ct string
}

func do(c *http.Client, method, url, body string, hdr ...string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get("Content-Type")}, err
}

func mustDo(t *testing.T, c *http.Client, method, url, body string, hdr ...string) answer {
	t.Helper()
	a, err := do(c, method, url, body, hdr...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return a
}

// neutronErr parses a NeutronError body, failing on anything else.
func neutronErr(t *testing.T, a answer) (typ, msg string) {
	t.Helper()
	var e struct {
		NeutronError struct{ Type, Message, Detail string }
	}
	if err := json.Unmarshal([]byte(a.body), &e); err != nil || a.ct != "application/json" {
		t.Fatalf("not a NeutronError (%v, Content-Type %q): %s", err, a.ct, a.body)
	}
	return e.NeutronError.Type, e.NeutronError.Message
}

const portBody = `{"port": {"fixed_ips": [{"subnet_id":"s1","ip_address":"10.0.0.5"},{"subnet_id":"s1","ip_address":"10.0.0.9"}]}}`

func TestPassThrough(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{})
	c := client(t, 5*time.Second)
	g := mustDo(t, c, "GET", u+"/v2.0/ports/abc", "", "X-Auth-Token", "tok")
	put := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", portBody, "If-Match", "revision_number=3", "X-Auth-Token", "tok")
	if g.code != 200 || g.body != `{"port": {"id": "abc", "echo": "GET"}}` || put.code != 200 || !strings.Contains(put.body, `"PUT"`) {
		t.Fatalf("answers not passed back: %+v %+v", g, put)
	}
	host := strings.TrimPrefix(b.srv.URL, "http://")
	want := []seen{
		{"GET", "/v2.0/ports/abc", "", "", "tok", host},
		{"PUT", "/v2.0/ports/abc", portBody, "revision_number=3", "tok", host},
	}
	if got := b.received(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("backend got %+v, want %+v", got, want)
	}
	if n := p.Counts(); n["passed"] != 2 || len(n) != int(numOutcomes) || p.Partial() != 0 {
		t.Fatalf("counts %v", n)
	}
}

func TestServerError(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{ServerError: 1})
	a := mustDo(t, client(t, 5*time.Second), "PUT", u+"/v2.0/ports/abc", portBody)
	want := `{"NeutronError": {"type": "ServiceUnavailable", "message": "injected by faultproxy", "detail": ""}}`
	if a.code != 503 || a.body != want || a.ct != "application/json" {
		t.Fatalf("got %+v", a)
	}
	if len(b.received()) != 0 || p.Counts()["server_error"] != 1 {
		t.Fatalf("backend reached %d times, counts %v", len(b.received()), p.Counts())
	}
}

func TestTimeout(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{Timeout: 1})
	t0 := time.Now()
	_, err := do(client(t, 300*time.Millisecond), "GET", u+"/v2.0/ports/abc", "")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want a client timeout, got %v", err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond || d > 5*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if len(b.received()) != 0 || p.Counts()["timeout"] != 1 {
		t.Fatalf("backend reached %d times, counts %v", len(b.received()), p.Counts())
	}
}

func TestLostReply(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{LostReply: 1})
	a, err := do(client(t, 5*time.Second), "PUT", u+"/v2.0/ports/abc", portBody, "If-Match", "revision_number=1")
	if err == nil {
		t.Fatalf("want a connection error, got %+v", a)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("want EOF or reset, not a timeout: %v", err)
	}
	t.Logf("client error: %v", err)
	// The reply is dropped only after Neutron answered: no polling needed.
	got := b.received()
	if len(got) != 1 || got[0].Method != "PUT" || got[0].Body != portBody || got[0].IfMatch != "revision_number=1" {
		t.Fatalf("backend got %+v", got)
	}
	// Neutron answered 200: the write landed, a partial fault.
	if p.Counts()["lost_reply"] != 1 || p.Partial() != 1 {
		t.Fatalf("counts %v, partial %d", p.Counts(), p.Partial())
	}
}

func TestConflict409(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{Conflict409: 1})
	c := client(t, 5*time.Second)
	for _, tc := range []struct{ body, msg string }{
		{portBody, "IP address 10.0.0.9 already allocated in subnet s1"},
		{`{"port": {"fixed_ips": []}}`, "IP address 0.0.0.0 already allocated in subnet unknown"},
		{`{"port": {"fixed_ips": [{"ip_address":"10.0.0.7"}]}}`, "IP address 10.0.0.7 already allocated in subnet unknown"},
		{`not json`, "IP address 0.0.0.0 already allocated in subnet unknown"},
	} {
		a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", tc.body)
		if typ, msg := neutronErr(t, a); a.code != 409 || typ != "IpAddressAlreadyAllocated" || msg != tc.msg {
			t.Errorf("body %s: got %d %s %q", tc.body, a.code, typ, msg)
		}
	}
	// Not a port update: passes even with Conflict409 = 1. The 409s above
	// did not reach the backend: it saw only these four.
	for _, r := range [][2]string{{"GET", "/v2.0/ports/abc"}, {"POST", "/v2.0/ports"}, {"PUT", "/v2.0/networks/n1"}, {"PUT", "/v2.0/ports/abc/bindings"}} {
		if a := mustDo(t, c, r[0], u+r[1], portBody); a.code != 200 {
			t.Errorf("%v: got %+v", r, a)
		}
	}
	if got := b.received(); len(got) != 4 || got[0].Method != "GET" {
		t.Fatalf("backend got %+v", got)
	}
	if n := p.Counts(); n["conflict409"] != 4 || n["passed"] != 4 {
		t.Fatalf("counts %v", n)
	}
}

func TestPrecondition412(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{Precondition412: 1})
	c := client(t, 5*time.Second)
	for _, m := range []string{"GET", "PUT"} {
		if a := mustDo(t, c, m, u+"/v2.0/ports/abc", portBody); a.code != 200 {
			t.Fatalf("%s without If-Match: %+v", m, a)
		}
	}
	a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", portBody, "If-Match", "revision_number=0")
	typ, msg := neutronErr(t, a)
	if a.code != 412 || typ != "RevisionNumberConstraintFailed" || msg != "Constrained to 0, but current revision is 1" {
		t.Fatalf("got %d %s %q", a.code, typ, msg)
	}
	if got := b.received(); len(got) != 2 || got[1].IfMatch != "" {
		t.Fatalf("backend got %+v", got)
	}
	if n := p.Counts(); n["precondition412"] != 1 || n["passed"] != 2 {
		t.Fatalf("counts %v", n)
	}
}

func TestOnlyMethods(t *testing.T) {
	b := newBackend(t)
	_, u := start(t, b, 1, Faults{ServerError: 1, OnlyMethods: []string{"PUT"}})
	c := client(t, 5*time.Second)
	for m, want := range map[string]int{"GET": 200, "PUT": 503} {
		if a := mustDo(t, c, m, u+"/v2.0/ports/abc", portBody); a.code != want {
			t.Fatalf("%s: got %+v, want %d", m, a, want)
		}
	}
	if got := b.received(); len(got) != 1 || got[0].Method != "GET" {
		t.Fatalf("backend got %+v", got)
	}
}

// run sends a fixed mix of requests through a fresh proxy and returns what
// each request saw, the counts and how many requests reached the backend.
func run(t *testing.T, seed uint64, n int) ([]string, map[string]int64, int) {
	b := newBackend(t)
	p, u := start(t, b, seed, Faults{ServerError: .2, Timeout: .2, LostReply: .2, Conflict409: .2, Precondition412: .2, HoldFor: 20 * time.Millisecond})
	c := client(t, 5*time.Second)
	reqs := [][3]string{{"GET", "/v2.0/ports/abc"}, {"PUT", "/v2.0/ports/abc", "revision_number=2"}, {"POST", "/v2.0/ports"}, {"DELETE", "/v2.0/ports/abc", "revision_number=2"}}
	var out []string
	for i := range n {
		r, hdr := reqs[i%len(reqs)], []string(nil)
		if r[2] != "" {
			hdr = []string{"If-Match", r[2]}
		}
		if a, err := do(c, r[0], u+r[1], portBody, hdr...); err != nil {
			out = append(out, "error")
		} else {
			out = append(out, fmt.Sprint(a.code))
		}
	}
	return out, p.Counts(), len(b.received())
}

func TestDeterminism(t *testing.T) {
	const n = 48
	o1, c1, r1 := run(t, 42, n)
	o2, c2, r2 := run(t, 42, n)
	if fmt.Sprint(o1) != fmt.Sprint(o2) || fmt.Sprint(c1) != fmt.Sprint(c2) || r1 != r2 {
		t.Fatalf("same seed, different runs:\n%v %v %d\n%v %v %d", o1, c1, r1, o2, c2, r2)
	}
	var sum int64
	for _, v := range c1 {
		sum += v
	}
	if sum != n {
		t.Fatalf("counts %v add up to %d, want %d", c1, sum, n)
	}
	// Forwarded requests are exactly the passed and lost replies.
	if int64(r1) != c1["passed"]+c1["lost_reply"] {
		t.Fatalf("backend saw %d requests, counts %v", r1, c1)
	}
	distinct := map[string]bool{}
	for _, o := range o1 {
		distinct[o] = true
	}
	if len(distinct) < 4 {
		t.Fatalf("too few distinct outcomes: %v", o1)
	}
	t.Logf("outcomes %v counts %v", o1, c1)
}

func TestDecideFrequencies(t *testing.T) {
	p1, _ := New("http://127.0.0.1:1", 7)
	p2, _ := New("http://127.0.0.1:1", 7)
	f := Faults{ServerError: .2, Timeout: .2, LostReply: .2, Conflict409: .2, Precondition412: .2}
	p1.SetFaults(f)
	p2.SetFaults(f)
	const n = 5000
	for i := range n {
		r := httptest.NewRequest("PUT", "/v2.0/ports/abc", strings.NewReader(portBody))
		r.Header.Set("If-Match", "revision_number=1")
		o1 := p1.decide(r).o
		o2 := p2.decide(r).o
		if o1 != o2 {
			t.Fatalf("request %d: decisions differ: %v, %v", i, o1, o2)
		}
	}
	counts := p1.Counts()
	for _, k := range []string{"server_error", "timeout", "lost_reply", "conflict409", "precondition412"} {
		if v := counts[k]; v < n/5-200 || v > n/5+200 {
			t.Errorf("%s: %d of %d, want about %d", k, v, n, n/5)
		}
	}
}

func TestSetFaultsSwitch(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{ServerError: 1})
	c := client(t, 5*time.Second)
	for i, f := range []float64{1, 0, 1, 0} {
		p.SetFaults(Faults{ServerError: f})
		if a := mustDo(t, c, "GET", u+"/v2.0/ports/abc", ""); a.code != map[float64]int{0: 200, 1: 503}[f] {
			t.Fatalf("round %d (ServerError %v): got %d", i, f, a.code)
		}
	}
	// Concurrent switching while serving (for the race detector).
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			p.SetFaults(Faults{ServerError: float64(i%2) / 2, OnlyMethods: []string{"GET"}})
			_, _ = do(c, "GET", u+"/v2.0/ports/abc", "")
		})
	}
	wg.Wait()
	n := p.Counts()
	if n["passed"]+n["server_error"] != 44 {
		t.Fatalf("counts %v", n)
	}
}

func TestCloseReleasesHeld(t *testing.T) {
	b := newBackend(t)
	p, u := start(t, b, 1, Faults{Timeout: 1}) // default HoldFor: 30s
	errc := make(chan error, 1)
	go func() {
		_, err := do(client(t, 0), "GET", u+"/v2.0/ports/abc", "")
		errc <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); p.Counts()["timeout"] == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("request never held")
		}
	}
	t0 := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("held request got an answer")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("held request not released")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("release took %v", d)
	}
	if _, err := p.Listen("127.0.0.1:0"); err == nil {
		t.Fatal("Listen after Close succeeded")
	}
	if len(b.received()) != 0 {
		t.Fatal("held request reached the backend")
	}
}

func TestNewRejectsBadTargets(t *testing.T) {
	for _, s := range []string{"", "127.0.0.1:19696", "ftp://h", "http://", "://x"} {
		if _, err := New(s, 0); err == nil {
			t.Errorf("New(%q) succeeded", s)
		}
	}
	b := newBackend(t)
	p, _ := start(t, b, 0, Faults{})
	if _, err := p.Listen("127.0.0.1:0"); err == nil {
		t.Fatal("second Listen succeeded")
	}
}
