package addresses_test

// Refill under bursts: ADDs that find the pool empty share the provider's
// calls, are served first come first served, and lose nothing when they
// give up.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// slowCloud is the static provider behind a cloud whose Assign takes a
// while, can be held at a gate, and records what each call asked for and
// answered.
type slowCloud struct {
	*cloud
	delay time.Duration
	mu    sync.Mutex
	gate  chan struct{} // non-nil: Assign waits for it to close
	// during runs inside the next Assign, before it answers.
	during  func()
	asked   []int
	answers [][]netip.Addr
}

func (c *slowCloud) Assign(ctx context.Context, r provider.AssignRequest) ([]alloc.Lease, error) {
	c.mu.Lock()
	gate, during := c.gate, c.during
	c.during = nil
	c.mu.Unlock()
	if gate != nil {
		<-gate
	}
	time.Sleep(c.delay)
	if during != nil {
		during()
	}
	got, err := c.cloud.Assign(ctx, r)
	if r.Count > 0 {
		c.mu.Lock()
		c.asked = append(c.asked, r.Count)
		c.answers = append(c.answers, provider.Addresses(got))
		c.mu.Unlock()
	}
	return got, err
}

func (c *slowCloud) calls() (asked []int, answers [][]netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked), slices.Clone(c.answers)
}

