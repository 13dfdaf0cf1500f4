// Package faultproxy is a fault-injecting HTTP reverse proxy to put in front
// of a real neutron-server during chaos tests.
//
// Every request draws exactly one number from a seeded PCG generator and that
// draw decides, against the cumulative probabilities of Faults in a fixed
// order (ServerError, Timeout, LostReply, Conflict409, Precondition412,
// PartialPut, FailedReadBack), whether the request is forwarded untouched or
// meets a fault. A draw that lands on a fault that does not apply to the
// request (Conflict409 or PartialPut on anything but PUT /v2.0/ports/{id},
// Precondition412 without If-Match, FailedReadBack on anything but the first
// GET of a port after a write to it landed, any fault on a method outside
// OnlyMethods) lets the request pass. Faults.Nth places a fault on exactly
// the Nth request that matches a pattern instead, whatever the draw says
// (the request still draws, so the other decisions stay where they were).
// Given the same seed and the same sequence of requests, the outcomes are
// the same.
//
// Some faults leave the cloud and what the client was told disagreeing, or
// strike at one precise step of a multi-step operation: Partial counts them
// (see there).
package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
)

// DefaultHoldFor is how long a Timeout fault holds a request when
// Faults.HoldFor is not set.
const DefaultHoldFor = 30 * time.Second

// maxInspectBody bounds how much of a request body is read to name an
// address in a 409, or to cut a PartialPut short (and how much of the port
// a PartialPut reads): a larger body passes untouched.
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
	// PartialPut applies only to PUT /v2.0/ports/{id} whose body changes
	// the port's fixed_ips or allowed_address_pairs by at least two
	// entries: the proxy reads the port, writes only part of the change
	// (see partial.go), and answers the client 500 or drops the
	// connection. It models Neutron, or the database under it, committing
	// part of a batch before failing: the client must not assume that a
	// failed batch left the port as it was, nor that it did all of it.
	PartialPut float64
	// FailedReadBack applies only to the first GET of a port after a PUT
	// of that port landed (Neutron answered 2xx, whatever the client was
	// told): it answers 503 without forwarding. It models the read-back
	// after a write failing, so that the writer does not learn what its
	// write did.
	FailedReadBack float64
	// Nth places faults by count instead of by chance; see NthCall.
	Nth []NthCall
	// OnlyMethods, if not empty, restricts the drawn faults to these HTTP
	// methods (compared case-insensitively); other requests always pass.
	// Nth is not restricted by it.
	OnlyMethods []string
	// HoldFor bounds how long a Timeout fault holds a request; zero or
	// negative means DefaultHoldFor.
	HoldFor time.Duration
}

// NthCall answers Status without forwarding on exactly the Nth request (1
// for the first) that matches Method and Path, counted from the SetFaults
// that set it: a fault at a fixed step of an operation rather than at a
// random one. Status 409 answers IpAddressAlreadyAllocated (naming the
// body's last fixed IP, as Conflict409), 412 RevisionNumberConstraintFailed,
// 500 Neutron's internal server error, 503 ServiceUnavailable; any other
// status a generic NeutronError.
type NthCall struct {
	// Method matches case-insensitively; empty matches any.
	Method string
	// Path is a path.Match pattern for the request's URL path, e.g.
	// "/v2.0/ports/*"; empty matches any.
	Path   string
	N      int
	Status int
}

type outcome int

const (
	passed outcome = iota
	serverError
	timeout
	lostReply
	conflict409
	precondition412
	partialPut
	failedReadBack
	nthCall
	numOutcomes
)

// drawn are the outcomes a draw picks, in the order of their bands.
const drawn = failedReadBack - passed

// outcomeNames are the keys of Counts, indexed by outcome.
var outcomeNames = [numOutcomes]string{"passed", "server_error", "timeout", "lost_reply", "conflict409", "precondition412",
	"partial_put", "failed_read_back", "nth_call"}

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
	nthSeen   []int           // requests matched so far, per rule of faults.Nth
	landed    map[string]bool // ports whose last PUT landed and that no GET has read since
	counts    [numOutcomes]int64
	lostWrite int64 // LostReply on a write that Neutron applied (2xx)
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
		landed:    map[string]bool{},
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

