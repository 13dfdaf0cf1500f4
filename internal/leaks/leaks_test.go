package leaks

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var (
	n1   = netip.MustParseAddr("10.0.0.11")
	gone = netip.MustParseAddr("10.0.0.99")
)

func cluster() *Cluster {
	c := NewCluster()
	c.AddNode("n1", []netip.Addr{n1})
	c.Instances["vm-1"] = "n1"
	c.Pods["default/web"] = true
	c.Addresses[netip.MustParseAddr("10.0.0.50")] = PodAddress{Name: "pa-web", Pod: "default/web", Node: "n1", Live: true}
	c.Addresses[netip.MustParseAddr("10.0.0.51")] = PodAddress{Name: "pa-old", Pod: "default/old", Node: "n9", Live: false}
	c.Reservations[netip.MustParseAddr("10.0.0.60")] = "db/db-0"
	c.Blocks[netip.MustParsePrefix("10.9.0.0/26")] = "n1"
	c.Blocks[netip.MustParsePrefix("10.9.0.64/26")] = "n9" // a gone node's, not yet reclaimed
	return c
}

func TestJudge(t *testing.T) {
	c := cluster()
	on := func(ip netip.Addr) []netip.Addr { return []netip.Addr{ip} }
	for _, tc := range []struct {
		name   string
		h      Holding
		want   Verdict
		reason string // a word the reason must hold
	}{
		{"live pod on a gone node's port", Holding{Kind: FixedIP, Address: "10.0.0.50", Resource: "p9", NodeIPs: on(gone)}, Held, "PodAddress pa-web"},
		{"reserved on a gone node's port", Holding{Kind: FixedIP, Address: "10.0.0.60", Resource: "p9", NodeIPs: on(gone)}, Held, "sticky"},
		{"pool address of a live node", Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p1", NodeIPs: on(n1)}, Held, "warm pool"},
		{"gone pod's address on a live node", Holding{Kind: FixedIP, Address: "10.0.0.51", Resource: "p1", NodeIPs: on(n1)}, Held, "orphans reconciler"},
		{"gone node's port", Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p9", NodeIPs: on(gone), Claimed: true}, Orphan, "no Node has"},
		{"never claimed here", Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p9", NodeIPs: on(gone)}, Unclaimed, "another cluster's"},
		{"node by its instance", Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p7", Instance: "vm-1", Claimed: true}, Held, "node n1"},
		{"unreadable marks", Holding{Kind: FixedIP, Address: "?", Resource: "p6", Unreadable: "bad mark", Claimed: true}, Held, "never released"},
		{"gone node, gone pod", Holding{Kind: FixedIP, Address: "10.0.0.51", Resource: "p9", NodeIPs: on(gone), Claimed: true}, Orphan, "which is gone"},
		{"reservation port of a gone VM port", Holding{Kind: ReservationPort, Address: "10.0.0.71", Resource: "r1", Port: "p8", Claimed: true}, Orphan, "VM port p8 is gone"},
		{"reservation port of a live node", Holding{Kind: ReservationPort, Address: "10.0.0.71", Resource: "r1", Port: "p1", NodeIPs: on(n1)}, Held, "node n1"},
		{"NIC of a live node's instance", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n1", Instance: "i1", NodeIPs: on(n1), Carries: on(netip.MustParseAddr("10.0.0.80"))}, Held, "node n1"},
		{"NIC carrying a live pod's address", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n2", Instance: "i9", Carries: []netip.Addr{netip.MustParseAddr("10.0.0.80"), netip.MustParseAddr("10.0.0.50")}}, Held, "pod default/web"},
		{"NIC of a gone instance", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n3", Instance: "i9", Carries: on(netip.MustParseAddr("10.0.0.80")), Claimed: true}, Orphan, "instance i9"},
		{"ENI of a live node's instance", Holding{Kind: ENI, Address: "10.0.0.82", Resource: "eni-1", Instance: "vm-1", Carries: on(netip.MustParseAddr("10.0.0.82"))}, Held, "node n1"},
		{"ENI reserved for a sticky pod", Holding{Kind: ENI, Address: "10.0.0.82", Resource: "eni-2", Instance: "i9", Carries: []netip.Addr{netip.MustParseAddr("10.0.0.82"), netip.MustParseAddr("10.0.0.60")}, Claimed: true}, Held, "db/db-0"},
		{"ENI of a gone instance", Holding{Kind: ENI, Address: "10.0.0.82", Resource: "eni-3", Instance: "i9", Carries: on(netip.MustParseAddr("10.0.0.82")), Claimed: true}, Orphan, "detaches the ENI if it is attached, and deletes it"},
		{"floating IP of a live pod", Holding{Kind: FloatingIP, Address: "203.0.113.5", Resource: "f1", Pod: "default/web", Policy: "release", Port: "p1"}, Held, "exists"},
		{"floating IP retained", Holding{Kind: FloatingIP, Address: "203.0.113.6", Resource: "f2", Pod: "default/old", Policy: "retain"}, Held, "next pod"},
		{"floating IP retained but attached", Holding{Kind: FloatingIP, Address: "203.0.113.6", Resource: "f2", Pod: "default/old", Policy: "retain", Port: "p1", Claimed: true}, Orphan, "still points"},
		{"floating IP of a gone pod", Holding{Kind: FloatingIP, Address: "203.0.113.7", Resource: "f3", Pod: "default/old", Policy: "release", Claimed: true}, Orphan, "is gone"},
		{"route of a block", Holding{Kind: Route, Address: "10.9.0.0/26", Resource: "r", NodeIPs: on(n1)}, Held, "NodeBlock"},
		{"route of a gone node's block", Holding{Kind: Route, Address: "10.9.0.64/26", Resource: "r", NodeIPs: on(gone)}, Held, "given back after the grace"},
		{"route with the wrong next hop", Holding{Kind: Route, Address: "10.9.0.0/26", Resource: "r", NodeIPs: on(gone)}, Orphan, "node n1's"},
		{"route of no block", Holding{Kind: Route, Address: "10.9.1.0/26", Resource: "r", NodeIPs: on(n1)}, Orphan, "no NodeBlock"},
		{"pair of a block", Holding{Kind: BlockPair, Address: "10.9.0.0/26", Resource: "p1", NodeIPs: on(n1)}, Held, "NodeBlock"},
		{"pair of no block", Holding{Kind: BlockPair, Address: "10.9.2.0/26", Resource: "p1", NodeIPs: on(n1)}, Orphan, "routes reconciler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Judge(tc.h, c)
			if f.Verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", f.Verdict, f.Reason, tc.want)
			}
			if text := f.Holder + " " + f.Reason + " " + f.Release; !strings.Contains(text, tc.reason) {
				t.Errorf("%q does not say %q", text, tc.reason)
			}
			if f.Verdict != Held && f.Release == "" {
				t.Error("an orphan without what releasing it does")
			}
		})
	}
}

// Whatever the cluster and the cloud: an address a live pod's PodAddress
// or a reservation names, or on a live Node's port, is never an orphan;
// nor is a live pod's floating IP.
func TestJudgeNeverOrphansWhatTheClusterNames(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := NewCluster()
		addr := func(label string) netip.Addr {
			return netip.AddrFrom4([4]byte{10, 0, 0, byte(rapid.IntRange(1, 40).Draw(t, label))})
		}
		for i := range rapid.IntRange(0, 5).Draw(t, "nodes") {
			c.AddNode(string(rune('a'+i)), []netip.Addr{addr("node")})
		}
		for range rapid.IntRange(0, 10).Draw(t, "pas") {
			pod := "ns/p" + string(rune('a'+rapid.IntRange(0, 5).Draw(t, "pod")))
			live := rapid.Bool().Draw(t, "live")
			if live {
				c.Pods[pod] = true
			}
			c.Addresses[addr("pa")] = PodAddress{Name: "pa", Pod: pod, Live: live}
		}
		for range rapid.IntRange(0, 3).Draw(t, "reservations") {
			c.Reservations[addr("res")] = "ns/r"
		}
		kind := rapid.SampledFrom([]Kind{FixedIP, ReservationPort, NICPort, ENI, FloatingIP}).Draw(t, "kind")
		h := Holding{Kind: kind, Address: addr("held").String(), Resource: "x",
			NodeIPs: []netip.Addr{addr("port")}, Pod: "ns/p" + string(rune('a'+rapid.IntRange(0, 5).Draw(t, "fippod"))),
			Policy: rapid.SampledFrom([]string{"release", "retain"}).Draw(t, "policy"), Port: rapid.SampledFrom([]string{"", "p1"}).Draw(t, "port"), Claimed: rapid.Bool().Draw(t, "claimed")}
		h.Carries = []netip.Addr{netip.MustParseAddr(h.Address), addr("carried")}
		f := Judge(h, c)
		if f.Verdict == Held {
			return
		}
		if f.Verdict == Orphan && !h.Claimed {
			t.Fatalf("an unclaimed holding judged orphan: %+v", f)
		}
		a := netip.MustParseAddr(h.Address)
		switch {
		case kind == FloatingIP && c.Pods[h.Pod]:
			t.Fatalf("a live pod's floating IP judged orphan: %+v", f)
		case (kind == NICPort || kind == ENI) && slices.ContainsFunc(h.Carries, func(x netip.Addr) bool { return c.Addresses[x].Live || c.Reservations[x] != "" }):
			t.Fatalf("a NIC carrying a live pod's or a reserved address judged orphan: %+v", f)
		case kind != FloatingIP && c.Addresses[a].Live:
			t.Fatalf("a live pod's address judged orphan: %+v", f)
		case kind != FloatingIP && c.Reservations[a] != "":
			t.Fatalf("a reserved address judged orphan: %+v", f)
		case kind != FloatingIP && c.Nodes[h.NodeIPs[0]] != "":
			t.Fatalf("a live node's address judged orphan: %+v", f)
		}
	})
}

// cloudLog is the collector's side of the unit test: holdings that
// claims tag and releases remove, each recorded (the real cloud's
// contract is exercised in test/leaks against neutron-server).
type cloudLog struct {
	mu       sync.Mutex
	held     []Holding
	claimed  []string
	released []string
	fail     error
	readErr  error // the cloud cannot be read
	// between runs after the first read of a pass (the cluster changing
	// while the collector looks).
	between func()
	reads   int
}

func (c *cloudLog) Holdings(context.Context) ([]Holding, error) {
	c.mu.Lock()
	if c.readErr != nil {
		defer c.mu.Unlock()
		return nil, c.readErr
	}
	c.reads++
	out := append([]Holding(nil), c.held...)
	between := c.between
	c.mu.Unlock()
	if between != nil {
		between()
	}
	return out, nil
}

func (c *cloudLog) Claim(_ context.Context, h Holding) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.claimed = append(c.claimed, h.Key())
	for i := range c.held {
		if c.held[i].Key() == h.Key() {
			c.held[i].Claimed = true
		}
	}
	return nil
}

func (c *cloudLog) Release(_ context.Context, h Holding) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return c.fail
	}
	c.released = append(c.released, h.Key())
	c.held = slices.DeleteFunc(c.held, func(x Holding) bool { return x.Key() == h.Key() })
	return nil
}

