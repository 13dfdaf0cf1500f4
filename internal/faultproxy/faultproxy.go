// Package faultproxy is a fault-injecting HTTP reverse proxy to put in front
// of a real neutron-server during chaos tests.
//
// Every request draws exactly one number from a seeded PCG generator and that
// draw decides, against the cumulative probabilities of Faults in a fixed
// order (ServerError, Timeout, LostReply, Conflict409, Precondition412),
// whether the request is forwarded untouched or meets a fault. A draw that
// lands on a fault that does not apply to the request (Conflict409 on
// anything but PUT /v2.0/ports/{id}, Precondition412 without If-Match, any
// fault on a method outside OnlyMethods) lets the request pass. Given the
// same seed and the same sequence of requests, the outcomes are the same.
package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// DefaultHoldFor is how long a Timeout fault holds a request when
// Faults.HoldFor is not set.
const DefaultHoldFor = 30 * time.Second

// maxInspectBody bounds how much of a request body is read to build the
// Conflict409 message.
const maxInspectBody = 1 << 20

// Faults are per-request probabilities in [0, 1]; values outside are clamped.
// The zero value passes every request through. If the probabilities add up to
// more than 1, the faults late in the order get what is left.
type Faults struct {
	// ServerError answers 503 ServiceUnavailable without forwarding. It
	// models an overloaded or restarting neutron-server (or the API
	// load balancer in front of it): nothing was applied and the client
	// is told so.
	ServerError float64
	// Timeout does not forward; it holds the request until the client
	// gives up, HoldFor passes or the proxy is closed, then closes the
	// connection without answering. It models a hung server or a
	// black-holed network: nothing was applied and the client never hears.
	Timeout float64
	// LostReply forwards the request, waits for Neutron's answer, then
	// drops it by closing the client connection (502 if the connection
	// cannot be hijacked). It models "the cloud did it but the client
	// never heard" (a crash, a reset or a proxy timeout after the write
	// was committed): the crucial case for crash consistency, because the
	// client must not assume that an error means nothing happened.
	//
	// Go's http.Transport silently retries an idempotent request (GET,
	// HEAD, OPTIONS, TRACE) that dies this way on a reused keep-alive
	// connection; the retry draws again.
	LostReply float64
	// Conflict409 applies only to PUT /v2.0/ports/{id}: it answers 409
	// IpAddressAlreadyAllocated without forwarding, naming the last
	// ip_address (and its subnet_id) of the body's port.fixed_ips. It
	// models a race with another writer that took the address first.
	Conflict409 float64
	// Precondition412 applies only to requests with an If-Match header: it
	// answers 412 RevisionNumberConstraintFailed without forwarding. It
	// models a concurrent update of the resource between the client's read
	// and its conditional write.
	Precondition412 float64
	// OnlyMethods, if not empty, restricts faults to these HTTP methods
	// (compared case-insensitively); other requests always pass.
	OnlyMethods []string
	// HoldFor bounds how long a Timeout fault holds a request; zero or
	// negative means DefaultHoldFor.
	HoldFor time.Duration
}

type outcome int

const (
	passed outcome = iota
	serverError
	timeout
	lostReply
	conflict409
	precondition412
	numOutcomes
)

// outcomeNames are the keys of Counts, indexed by outcome.
var outcomeNames = [numOutcomes]string{"passed", "server_error", "timeout", "lost_reply", "conflict409", "precondition412"}

// Proxy is a fault-injecting reverse proxy. It is an http.Handler, so it can
// also be served by a server of the caller's choosing instead of Listen.
type Proxy struct {
	target    *url.URL
	transport *http.Transport
	rp        *httputil.ReverseProxy
	ctx       context.Context // cancelled by Close; releases held and forwarded requests
	cancel    context.CancelFunc
	inflight  sync.WaitGroup

	mu        sync.Mutex
	rng       *rand.Rand
	faults    Faults
	counts    [numOutcomes]int64
	closed    bool
	srv       *http.Server
	serveDone chan struct{}
}

// New returns a pass-through proxy to target, e.g. "http://127.0.0.1:19696".
// seed makes the fault decisions reproducible.
func New(target string, seed uint64) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: target %q: want http(s)://host[:port]", target)
	}
	p := &Proxy{
		target:    u,
		transport: http.DefaultTransport.(*http.Transport).Clone(),
		rng:       rand.New(rand.NewPCG(seed, seed)),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.rp = &httputil.ReverseProxy{
		// SetURL also rewrites the Host header to the target's. Other
		// end-to-end headers (If-Match, X-Auth-Token, ...) are kept.
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport: p.transport,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeNeutronError(w, http.StatusBadGateway, "BadGateway", "faultproxy: "+err.Error())
		},
	}
	return p, nil
}

// SetFaults replaces the faults for the requests that arrive from now on. It
// is safe to call while serving.
func (p *Proxy) SetFaults(f Faults) {
	f.OnlyMethods = append([]string(nil), f.OnlyMethods...)
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// Counts says how many requests passed and how many of each fault were
// injected. Every key is present, zero or not.
func (p *Proxy) Counts() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]int64, numOutcomes)
	for i, n := range p.counts {
		m[outcomeNames[i]] = n
	}
	return m
}