// SetFaults replaces the faults for the requests that arrive from now on;
// the Nth rules count from here. It is safe to call while serving.
func (p *Proxy) SetFaults(f Faults) {
	f.OnlyMethods = append([]string(nil), f.OnlyMethods...)
	f.Nth = append([]NthCall(nil), f.Nth...)
	p.mu.Lock()
	p.faults = f
	p.nthSeen = make([]int, len(f.Nth))
	p.mu.Unlock()
}

// Counts says how many requests passed and how many of each fault were
// injected; they add up to the requests served. Every key is present, zero
// or not. A PartialPut whose partial write could not be made (the body
// changes fewer than two entries, the client's If-Match is stale, Neutron
// refused the partial write) forwards the request untouched and counts as
// passed.
func (p *Proxy) Counts() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]int64, numOutcomes)
	for i, n := range p.counts {
		m[outcomeNames[i]] = n
	}
	return m
}

// Partial counts the partial faults injected: the ones that leave the
// cloud having done something the client was told failed, or that strike
// one precise step of an operation. They are partial_put (a part of the
// batch landed), failed_read_back (a write landed, its read-back failed),
// nth_call (a placed fault) and the LostReply faults on a write (not GET,
// HEAD, OPTIONS or TRACE) that Neutron answered 2xx (the write landed, its
// answer was lost). A LostReply on a read, or on a write Neutron refused,
// changed nothing in the cloud and is not counted here.
func (p *Proxy) Partial() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[partialPut] + p.counts[failedReadBack] + p.counts[nthCall] + p.lostWrite
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

	d := p.decide(r)
	switch d.o {
	case serverError:
		writeStatus(w, r, http.StatusServiceUnavailable)
	case timeout:
		t := time.NewTimer(d.hold)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		if !dropConnection(w) {
			panic(http.ErrAbortHandler) // aborts the response without logging
		}
	case lostReply:
		dw := &discardWriter{header: http.Header{}}
		p.rp.ServeHTTP(dw, r)
		p.wrote(r, dw.status(), true)
		if !dropConnection(w) {
			writeNeutronError(w, http.StatusBadGateway, "BadGateway", "faultproxy: reply lost, connection cannot be hijacked")
		}
	case conflict409:
		writeStatus(w, r, http.StatusConflict)
	case precondition412:
		writeStatus(w, r, http.StatusPreconditionFailed)
	case partialPut:
		p.servePartial(w, r, d.frac)
	case failedReadBack:
		writeNeutronError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "injected by faultproxy: read-back failed")
	case nthCall:
		writeStatus(w, r, d.status)
	default:
		sw := &statusWriter{ResponseWriter: w}
		p.rp.ServeHTTP(sw, r)
		p.wrote(r, sw.code, false)
	}
}

// wrote notes what a forwarded request's answer says about the port: a
// PUT of a port that Neutron answered 2xx landed, and the next GET of that
// port is its read-back. lost says the answer never reached the client.
func (p *Proxy) wrote(r *http.Request, code int, lost bool) {
	ok := code >= 200 && code < 300
	p.mu.Lock()
	defer p.mu.Unlock()
	if lost && ok && !idempotent(r.Method) {
		p.lostWrite++
	}
	if id, isPort := portID(r.URL.Path); ok && isPort && r.Method == http.MethodPut {
		p.landed[id] = true
	}
}

// decision is what decide made of one request.
type decision struct {
	o    outcome
	hold time.Duration // how long a Timeout holds the request
	// frac is where the draw fell inside its fault's band, in [0, 1): it
	// picks how much of a PartialPut lands, without a second draw.
	frac   float64
	status int // an NthCall's answer
}

