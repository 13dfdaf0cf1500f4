package faultproxy

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fixedIP and pair are a port's list entries as Neutron renders them.
type fixedIP struct {
	SubnetID  string `json:"subnet_id"`
	IPAddress string `json:"ip_address"`
}

type pair struct {
	IPAddress  string `json:"ip_address"`
	MACAddress string `json:"mac_address"`
}

// port is one port the stateful backend holds.
type port struct {
	ID          string    `json:"id"`
	Revision    int64     `json:"revision_number"`
	Description string    `json:"description"`
	FixedIPs    []fixedIP `json:"fixed_ips"`
	Pairs       []pair    `json:"allowed_address_pairs"`
}

// portBackend is a stand-in neutron-server that holds ports and applies
// PUTs to them under If-Match, as Neutron does, recording every request.
type portBackend struct {
	srv   *httptest.Server
	mu    sync.Mutex
	ports map[string]*port
	reqs  []seen
	// afterGet, if set, runs (under mu) after a GET of a port was answered:
	// a writer racing between a reader's GET and its PUT.
	afterGet func(p *port)
}

func newPortBackend(t *testing.T, ports ...port) *portBackend {
	b := &portBackend{ports: map[string]*port{}}
	for _, p := range ports {
		b.ports[p.ID] = &p
	}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *portBackend) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reqs = append(b.reqs, seen{r.Method, r.URL.Path, string(body), r.Header.Get("If-Match"), r.Header.Get("X-Auth-Token"), r.Host})
	id, ok := portID(r.URL.Path)
	p := b.ports[id]
	if !ok || p == nil {
		writeNeutronError(w, http.StatusNotFound, "PortNotFound", "Port "+id+" could not be found.")
		return
	}
	switch r.Method {
	case http.MethodGet:
		writePort(w, p)
		if b.afterGet != nil {
			b.afterGet(p)
		}
	case http.MethodPut:
		if rev, ok := ifMatchRevision(r); ok && rev != p.Revision {
			writeNeutronError(w, http.StatusPreconditionFailed, "RevisionNumberConstraintFailed",
				fmt.Sprintf("Constrained to %d, but current revision is %d", rev, p.Revision))
			return
		}
		var req struct {
			Port struct {
				Description *string    `json:"description"`
				FixedIPs    *[]fixedIP `json:"fixed_ips"`
				Pairs       *[]pair    `json:"allowed_address_pairs"`
			} `json:"port"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			writeNeutronError(w, http.StatusBadRequest, "HTTPBadRequest", err.Error())
			return
		}
		if req.Port.Description != nil {
			p.Description = *req.Port.Description
		}
		if req.Port.FixedIPs != nil {
			p.FixedIPs = *req.Port.FixedIPs
		}
		if req.Port.Pairs != nil {
			p.Pairs = *req.Port.Pairs
		}
		p.Revision++
		writePort(w, p)
	default:
		writeNeutronError(w, http.StatusMethodNotAllowed, "HTTPMethodNotAllowed", r.Method)
	}
}

func writePort(w http.ResponseWriter, p *port) {
	data, _ := json.Marshal(map[string]*port{"port": p})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// state returns a copy of port id as the backend holds it now.
func (b *portBackend) state(id string) port {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := *b.ports[id]
	p.FixedIPs = slices.Clone(p.FixedIPs)
	p.Pairs = slices.Clone(p.Pairs)
	return p
}

func (b *portBackend) received() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reqs)
}

// startOn is start for a port backend.
func startOn(t *testing.T, b *portBackend, seed uint64, f Faults) (*Proxy, string) {
	return listen(t, b.srv.URL, seed, f)
}

func fixed(ips ...string) []fixedIP {
	out := []fixedIP{}
	for _, ip := range ips {
		out = append(out, fixedIP{"s1", ip})
	}
	return out
}

func putBody(t *testing.T, desc string, f []fixedIP, pairs []pair) string {
	t.Helper()
	m := map[string]any{"description": desc, "fixed_ips": f}
	if pairs != nil {
		m["allowed_address_pairs"] = pairs
	}
	data, err := json.Marshal(map[string]any{"port": m})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func ipsOf(f []fixedIP) []string {
	var out []string
	for _, e := range f {
		out = append(out, e.IPAddress)
	}
	return out
}

// firstDraw is the number a proxy with seed draws for its first request.
func firstDraw(seed uint64) float64 { return rand.New(rand.NewPCG(seed, seed)).Float64() }

// split is how a PartialPut with the band's draw frac cuts n changes: how
// many land and whether the client's connection is dropped.
func split(frac float64, n int) (k int, drop bool) {
	u := frac * float64(n-1)
	return 1 + int(u), u-math.Floor(u) >= 0.5
}

// TestPartialPut: a batched PUT of a port lands in part and fails. The
// port ends with a prefix of the change (removals first, then additions)
// written under If-Match of the revision the proxy read; its other fields
// follow the body only once an addition landed; the client hears 500 or
// nothing. Each case runs under many seeds, so that every cut and both
// answers are seen.
func TestPartialPut(t *testing.T) {
	node := fixedIP{"s1", "10.0.0.10"}
	cases := []struct {
		name string
		cur  port
		// the client's body
		desc  string
		fixed []fixedIP
		pairs []pair
		// the port after k changes landed
		want func(k int) port
	}{{
		// Release [.3 .4] (vpcni's marks in the description): only the
		// first removal may land, and the marks stay the port's.
		name: "removals",
		cur:  port{ID: "abc", Revision: 7, Description: "marks:2,3,4", FixedIPs: append([]fixedIP{node}, fixed("10.0.0.2", "10.0.0.3", "10.0.0.4")...)},
		desc: "marks:2", fixed: append([]fixedIP{node}, fixed("10.0.0.2")...),
		want: func(k int) port {
			return port{Description: "marks:2,3,4", FixedIPs: append([]fixedIP{node}, fixed("10.0.0.2", "10.0.0.4")...)}
		},
	}, {
		// Assign [.5 .6 .7]: the first k land, marked by the body's
		// description (the marks of those that did not land are stale).
		name: "additions",
		cur:  port{ID: "abc", Revision: 3, Description: "marks:2", FixedIPs: append([]fixedIP{node}, fixed("10.0.0.2")...)},
		desc: "marks:2,5,6,7", fixed: append([]fixedIP{node}, fixed("10.0.0.2", "10.0.0.5", "10.0.0.6", "10.0.0.7")...),
		want: func(k int) port {
			return port{Description: "marks:2,5,6,7", FixedIPs: append([]fixedIP{node}, fixed(append([]string{"10.0.0.2"}, []string{"10.0.0.5", "10.0.0.6", "10.0.0.7"}[:k]...)...)...)}
		},
	}, {
		// One removal and two additions, and address pairs: the removals
		// of both lists first, then the additions.
		name: "mixed with pairs",
		cur: port{ID: "abc", Revision: 1, Description: "old", FixedIPs: append([]fixedIP{node}, fixed("10.0.0.2")...),
			Pairs: []pair{{"10.0.0.50", "fa:16:3e:00:00:01"}, {"10.0.0.51", "fa:16:3e:00:00:01"}}},
		desc: "new", fixed: append([]fixedIP{node}, fixed("10.0.0.3")...),
		pairs: []pair{{"10.0.0.51", "fa:16:3e:00:00:01"}, {"10.0.0.52", "fa:16:3e:00:00:01"}},
		want: func(k int) port {
			// changes: -.2 (fixed), -.50 (pair), +.3 (fixed), +.52 (pair)
			switch k {
			case 1:
				return port{Description: "old", FixedIPs: []fixedIP{node},
					Pairs: []pair{{"10.0.0.50", "fa:16:3e:00:00:01"}, {"10.0.0.51", "fa:16:3e:00:00:01"}}}
			case 2:
				return port{Description: "old", FixedIPs: []fixedIP{node}, Pairs: []pair{{"10.0.0.51", "fa:16:3e:00:00:01"}}}
			}
			return port{Description: "new", FixedIPs: append([]fixedIP{node}, fixed("10.0.0.3")...), Pairs: []pair{{"10.0.0.51", "fa:16:3e:00:00:01"}}}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changes := changeCount(tc.cur, tc.fixed, tc.pairs)
			seenK, seenDrop := map[int]bool{}, map[bool]bool{}
			for seed := uint64(1); seed <= 24; seed++ {
				b := newPortBackend(t, tc.cur)
				p, u := startOn(t, b, seed, Faults{PartialPut: 1})
				body := putBody(t, tc.desc, tc.fixed, tc.pairs)
				rev := fmt.Sprintf("revision_number=%d", tc.cur.Revision)
				a, err := do(client(t, 5*time.Second), "PUT", u+"/v2.0/ports/abc", body, "If-Match", rev, "X-Auth-Token", "tok")

				k, drop := split(firstDraw(seed), changes)
				seenK[k], seenDrop[drop] = true, true
				switch {
				case drop && err == nil:
					t.Fatalf("seed %d: want the connection dropped, got %+v", seed, a)
				case !drop && err != nil:
					t.Fatalf("seed %d: want a 500, got %v", seed, err)
				case !drop:
					if typ, _ := neutronErr(t, a); a.code != 500 || typ != "HTTPInternalServerError" {
						t.Fatalf("seed %d: got %d %s", seed, a.code, typ)
					}
				}
				got, want := b.state("abc"), tc.want(k)
				want.ID, want.Revision = "abc", tc.cur.Revision+1
				if want.Pairs == nil {
					want.Pairs = tc.cur.Pairs
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("seed %d (%d of %d changes): port\n %+v\nwant\n %+v", seed, k, changes, got, want)
				}
				// Neutron saw the proxy's read and its partial write, under
				// the revision read and the client's credentials; never the
				// client's own PUT.
				reqs := b.received()
				if len(reqs) != 2 || reqs[0].Method != "GET" || reqs[1].Method != "PUT" || reqs[1].IfMatch != rev ||
					reqs[0].Token != "tok" || reqs[1].Token != "tok" || reqs[1].Body == body {
					t.Fatalf("seed %d: backend got %+v", seed, reqs)
				}
				if c := p.Counts(); c["partial_put"] != 1 || c["passed"] != 0 || p.Partial() != 1 {
					t.Fatalf("seed %d: counts %v, partial %d", seed, c, p.Partial())
				}
			}
			if len(seenDrop) != 2 || len(seenK) != changes-1 {
				t.Fatalf("seeds 1-24 cut the %d changes only after %v, dropped %v: widen the seeds", changes, seenK, seenDrop)
			}
		})
	}
}

// changeCount is how many entries the body adds or removes.
func changeCount(cur port, f []fixedIP, pairs []pair) int {
	diff := func(a, b []string) int {
		n := 0
		for _, x := range a {
			if !slices.Contains(b, x) {
				n++
			}
		}
		for _, x := range b {
			if !slices.Contains(a, x) {
				n++
			}
		}
		return n
	}
	n := diff(ipsOf(cur.FixedIPs), ipsOf(f))
	if pairs != nil {
		var c, w []string
		for _, p := range cur.Pairs {
			c = append(c, p.IPAddress)
		}
		for _, p := range pairs {
			w = append(w, p.IPAddress)
		}
		n += diff(c, w)
	}
	return n
}

// TestPartialPutPassesWhenItCannot: with PartialPut certain, a write that
// cannot be cut short reaches Neutron as the client sent it — one change,
// a stale If-Match, a port changed between the proxy's read and its write
// — and counts as passed, not as a fault.
func TestPartialPutPassesWhenItCannot(t *testing.T) {
	node := fixedIP{"s1", "10.0.0.10"}
	cur := port{ID: "abc", Revision: 4, Description: "d", FixedIPs: []fixedIP{node, {"s1", "10.0.0.2"}}}
	c := client(t, 5*time.Second)

	// One change: nothing partial to do; the write lands whole.
	b := newPortBackend(t, cur)
	p, u := startOn(t, b, 1, Faults{PartialPut: 1})
	body := putBody(t, "d2", []fixedIP{node}, nil)
	if a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", body, "If-Match", "revision_number=4"); a.code != 200 {
		t.Fatalf("one change: got %+v", a)
	}
	if got := b.state("abc"); fmt.Sprint(ipsOf(got.FixedIPs)) != "[10.0.0.10]" || got.Description != "d2" || got.Revision != 5 {
		t.Fatalf("one change: port %+v", got)
	}
	if reqs := b.received(); reqs[len(reqs)-1].Body != body || p.Counts()["passed"] != 1 || p.Partial() != 0 {
		t.Fatalf("one change: backend got %+v, counts %v", reqs, p.Counts())
	}

	// A stale If-Match: Neutron refuses all of it, as it would without
	// the proxy.
	b = newPortBackend(t, cur)
	p, u = startOn(t, b, 1, Faults{PartialPut: 1})
	body = putBody(t, "d2", fixed("10.0.0.10", "10.0.0.5", "10.0.0.6"), nil)
	if a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", body, "If-Match", "revision_number=3"); a.code != 412 {
		t.Fatalf("stale If-Match: got %+v", a)
	}
	if got := b.state("abc"); got.Revision != 4 || p.Counts()["passed"] != 1 || p.Partial() != 0 {
		t.Fatalf("stale If-Match: port %+v, counts %v", got, p.Counts())
	}

	// Another writer between the proxy's read and its write: the partial
	// write fails its If-Match, and so does the client's own.
	b = newPortBackend(t, cur)
	b.afterGet = func(p *port) { p.Revision++ }
	p, u = startOn(t, b, 1, Faults{PartialPut: 1})
	if a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", body, "If-Match", "revision_number=4"); a.code != 412 {
		t.Fatalf("racing writer: got %+v", a)
	}
	reqs := b.received()
	if got := b.state("abc"); len(reqs) != 3 || reqs[2].Body != body || fmt.Sprint(ipsOf(got.FixedIPs)) != "[10.0.0.10 10.0.0.2]" ||
		p.Counts()["passed"] != 1 || p.Partial() != 0 {
		t.Fatalf("racing writer: port %+v, backend got %+v, counts %v", got, reqs, p.Counts())
	}

	// A body too large to inspect: forwarded whole.
	b = newPortBackend(t, cur)
	p, u = startOn(t, b, 1, Faults{PartialPut: 1})
	body = putBody(t, strings.Repeat("x", maxInspectBody), fixed("10.0.0.10", "10.0.0.5", "10.0.0.6"), nil)
	if a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", body); a.code != 200 {
		t.Fatalf("large body: got %d", a.code)
	}
	if reqs := b.received(); len(reqs) != 1 || reqs[0].Body != body || p.Counts()["passed"] != 1 || p.Partial() != 0 {
		t.Fatalf("large body: backend got %d requests (body intact: %v), counts %v", len(reqs), len(reqs) == 1 && reqs[0].Body == body, p.Counts())
	}

	// Not a port update: untouched.
	if a := mustDo(t, c, "GET", u+"/v2.0/ports/abc", ""); a.code != 200 || p.Counts()["passed"] != 2 {
		t.Fatalf("GET: %+v, counts %v", a, p.Counts())
	}
}

// TestPartialPortCuts: the cut itself, at chosen points of the draw.
func TestPartialPortCuts(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	cur := map[string]json.RawMessage{"id": raw(`"abc"`), "description": raw(`"old"`),
		"fixed_ips": raw(`[{"subnet_id":"s1","ip_address":"10.0.0.10"},{"subnet_id":"s1","ip_address":"10.0.0.2"},{"subnet_id":"s1","ip_address":"10.0.0.3"}]`)}
	want := map[string]json.RawMessage{"description": raw(`"new"`),
		"fixed_ips": raw(`[{"subnet_id":"s1","ip_address":"10.0.0.10"},{"subnet_id":"s1","ip_address":"10.0.0.7"},{"subnet_id":"s1","ip_address":"10.0.0.8"}]`)}
	// four changes: -.2 -.3 +.7 +.8; frac picks k = 1 + floor(frac*3)
	for _, tc := range []struct {
		frac float64
		ips  string
		desc bool
		drop bool
	}{
		{0, "10.0.0.10 10.0.0.3", false, false},
		{0.2, "10.0.0.10 10.0.0.3", false, true},
		{0.34, "10.0.0.10", false, false},
		{0.7, "10.0.0.10 10.0.0.7", true, false},
		{0.99, "10.0.0.10 10.0.0.7", true, true},
	} {
		part, drop, ok := partialPort(cur, want, tc.frac)
		if !ok {
			t.Fatalf("frac %v: no cut", tc.frac)
		}
		var f []fixedIP
		_ = json.Unmarshal(part["fixed_ips"], &f)
		_, hasDesc := part["description"]
		if got := strings.Join(ipsOf(f), " "); got != tc.ips || hasDesc != tc.desc || drop != tc.drop || part["id"] != nil {
			t.Errorf("frac %v: fixed %s, description written %v, drop %v; want %s, %v, %v", tc.frac, got, hasDesc, drop, tc.ips, tc.desc, tc.drop)
		}
	}
	// Nothing to cut: no change, one change, no list named.
	for _, w := range []map[string]json.RawMessage{
		{"fixed_ips": cur["fixed_ips"]},
		{"fixed_ips": raw(`[{"subnet_id":"s1","ip_address":"10.0.0.10"},{"subnet_id":"s1","ip_address":"10.0.0.2"}]`)},
		{"description": raw(`"x"`)},
	} {
		if _, _, ok := partialPort(cur, w, 0.5); ok {
			t.Errorf("cut %v", w)
		}
	}
}

// TestFailedReadBack: the first GET of a port after a PUT of it landed
// fails; the write stays applied; the next GET, a GET of another port,
// and a GET after a refused PUT pass.
func TestFailedReadBack(t *testing.T) {
	cur := port{ID: "abc", Revision: 1, FixedIPs: fixed("10.0.0.10")}
	b := newPortBackend(t, cur, port{ID: "other", Revision: 1})
	p, u := startOn(t, b, 1, Faults{FailedReadBack: 1})
	c := client(t, 5*time.Second)
	steps := []struct {
		method, path, body, ifMatch string
		code                        int
	}{
		{"GET", "/v2.0/ports/abc", "", "", 200},                                                   // nothing written yet
		{"PUT", "/v2.0/ports/abc", putBody(t, "x", fixed("10.0.0.10", "10.0.0.2"), nil), "", 200}, // lands
		{"GET", "/v2.0/ports/other", "", "", 200},                                                 // another port
		{"GET", "/v2.0/ports/abc", "", "", 503},                                                   // the read-back
		{"GET", "/v2.0/ports/abc", "", "", 200},                                                   // read again
		{"PUT", "/v2.0/ports/abc", putBody(t, "y", fixed("10.0.0.10"), nil), "revision_number=1", 412},
		{"GET", "/v2.0/ports/abc", "", "", 200}, // after a refused write: no read-back
	}
	for i, s := range steps {
		var hdr []string
		if s.ifMatch != "" {
			hdr = []string{"If-Match", s.ifMatch}
		}
		a := mustDo(t, c, s.method, u+s.path, s.body, hdr...)
		if a.code != s.code {
			t.Fatalf("step %d %s %s: got %d, want %d: %s", i, s.method, s.path, a.code, s.code, a.body)
		}
		if s.code == 503 {
			if typ, _ := neutronErr(t, a); typ != "ServiceUnavailable" {
				t.Fatalf("step %d: %s", i, typ)
			}
		}
	}
	// The write applied; the failed read-back never reached Neutron.
	if got := b.state("abc"); fmt.Sprint(ipsOf(got.FixedIPs)) != "[10.0.0.10 10.0.0.2]" || got.Revision != 2 {
		t.Fatalf("port %+v", got)
	}
	if n := len(b.received()); n != len(steps)-1 {
		t.Fatalf("backend saw %d requests, want %d", n, len(steps)-1)
	}
	if c := p.Counts(); c["failed_read_back"] != 1 || c["passed"] != int64(len(steps)-1) || p.Partial() != 1 {
		t.Fatalf("counts %v, partial %d", c, p.Partial())
	}
}

// TestNthCall: faults placed by count land on exactly the Nth matching
// request, answer as Neutron words them, forward nothing, and count again
// after SetFaults.
func TestNthCall(t *testing.T) {
	cur := port{ID: "abc", Revision: 1, FixedIPs: fixed("10.0.0.10")}
	b := newPortBackend(t, cur)
	p, u := startOn(t, b, 1, Faults{Nth: []NthCall{
		{Method: "put", Path: "/v2.0/ports/*", N: 3, Status: 409},
		{Method: "GET", N: 2, Status: 500},
		{Path: "/v2.0/networks/*", N: 1, Status: 412}, // never matched
	}})
	c := client(t, 5*time.Second)
	put := func(ip string) string { return putBody(t, "", fixed("10.0.0.10", ip), nil) }
	for i, s := range []struct {
		method, body string
		code         int
		typ, msg     string
	}{
		{"PUT", put("10.0.0.2"), 200, "", ""},
		{"GET", "", 200, "", ""},
		{"PUT", put("10.0.0.3"), 200, "", ""},
		{"GET", "", 500, "HTTPInternalServerError", "Request Failed: internal server error while processing your request."},
		{"PUT", put("10.0.0.4"), 409, "IpAddressAlreadyAllocated", "IP address 10.0.0.4 already allocated in subnet s1"},
		{"PUT", put("10.0.0.5"), 200, "", ""},
		{"GET", "", 200, "", ""},
	} {
		a := mustDo(t, c, s.method, u+"/v2.0/ports/abc", s.body)
		if a.code != s.code {
			t.Fatalf("request %d: got %d, want %d", i, a.code, s.code)
		}
		if s.typ != "" {
			if typ, msg := neutronErr(t, a); typ != s.typ || msg != s.msg {
				t.Fatalf("request %d: got %s %q", i, typ, msg)
			}
		}
	}
	// PUTs 1, 2 and 4 applied; the third never reached Neutron.
	if got := b.state("abc"); fmt.Sprint(ipsOf(got.FixedIPs)) != "[10.0.0.10 10.0.0.5]" || got.Revision != 4 {
		t.Fatalf("port %+v", got)
	}
	if c := p.Counts(); c["nth_call"] != 2 || c["passed"] != 5 || p.Partial() != 2 {
		t.Fatalf("counts %v, partial %d", c, p.Partial())
	}
	// A new rule set counts from zero: the first request is a first.
	p.SetFaults(Faults{Nth: []NthCall{{N: 1, Status: 412}, {N: 2, Status: 418}}})
	a := mustDo(t, c, "PUT", u+"/v2.0/ports/abc", put("10.0.0.6"), "If-Match", "revision_number=4")
	if typ, _ := neutronErr(t, a); a.code != 412 || typ != "RevisionNumberConstraintFailed" {
		t.Fatalf("412: %d %s", a.code, typ)
	}
	a = mustDo(t, c, "GET", u+"/v2.0/ports/abc", "")
	if typ, _ := neutronErr(t, a); a.code != 418 || typ != "HTTPError" {
		t.Fatalf("418: %d %s", a.code, typ)
	}
	if got := b.state("abc"); got.Revision != 4 || p.Counts()["nth_call"] != 4 {
		t.Fatalf("port %+v, counts %v", got, p.Counts())
	}
}

// TestLostReplyCountsLandedWrites: only a lost answer to a write Neutron
// applied is a partial fault.
func TestLostReplyCountsLandedWrites(t *testing.T) {
	cur := port{ID: "abc", Revision: 1, FixedIPs: fixed("10.0.0.10")}
	b := newPortBackend(t, cur)
	p, u := startOn(t, b, 1, Faults{LostReply: 1})
	c := client(t, 5*time.Second)
	for _, r := range [][3]string{
		{"GET", "", ""}, // a read
		{"PUT", putBody(t, "", fixed("10.0.0.10", "10.0.0.2"), nil), "revision_number=9"}, // refused
		{"PUT", putBody(t, "", fixed("10.0.0.10", "10.0.0.3"), nil), "revision_number=1"}, // lands
	} {
		var hdr []string
		if r[2] != "" {
			hdr = []string{"If-Match", r[2]}
		}
		if a, err := do(c, r[0], u+"/v2.0/ports/abc", r[1], hdr...); err == nil {
			t.Fatalf("%s: answered %+v", r[0], a)
		}
	}
	if got := b.state("abc"); fmt.Sprint(ipsOf(got.FixedIPs)) != "[10.0.0.10 10.0.0.3]" || got.Revision != 2 {
		t.Fatalf("port %+v", got)
	}
	if c := p.Counts(); c["lost_reply"] != 3 || p.Partial() != 1 {
		t.Fatalf("counts %v, partial %d", c, p.Partial())
	}
}

// runPorts drives a fixed sequence of reads and writes of a port through
// every fault at once, and returns what the client saw, the counts and the
// port at the end.
func runPorts(t *testing.T, seed uint64, n int) ([]string, map[string]int64, int64, port) {
	b := newPortBackend(t, port{ID: "abc", Revision: 1, FixedIPs: fixed("10.0.0.10")})
	p, u := startOn(t, b, seed, Faults{ServerError: .1, Timeout: .05, LostReply: .1, Conflict409: .1, Precondition412: .1,
		PartialPut: .25, FailedReadBack: .3, HoldFor: 20 * time.Millisecond,
		Nth: []NthCall{{Method: "PUT", N: 5, Status: 500}}})
	c := client(t, 5*time.Second)
	var out []string
	for i := range n {
		if i%2 == 1 {
			a, err := do(c, "GET", u+"/v2.0/ports/abc", "")
			out = append(out, fmt.Sprint(a.code, err != nil))
			continue
		}
		// Each write swaps two of the pod addresses for two others.
		ips := []string{"10.0.0.10", fmt.Sprintf("10.0.0.%d", 20+i), fmt.Sprintf("10.0.0.%d", 21+i)}
		a, err := do(c, "PUT", u+"/v2.0/ports/abc", putBody(t, fmt.Sprint(i), fixed(ips...), nil))
		out = append(out, fmt.Sprint(a.code, err != nil))
	}
	return out, p.Counts(), p.Partial(), b.state("abc")
}

// TestDeterminismPartial: the partial faults, too, are the same under the
// same seed — what the client saw and what the port became.
func TestDeterminismPartial(t *testing.T) {
	const n = 60
	o1, c1, p1, s1 := runPorts(t, 42, n)
	o2, c2, p2, s2 := runPorts(t, 42, n)
	if fmt.Sprint(o1, c1, p1, s1) != fmt.Sprint(o2, c2, p2, s2) {
		t.Fatalf("same seed, different runs:\n%v %v %d %+v\n%v %v %d %+v", o1, c1, p1, s1, o2, c2, p2, s2)
	}
	for _, k := range []string{"partial_put", "failed_read_back", "nth_call"} {
		if c1[k] == 0 {
			t.Errorf("no %s in %d requests: counts %v", k, n, c1)
		}
	}
	var sum int64
	for _, v := range c1 {
		sum += v
	}
	// Partial: the partial kinds and the lost replies of landed writes.
	lostWrites := p1 - c1["partial_put"] - c1["failed_read_back"] - c1["nth_call"]
	if sum != n || lostWrites < 0 || lostWrites > c1["lost_reply"] {
		t.Fatalf("counts %v add up to %d, want %d; partial %d", c1, sum, n, p1)
	}
	t.Logf("outcomes %v counts %v partial %d port %+v", o1, c1, p1, s1)
}