// Listen starts serving on addr (e.g. "127.0.0.1:0") and returns the address
// actually listened on. A proxy listens at most once.
func (p *Proxy) Listen(addr string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", errors.New("faultproxy: closed")
	}
	if p.srv != nil {
		return "", errors.New("faultproxy: already listening")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("faultproxy: %w", err)
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	p.serveDone = make(chan struct{})
	go func(srv *http.Server, done chan struct{}) {
		defer close(done)
		_ = srv.Serve(ln) // returns http.ErrServerClosed after Close
	}(p.srv, p.serveDone)
	return ln.Addr().String(), nil
}

// Close stops the listener, closes client connections, releases held
// (Timeout) requests, cancels forwarded ones and waits for every request
// being handled to finish. Later requests get 503. Close is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	srv, serveDone := p.srv, p.serveDone
	p.mu.Unlock()

	p.cancel()
	var err error
	if srv != nil {
		err = srv.Close()
		<-serveDone
	}
	p.inflight.Wait()
	p.transport.CloseIdleConnections()
	return err
}

// ServeHTTP decides the fate of one request and carries it out.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		writeNeutronError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "faultproxy is closed")
		return
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	// The request ends when the client goes away or the proxy closes.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	r = r.WithContext(ctx)

	o, hold := p.decide(r)
	switch o {
	case serverError:
		writeNeutronError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "injected by faultproxy")
	case timeout:
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		if !dropConnection(w) {
			panic(http.ErrAbortHandler) // aborts the response without logging
		}
	case lostReply:
		p.rp.ServeHTTP(&discardWriter{header: http.Header{}}, r)
		if !dropConnection(w) {
			writeNeutronError(w, http.StatusBadGateway, "BadGateway", "faultproxy: reply lost, connection cannot be hijacked")
		}
	case conflict409:
		ip, subnet := lastFixedIP(r)
		writeNeutronError(w, http.StatusConflict, "IpAddressAlreadyAllocated",
			fmt.Sprintf("IP address %s already allocated in subnet %s", ip, subnet))
	case precondition412:
		writeNeutronError(w, http.StatusPreconditionFailed, "RevisionNumberConstraintFailed",
			"Constrained to 0, but current revision is 1")
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// decide draws once for r and counts the outcome. It also returns how long a
// Timeout fault holds the request.
func (p *Proxy) decide(r *http.Request) (outcome, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	x := p.rng.Float64()
	o := pick(f, x)
	if o != passed && (!methodAllowed(f.OnlyMethods, r.Method) || !applies(o, r)) {
		o = passed
	}
	p.counts[o]++
	hold := f.HoldFor
	if hold <= 0 {
		hold = DefaultHoldFor
	}
	return o, hold
}

// pick compares x in [0, 1) against the cumulative probabilities of f.
func pick(f Faults, x float64) outcome {
	sum := 0.0
	for i, v := range [...]float64{f.ServerError, f.Timeout, f.LostReply, f.Conflict409, f.Precondition412} {
		sum += clamp01(v)
		if x < sum {
			return serverError + outcome(i)
		}
	}
	return passed
}

func clamp01(v float64) float64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return min(v, 1)
}

func methodAllowed(only []string, method string) bool {
	if len(only) == 0 {
		return true
	}
	for _, m := range only {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// applies reports whether fault o can be injected on r at all.
func applies(o outcome, r *http.Request) bool {
	switch o {
	case conflict409:
		return r.Method == http.MethodPut && isPortPath(r.URL.Path)
	case precondition412:
		return len(r.Header.Values("If-Match")) > 0
	}
	return true
}

// isPortPath matches .../v2.0/ports/{id}; the endpoint may have a path prefix.
func isPortPath(path string) bool {
	s := strings.Split(path, "/")
	n := len(s)
	return n >= 3 && s[n-3] == "v2.0" && s[n-2] == "ports" && s[n-1] != ""
}

// lastFixedIP returns the last ip_address in the body's port.fixed_ips and
// that entry's subnet_id, defaulting to 0.0.0.0 and "unknown". The body is
// restored so that r could still be forwarded.
func lastFixedIP(r *http.Request) (ip, subnet string) {
	ip, subnet = "0.0.0.0", "unknown"
	if r.Body == nil {
		return ip, subnet
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxInspectBody))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Port struct {
			FixedIPs []struct {
				SubnetID  string `json:"subnet_id"`
				IPAddress string `json:"ip_address"`
			} `json:"fixed_ips"`
		} `json:"port"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ip, subnet
	}
	for i := len(req.Port.FixedIPs) - 1; i >= 0; i-- {
		if e := req.Port.FixedIPs[i]; e.IPAddress != "" {
			if e.SubnetID != "" {
				subnet = e.SubnetID
			}
			return e.IPAddress, subnet
		}
	}
	return ip, subnet
}

// dropConnection closes the client connection without a response. It reports
// false if the connection cannot be hijacked (e.g. HTTP/2).
func dropConnection(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// neutronError renders an error body the way neutron-server does.
func neutronError(typ, msg string) []byte {
	t, _ := json.Marshal(typ)
	m, _ := json.Marshal(msg)
	return fmt.Appendf(nil, `{"NeutronError": {"type": %s, "message": %s, "detail": ""}}`, t, m)
}

func writeNeutronError(w http.ResponseWriter, code int, typ, msg string) {
	body := neutronError(typ, msg)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// discardWriter swallows a forwarded answer for LostReply.
type discardWriter struct{ header http.Header }

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}
