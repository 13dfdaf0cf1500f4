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
		{"gone node's port", Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p9", NodeIPs: on(gone)}, Orphan, "no Node has"},
		{"gone node, gone pod", Holding{Kind: FixedIP, Address: "10.0.0.51", Resource: "p9", NodeIPs: on(gone)}, Orphan, "which is gone"},
		{"reservation port of a gone VM port", Holding{Kind: ReservationPort, Address: "10.0.0.71", Resource: "r1", VMPort: "p8"}, Orphan, "VM port p8 is gone"},
		{"reservation port of a live node", Holding{Kind: ReservationPort, Address: "10.0.0.71", Resource: "r1", VMPort: "p1", NodeIPs: on(n1)}, Held, "node n1"},
		{"NIC of a live node's instance", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n1", Instance: "i1", NodeIPs: on(n1), Carries: on(netip.MustParseAddr("10.0.0.80"))}, Held, "node n1"},
		{"NIC carrying a live pod's address", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n2", Instance: "i9", Carries: []netip.Addr{netip.MustParseAddr("10.0.0.80"), netip.MustParseAddr("10.0.0.50")}}, Held, "pod default/web"},
		{"NIC of a gone instance", Holding{Kind: NICPort, Address: "10.0.0.80", Resource: "n3", Instance: "i9", Carries: on(netip.MustParseAddr("10.0.0.80"))}, Orphan, "instance i9"},
		{"floating IP of a live pod", Holding{Kind: FloatingIP, Address: "203.0.113.5", Resource: "f1", Pod: "default/web", Policy: "release", Associated: true}, Held, "exists"},
		{"floating IP retained", Holding{Kind: FloatingIP, Address: "203.0.113.6", Resource: "f2", Pod: "default/old", Policy: "retain"}, Held, "next pod"},
		{"floating IP retained but attached", Holding{Kind: FloatingIP, Address: "203.0.113.6", Resource: "f2", Pod: "default/old", Policy: "retain", Associated: true}, Orphan, "still points"},
		{"floating IP of a gone pod", Holding{Kind: FloatingIP, Address: "203.0.113.7", Resource: "f3", Pod: "default/old", Policy: "release"}, Orphan, "is gone"},
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
			if f.Verdict == Orphan && f.Release == "" {
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
		kind := rapid.SampledFrom([]Kind{FixedIP, ReservationPort, NICPort, FloatingIP}).Draw(t, "kind")
		h := Holding{Kind: kind, Address: addr("held").String(), Resource: "x",
			NodeIPs: []netip.Addr{addr("port")}, Pod: "ns/p" + string(rune('a'+rapid.IntRange(0, 5).Draw(t, "fippod"))),
			Policy: rapid.SampledFrom([]string{"release", "retain"}).Draw(t, "policy"), Associated: rapid.Bool().Draw(t, "assoc")}
		h.Carries = []netip.Addr{netip.MustParseAddr(h.Address), addr("carried")}
		f := Judge(h, c)
		if f.Verdict != Orphan {
			return
		}
		a := netip.MustParseAddr(h.Address)
		switch {
		case kind == FloatingIP && c.Pods[h.Pod]:
			t.Fatalf("a live pod's floating IP judged orphan: %+v", f)
		case kind == NICPort && slices.ContainsFunc(h.Carries, func(x netip.Addr) bool { return c.Addresses[x].Live || c.Reservations[x] != "" }):
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

// cloudLog is the collector's side of the unit test: a list of holdings
// and a record of releases (the real cloud's contract is exercised in
// test/leaks against neutron-server).
type cloudLog struct {
	mu       sync.Mutex
	held     []Holding
	released []string
	fail     error
}

func (c *cloudLog) Holdings(context.Context) ([]Holding, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Holding(nil), c.held...), nil
}

func (c *cloudLog) Release(_ context.Context, h Holding) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return c.fail
	}
	c.released = append(c.released, h.Key())
	for i, x := range c.held {
		if x.Key() == h.Key() {
			c.held = append(c.held[:i], c.held[i+1:]...)
			break
		}
	}
	return nil
}

func TestCollectorReleasesOnlyAfterTheGrace(t *testing.T) {
	leak := Holding{Kind: FixedIP, Address: "10.0.0.70", Resource: "p9", NodeIPs: []netip.Addr{gone}}
	adopted := Holding{Kind: FixedIP, Address: "10.0.0.80", Resource: "p9", NodeIPs: []netip.Addr{gone}}
	route := Holding{Kind: Route, Address: "10.9.1.0/26", Resource: "r", NodeIPs: []netip.Addr{n1}}
	live := Holding{Kind: FixedIP, Address: "10.0.0.50", Resource: "p9", NodeIPs: []netip.Addr{gone}}
	cl := &cloudLog{held: []Holding{leak, adopted, route, live}}
	c := cluster()
	col := &Collector{Cloud: cl, Cluster: func(context.Context) (*Cluster, error) { return c, nil },
		Grace: 300 * time.Millisecond, Period: time.Hour, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()

	fs, err := col.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, f := range fs {
		if f.Released {
			t.Fatalf("released on first sight: %+v", f)
		}
		if f.OrphanSince != nil {
			marked++
		}
	}
	if marked != 2 { // leak and adopted; the route is the routes reconciler's
		t.Fatalf("%d marked, want 2: %+v", marked, fs)
	}
	// A slow agent's PodAddress shows up for one of them within the grace:
	// its mark goes.
	c.Pods["default/late"] = true
	c.Addresses[netip.MustParseAddr("10.0.0.80")] = PodAddress{Name: "pa-late", Pod: "default/late", Node: "n9", Live: true}
	cl.fail = errors.New("neutron down")
	time.Sleep(350 * time.Millisecond)
	if _, err := col.Pass(ctx); err == nil {
		t.Fatal("a failed release was not reported")
	}
	cl.fail = nil
	if _, err := col.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if len(cl.released) != 1 || cl.released[0] != leak.Key() {
		t.Fatalf("released %v, want only %s", cl.released, leak.Key())
	}
	// The adopted one orphaned again: its grace starts again.
	delete(c.Addresses, netip.MustParseAddr("10.0.0.80"))
	fs, _ = col.Pass(ctx)
	for _, f := range fs {
		if f.Address == "10.0.0.80" && (f.Released || f.ReleaseAt == nil || time.Until(*f.ReleaseAt) < 200*time.Millisecond) {
			t.Fatalf("re-orphaned holding not given a fresh grace: %+v", f)
		}
	}
	if got := testCount(col, FixedIP); got != 1 {
		t.Errorf("released counter %d, want 1", got)
	}
}

func testCount(c *Collector, k Kind) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.released[k]
}