// decide draws once for r and counts the outcome, except a PartialPut's,
// which servePartial counts once it knows whether the partial write
// landed.
func (p *Proxy) decide(r *http.Request) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	x := p.rng.Float64()
	d := decision{hold: f.HoldFor}
	if d.hold <= 0 {
		d.hold = DefaultHoldFor
	}
	d.o, d.frac = pick(f, x)
	// The first GET of a port after a write to it landed is its
	// read-back, whatever becomes of it.
	readBack := false
	if id, ok := portID(r.URL.Path); ok && r.Method == http.MethodGet {
		readBack = p.landed[id]
		delete(p.landed, id)
	}
	if d.o != passed && (!methodAllowed(f.OnlyMethods, r.Method) || !applies(d.o, r, readBack)) {
		d.o = passed
	}
	fired := false
	for i, rule := range f.Nth {
		if !rule.matches(r) {
			continue
		}
		if p.nthSeen[i]++; p.nthSeen[i] == rule.N && !fired {
			d.o, d.status, fired = nthCall, rule.Status, true
		}
	}
	if d.o != partialPut {
		p.counts[d.o]++
	}
	return d
}

// pick compares x in [0, 1) against the cumulative probabilities of f, and
// says where x fell inside the band of the fault it picked.
func pick(f Faults, x float64) (outcome, float64) {
	sum := 0.0
	for i, v := range [drawn]float64{f.ServerError, f.Timeout, f.LostReply, f.Conflict409, f.Precondition412, f.PartialPut, f.FailedReadBack} {
		v = clamp01(v)
		if x < sum+v {
			return serverError + outcome(i), min((x-sum)/v, math.Nextafter(1, 0))
		}
		sum += v
	}
	return passed, 0
}

func (n NthCall) matches(r *http.Request) bool {
	if n.Method != "" && !strings.EqualFold(n.Method, r.Method) {
		return false
	}
	if n.Path == "" {
		return true
	}
	ok, err := path.Match(n.Path, r.URL.Path)
	return ok && err == nil
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

// applies reports whether fault o can be injected on r at all; readBack
// says r is the first GET of a port since a write to it landed.
func applies(o outcome, r *http.Request, readBack bool) bool {
	_, isPort := portID(r.URL.Path)
	switch o {
	case conflict409, partialPut:
		return r.Method == http.MethodPut && isPort
	case precondition412:
		return len(r.Header.Values("If-Match")) > 0
	case failedReadBack:
		return readBack
	}
	return true
}

// portID matches .../v2.0/ports/{id} (the endpoint may have a path prefix)
// and returns the id.
func portID(path string) (string, bool) {
	s := strings.Split(path, "/")
	n := len(s)
	if n >= 3 && s[n-3] == "v2.0" && s[n-2] == "ports" && s[n-1] != "" {
		return s[n-1], true
	}
	return "", false
}

// idempotent methods change nothing on the server (and Go's transport
// retries them by itself).
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
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

// writeStatus answers code the way neutron-server words it.
func writeStatus(w http.ResponseWriter, r *http.Request, code int) {
	switch code {
	case http.StatusConflict:
		ip, subnet := lastFixedIP(r)
		writeNeutronError(w, code, "IpAddressAlreadyAllocated", fmt.Sprintf("IP address %s already allocated in subnet %s", ip, subnet))
	case http.StatusPreconditionFailed:
		writeNeutronError(w, code, "RevisionNumberConstraintFailed", "Constrained to 0, but current revision is 1")
	case http.StatusInternalServerError:
		writeNeutronError(w, code, "HTTPInternalServerError", "Request Failed: internal server error while processing your request.")
	case http.StatusServiceUnavailable:
		writeNeutronError(w, code, "ServiceUnavailable", "injected by faultproxy")
	default:
		writeNeutronError(w, code, "HTTPError", fmt.Sprintf("injected by faultproxy: %d %s", code, http.StatusText(code)))
	}
}

// discardWriter swallows a forwarded answer for LostReply, keeping its
// status.
type discardWriter struct {
	header http.Header
	code   int
}

func (d *discardWriter) Header() http.Header { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	return len(b), nil
}
func (d *discardWriter) WriteHeader(code int) {
	if d.code == 0 {
		d.code = code
	}
}
func (d *discardWriter) Flush() {}

func (d *discardWriter) status() int { return d.code }

// statusWriter passes a forwarded answer through, keeping its status.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