// Instance reads the fake cloud's provider IDs, test:///<id>.
func (c *cloudLog) Instance(providerID string) (string, bool) {
	return strings.CutPrefix(providerID, "test:///")
}

func TestCollectorReleasesOnlyAfterTheGrace(t *testing.T) {
	on := []netip.Addr{gone}
	leak := Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p9", NodeIPs: on, Claimed: true}
	adopted := Holding{Kind: FixedIP, Address: "10.0.0.80", Resource: "p9", NodeIPs: on, Claimed: true}
	late := Holding{Kind: FixedIP, Address: "10.0.0.81", Resource: "p9", NodeIPs: on, Claimed: true}
	foreign := Holding{Kind: FixedIP, Address: "10.0.0.90", Resource: "px", NodeIPs: on}
	fip := Holding{Kind: FloatingIP, Address: "203.0.113.9", Resource: "f9", Pod: "default/old", Policy: "release", Port: "p9", Claimed: true}
	route := Holding{Kind: Route, Address: "10.9.1.0/26", Resource: "r", NodeIPs: []netip.Addr{n1}}
	live := Holding{Kind: FixedIP, Address: "10.0.0.50", Resource: "p1", NodeIPs: []netip.Addr{n1}}
	cl := &cloudLog{held: []Holding{leak, adopted, late, foreign, fip, route, live}}
	c := cluster()
	clock := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	col := &Collector{Cloud: cl, Cluster: func(context.Context) (*Cluster, error) { return c, nil },
		Grace: time.Minute, Period: time.Minute, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return clock }}
	ctx := context.Background()
	pass := func() []Finding {
		t.Helper()
		fs, err := col.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	of := func(fs []Finding, h Holding) Finding {
		t.Helper()
		for _, f := range fs {
			if f.Key() == h.Key() {
				return f
			}
		}
		t.Fatalf("%s not in the findings", h.Key())
		return Finding{}
	}

	fs := pass()
	for _, h := range []Holding{leak, adopted, late, fip} {
		if f := of(fs, h); f.Verdict != Orphan || f.OrphanSince == nil || f.Released {
			t.Fatalf("first sight of %s: %+v, want marked, not released", h.Key(), f)
		}
	}
	if f := of(fs, foreign); f.Verdict != Unclaimed || f.OrphanSince != nil {
		t.Fatalf("a holding never claimed here: %+v, want unclaimed, not marked", f)
	}
	if f := of(fs, route); f.OrphanSince != nil {
		t.Fatalf("a route marked by the collector (the routes reconciler's): %+v", f)
	}
	if !slices.Equal(cl.claimed, []string{live.Key()}) {
		t.Fatalf("claimed %v, want only the live pod's address", cl.claimed)
	}

	// Within the grace: nothing goes. A slow agent's PodAddress for one.
	clock = clock.Add(59 * time.Second)
	c.Pods["default/slow"] = true
	c.Addresses[netip.MustParseAddr("10.0.0.80")] = PodAddress{Name: "pa-slow", Pod: "default/slow", Node: "n9", Live: true}
	if pass(); len(cl.released) != 0 {
		t.Fatalf("released within the grace: %v", cl.released)
	}

	// The grace passed; a PodAddress for "late" shows up between the
	// pass's first look and its releases: the second look keeps it. A
	// release that fails is tried again next pass.
	clock = clock.Add(2 * time.Second)
	second := cl.reads + 2 // this pass's second look
	cl.between = func() {
		if cl.reads == second {
			c.Pods["default/late"] = true
			c.Addresses[netip.MustParseAddr("10.0.0.81")] = PodAddress{Name: "pa-late", Pod: "default/late", Node: "n9", Live: true}
		}
	}
	cl.fail = errors.New("neutron down")
	fs = pass()
	if f := of(fs, leak); f.Error == "" || f.Released {
		t.Fatalf("failed release: %+v, want its error", f)
	}
	cl.fail = nil
	pass()
	if want := []string{fip.Key(), leak.Key()}; !slices.Equal(cl.released, want) {
		t.Fatalf("released %v, want %v (the floating IP first; not the adopted, the late, the foreign or the live)", cl.released, want)
	}
	if got := testCount(col, FixedIP); got != 1 {
		t.Errorf("released counter %d, want 1", got)
	}

	// The adopted one orphaned again: its grace starts again.
	delete(c.Addresses, netip.MustParseAddr("10.0.0.80"))
	fs = pass()
	if f := of(fs, adopted); f.Released || f.ReleaseAt == nil || !f.ReleaseAt.Equal(clock.Add(time.Minute)) {
		t.Fatalf("re-orphaned holding not given a fresh grace: %+v", f)
	}
}