// startManager runs a manager on c, connected at once.
func startManager(t *testing.T, c *slowCloud, pol addresses.Policy) *addresses.Manager {
	t.Helper()
	m := addresses.New(pol, "n", func(context.Context) (provider.Provider, error) { return c, nil }, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	return m
}

type taken struct {
	owner string
	lease alloc.Lease
	err   error
}

// takeAll runs Take for every owner at once and returns the answers in
// the owners' order.
func takeAll(ctx context.Context, m *addresses.Manager, owners []string) []taken {
	out := make([]taken, len(owners))
	var wg sync.WaitGroup
	for i, o := range owners {
		wg.Go(func() {
			l, err := m.Take(ctx, o)
			out[i] = taken{o, l, err}
		})
	}
	wg.Wait()
	return out
}

func owners(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// A burst of 100 ADDs on an empty pool with warmTarget 8 costs one or two
// provider calls (the first for the ADDs in line when it started, the
// second for all that queued meanwhile), not one call per batch of 8;
// every ADD gets an address of its own.
func TestBurstOnAnEmptyPoolSharesCalls(t *testing.T) {
	c := &slowCloud{cloud: newCloud(t, "10.1.30.0/24"), delay: 30 * time.Millisecond, gate: make(chan struct{})}
	pol := policy()
	// maxFree = warmTarget: the warm target stays 8 (it does not follow
	// the churn here), so the calls' sizes are known.
	pol.WarmTarget, pol.BatchSize, pol.MaxFree, pol.AddWait, pol.Tick = 8, 0, 8, 5*time.Second, time.Hour
	m := startManager(t, c, pol)
	// The pool's first refill is under way (held at the gate) when the
	// burst comes: the pool is empty.
	eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
	var got []taken
	done := make(chan struct{})
	go func() { got = takeAll(context.Background(), m, owners("p", 100)); close(done) }()
	eventually(t, "the burst in line", func() bool { return m.Status(time.Now()).Waiting == 100 })
	c.mu.Lock()
	close(c.gate)
	c.gate = nil
	c.mu.Unlock()
	<-done
	asked, _ := c.calls()
	seen := map[netip.Addr]string{}
	for _, g := range got {
		if g.err != nil {
			t.Fatalf("Take(%s): %v", g.owner, g.err)
		}
		if other, dup := seen[g.lease.Address]; dup {
			t.Fatalf("%s handed to %s and %s", g.lease.Address, other, g.owner)
		}
		seen[g.lease.Address] = g.owner
	}
	if len(asked) < 1 || len(asked) > 2 {
		t.Fatalf("100 ADDs on an empty pool made %d provider calls asking for %v, want 1 or 2", len(asked), asked)
	}
	total := 0
	for _, n := range asked {
		total += n
	}
	if total != 100+pol.WarmTarget {
		t.Fatalf("the calls asked for %v addresses, want the 100 ADDs plus the warm target %d in all", asked, pol.WarmTarget)
	}
	if s := m.Status(time.Now()); s.Allocated != 100 || s.Free != pol.WarmTarget || s.Waiting != 0 {
		t.Fatalf("after the burst: %d allocated, %d free, %d waiting; want 100, >= %d, 0", s.Allocated, s.Free, s.Waiting, pol.WarmTarget)
	}
}

// ADDs in line are served first come first served: a call's answer goes
// to the first ADDs in line, in order, and those it cannot serve wait for
// the next call. (BatchSize 3 makes each call serve three.)
func TestWaitingADDsAreServedInOrder(t *testing.T) {
	c := &slowCloud{cloud: newCloud(t, "10.1.31.0/24"), gate: make(chan struct{})}
	pol := policy()
	pol.WarmTarget, pol.BatchSize, pol.AddWait, pol.Tick = 0, 3, 5*time.Second, time.Hour
	m := startManager(t, c, pol)
	eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
	ctx := context.Background()
	results := make(chan taken, 8)
	start := func(o string, waiting int) {
		go func() { l, err := m.Take(ctx, o); results <- taken{o, l, err} }()
		eventually(t, o+" in line", func() bool { return m.Status(time.Now()).Waiting == waiting })
	}
	// w0 makes the first call (held at the gate), asking for itself; the
	// others queue behind it in a known order.
	start("w0", 1)
	for i := 1; i <= 6; i++ {
		start(fmt.Sprintf("w%d", i), i+1)
	}
	c.mu.Lock()
	close(c.gate)
	c.gate = nil
	c.mu.Unlock()
	got := map[string]netip.Addr{}
	for range 7 {
		r := <-results
		if r.err != nil {
			t.Fatalf("Take(%s): %v", r.owner, r.err)
		}
		got[r.owner] = r.lease.Address
	}
	asked, answers := c.calls()
	if !slices.Equal(asked, []int{1, 3, 3}) {
		t.Fatalf("calls asked for %v, want [1 3 3]: one for w0, then batches of 3 for the line", asked)
	}
	for i := range 7 {
		call, pos := (i+2)/3, (i+2)%3
		if i == 0 {
			call, pos = 0, 0
		}
		o := fmt.Sprintf("w%d", i)
		if want := answers[call][pos]; got[o] != want {
			t.Errorf("%s got %s, want %s (call %d's answer %v, place %d): not first come first served", o, got[o], want, call+1, answers[call], pos)
		}
	}
}

// An ADD whose runtime gives up while it waits loses nothing: whether it
// left the line before the answer or was handed an address first, the
// address ends up free (or with the next ADD), never held by nobody.
func TestCancelledWaiterReturnsItsLease(t *testing.T) {
	for i := range 20 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c := &slowCloud{cloud: newCloud(t, fmt.Sprintf("10.1.%d.0/24", 40+i)), gate: make(chan struct{})}
			pol := policy()
			pol.WarmTarget, pol.BatchSize, pol.AddWait, pol.Tick, pol.MaxFree = 0, 0, 5*time.Second, time.Hour, 10
			m := startManager(t, c, pol)
			eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
			results := make(chan taken, 3)
			take := func(ctx context.Context, o string, waiting int) {
				go func() { l, err := m.Take(ctx, o); results <- taken{o, l, err} }()
				eventually(t, o+" in line", func() bool { return m.Status(time.Now()).Waiting == waiting })
			}
			take(context.Background(), "a", 1) // makes the first call, held at the gate, for one
			cctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			take(cctx, "b", 2)
			take(context.Background(), "c", 3)
			// The second call (for b and c) gives up b's runtime while it
			// answers: b is handed its address, or leaves the line first.
			c.mu.Lock()
			c.during = cancel
			close(c.gate)
			c.gate = nil
			c.mu.Unlock()
			byOwner := map[string]taken{}
			for range 3 {
				r := <-results
				byOwner[r.owner] = r
			}
			if byOwner["a"].err != nil || byOwner["c"].err != nil {
				t.Fatalf("a: %v, c: %v", byOwner["a"].err, byOwner["c"].err)
			}
			var s *addresses.Shortage
			if !errors.As(byOwner["b"].err, &s) {
				t.Fatalf("b, given up, = %+v, want a shortage", byOwner["b"])
			}
			held, _ := c.cloud.Provider.Held(context.Background())
			st := m.Status(time.Now())
			if st.Allocated != 2 || st.Free != 1 || len(held) != 3 || m.Owns("b", byOwner["b"].lease.Address) {
				t.Fatalf("provider holds %d, pool %d allocated %d free: b's address lost or kept", len(held), st.Allocated, st.Free)
			}
			// What b would have had goes to the next ADD without a call.
			before, _ := c.calls()
			if _, err := m.Take(context.Background(), "d"); err != nil {
				t.Fatalf("Take with one free: %v", err)
			}
			if after, _ := c.calls(); len(after) != len(before) {
				t.Fatal("a Take with one free called the provider")
			}
		})
	}
}

// Capacity bounds the calls of a burst: the node never holds more than
// it may, the ADDs it can serve are served, the rest hear at once that
// the node is full.
func TestBurstWithinCapacity(t *testing.T) {
	c := &slowCloud{cloud: newCloud(t, "10.1.32.0/28"), delay: 10 * time.Millisecond} // .2-.14: 13 usable
	pol := policy()
	pol.WarmTarget, pol.BatchSize, pol.MaxFree, pol.AddWait, pol.Tick = 8, 0, 24, 2*time.Second, time.Hour
	m := startManager(t, c, pol)
	eventually(t, "the provider connected", func() bool { return m.Provider().Capacity == 13 })
	start := time.Now()
	got := takeAll(context.Background(), m, owners("q", 30))
	served := 0
	for _, g := range got {
		var s *addresses.Shortage
		switch {
		case g.err == nil:
			served++
		case !errors.As(g.err, &s) || !strings.Contains(s.Msg, "no free address on node n"):
			t.Fatalf("Take(%s) = %v, want served or the node full", g.owner, g.err)
		}
	}
	if served != 13 {
		t.Fatalf("%d of 30 ADDs served on a node of capacity 13", served)
	}
	if d := time.Since(start); d > pol.AddWait {
		t.Fatalf("the burst took %s: the ADDs the node cannot serve waited out addWait", d)
	}
	held, _ := c.cloud.Provider.Held(context.Background())
	asked, _ := c.calls()
	if len(held) != 13 || len(asked) > 2 {
		t.Fatalf("the provider holds %d (capacity 13) after calls asking for %v", len(held), asked)
	}
}

// A failing provider: the ADDs in line retry together, backing off (not
// one call each), and at addWait each hears why; a provider that answers
// again within addWait serves them all.
func TestFailingCallsWakeTheLine(t *testing.T) {
	c := &slowCloud{cloud: newCloud(t, "10.1.33.0/24")}
	pol := policy()
	pol.WarmTarget, pol.BatchSize, pol.AddWait, pol.Tick = 0, 0, time.Second, time.Hour
	m := startManager(t, c, pol)
	eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
	c.down.Store(true)
	start := time.Now()
	got := takeAll(context.Background(), m, owners("f", 10))
	if d := time.Since(start); d < pol.AddWait/2 || d > 3*pol.AddWait {
		t.Errorf("the line gave up after %s, addWait is %s", d, pol.AddWait)
	}
	for _, g := range got {
		var s *addresses.Shortage
		if !errors.As(g.err, &s) || !strings.Contains(s.Msg, "could not be reached") || !strings.Contains(s.Details, "cloud down") {
			t.Fatalf("Take(%s) with the cloud down = %v, want a shortage naming the cause", g.owner, g.err)
		}
	}
	// At 0, 100, 300 and 700 ms, then the deadline: a handful of calls,
	// not ten ADDs each retrying on its own.
	if n := c.assigns.Load(); n < 3 || n > 5 {
		t.Fatalf("10 waiting ADDs made %d calls to a failing provider in %s, want 2..5", n, pol.AddWait)
	}
	if s := m.Status(time.Now()); s.Waiting != 0 || s.Allocated != 0 {
		t.Fatalf("after the line gave up: %d waiting, %d allocated", s.Waiting, s.Allocated)
	}
	// The provider comes back while the line waits: everyone is served.
	time.AfterFunc(150*time.Millisecond, func() { c.down.Store(false) })
	for _, g := range takeAll(context.Background(), m, owners("g", 10)) {
		if g.err != nil {
			t.Fatalf("Take(%s) once the cloud answers within addWait: %v", g.owner, g.err)
		}
	}
}

// The warm target follows the node's churn: the larger of the last ten
// seconds' ADDs and ten seconds' worth of the last minute's, never below
// warmTarget nor above maxFree.
func TestWarmTargetFollowsChurn(t *testing.T) {
	c := &slowCloud{cloud: newCloud(t, "10.1.34.0/24")}
	pol := policy()
	pol.WarmTarget, pol.BatchSize, pol.MaxFree, pol.Tick = 2, 0, 40, 10*time.Millisecond
	m := startManager(t, c, pol)
	eventually(t, "the warm pool", func() bool { return m.Status(time.Now()).Free == 2 })
	burst := time.Now()
	for i := range 30 {
		if _, err := m.Take(context.Background(), fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A burst of 30: the last ten seconds say 30, where the minute's rate
	// says 5.
	eventually(t, "the warm target raised to the burst", func() bool { s := m.Status(time.Now()); return s.WarmTarget == 30 && s.Free == 30 })
	// Past ten seconds the minute's rate carries it: 30 in a minute, 5 in
	// ten seconds; past the minute, warmTarget again.
	if got := m.Status(burst.Add(15 * time.Second)).WarmTarget; got != 5 {
		t.Fatalf("warm target 15 s after 30 ADDs: %d, want 5 (ten seconds at the minute's rate)", got)
	}
	if got := m.Status(burst.Add(61 * time.Second)).WarmTarget; got != 2 {
		t.Fatalf("warm target a minute after the last ADD: %d, want warmTarget 2", got)
	}
	pol.MaxFree = 10
	m2 := startManager(t, &slowCloud{cloud: newCloud(t, "10.1.37.0/24")}, pol)
	for i := range 90 {
		if _, err := m2.Take(context.Background(), fmt.Sprint("b", i)); err != nil {
			t.Fatal(err)
		}
	}
	// 90 at once, held to maxFree.
	eventually(t, "the warm target at maxFree", func() bool { s := m2.Status(time.Now()); return s.WarmTarget == 10 && s.Free == 10 })
	// warmTarget 0 keeps nothing ready, whatever the churn.
	pol.WarmTarget = 0
	m0 := startManager(t, &slowCloud{cloud: newCloud(t, "10.1.35.0/24")}, pol)
	for i := range 30 {
		if _, err := m0.Take(context.Background(), fmt.Sprint("z", i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * pol.Tick)
	if s := m0.Status(time.Now()); s.WarmTarget != 0 || s.Free != 0 {
		t.Fatalf("warmTarget 0 after 30 ADDs: target %d, %d free", s.WarmTarget, s.Free)
	}
}