func testCount(c *Collector, k Kind) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.released[k]
}

// What an operator must act on is told once per change: the first of a
// run of failing passes, and more unclaimed holdings than last told.
func TestCollectorTells(t *testing.T) {
	on := []netip.Addr{gone}
	cl := &cloudLog{readErr: errors.New("neutron: 503")}
	c := cluster()
	var told []string
	col := &Collector{Cloud: cl, Cluster: func(context.Context) (*Cluster, error) { return c, nil },
		Grace: time.Minute, Period: time.Minute, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tell: func(reason, msg string) { told = append(told, reason) }}
	ctx := context.Background()
	for range 2 {
		if _, err := col.Pass(ctx); err == nil {
			t.Fatal("a pass that cannot read the cloud did not fail")
		}
	}
	cl.readErr = nil
	cl.held = []Holding{{Kind: FixedIP, Address: "10.0.0.90", Resource: "px", NodeIPs: on}}
	col.Pass(ctx)
	col.Pass(ctx) // the same one unclaimed: nothing new
	cl.held = append(cl.held, Holding{Kind: NICPort, Address: "10.0.0.91", Resource: "nx", Instance: "i9", Carries: []netip.Addr{netip.MustParseAddr("10.0.0.91")}})
	col.Pass(ctx)
	if want := []string{EventPassFailed, EventUnclaimed, EventUnclaimed}; !slices.Equal(told, want) {
		t.Fatalf("told %v, want %v", told, want)
	}
}
