package addresses_test

// The pool policy against the real static provider (its state in a temp
// dir), wrapped where a test needs a cloud that fails: no root, no
// servers, a few seconds in all.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// memStore is the cooling list as the agent's store keeps it.
type memStore struct {
	mu      sync.Mutex
	cooling map[netip.Addr]bool
}

func (s *memStore) Uncool(addrs []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		delete(s.cooling, a)
	}
	return nil
}

func (s *memStore) Left([]netip.Addr) error { return nil }
func (s *memStore) Claim(netip.Addr) error  { return nil }

func (s *memStore) cool(a netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cooling[a] = true
}

func (s *memStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.cooling)
}

// cloud is the static provider behind a switch that makes it fail like an
// unreachable cloud, counting calls.
type cloud struct {
	provider.Provider
	down atomic.Bool
	// noRelease fails only Release (a cloud that refuses the update).
	noRelease atomic.Bool
	assigns   atomic.Int64
	release   atomic.Int64
}

var errDown = errors.New("cloud down: " + provider.ErrUnavailable.Error())

func (c *cloud) Assign(ctx context.Context, r provider.AssignRequest) ([]alloc.Lease, error) {
	c.assigns.Add(1)
	if c.down.Load() {
		return nil, errDown
	}
	return c.Provider.Assign(ctx, r)
}

func (c *cloud) Release(ctx context.Context, a []netip.Addr) error {
	c.release.Add(1)
	if c.down.Load() || c.noRelease.Load() {
		return errDown
	}
	return c.Provider.Release(ctx, a)
}

func (c *cloud) Held(ctx context.Context) ([]alloc.Lease, error) {
	if c.down.Load() {
		return nil, errDown
	}
	return c.Provider.Held(ctx)
}

func newCloud(t *testing.T, cidr string) *cloud {
	t.Helper()
	p, err := static.New(&static.Config{Ranges: []static.Range{{CIDR: cidr}}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &cloud{Provider: p}
}

func policy() addresses.Policy {
	return addresses.Policy{WarmTarget: 3, BatchSize: 4, MaxFree: 5, SurplusGrace: 100 * time.Millisecond,
		AddWait: 300 * time.Millisecond, Cooldown: 0, Resync: time.Hour, Tick: 20 * time.Millisecond}
}

func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// run starts a manager's loop until the test ends.
func run(t *testing.T, m *addresses.Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func connectTo(c *cloud) addresses.Connect {
	return func(context.Context) (provider.Provider, error) { return c, nil }
}

// The pool fills to the warm target in batches, and what the provider
// holds is exactly what the pool holds.
func TestWarmTargetAndSurplus(t *testing.T) {
	c := newCloud(t, "10.1.0.0/24")
	m := addresses.New(policy(), "n", connectTo(c), &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	eventually(t, "the warm pool", func() bool { return m.Status(time.Now()).Free == 3 })
	var owners []string
	for i := range 6 {
		owner := string(rune('a' + i))
		l, err := m.Take(context.Background(), owner)
		if err != nil {
			t.Fatal(err)
		}
		if l.Prefix != netip.MustParsePrefix("10.1.0.0/24") || l.Gateway != netip.MustParseAddr("10.1.0.1") {
			t.Fatalf("lease %+v lacks where it lives", l)
		}
		owners = append(owners, owner+"="+l.Address.String())
	}
	eventually(t, "the warm pool refilled", func() bool { return m.Status(time.Now()).Free >= 3 })
	// Release everything: free rises above MaxFree; after the grace the
	// surplus goes back, never below the warm target.
	for _, o := range owners {
		owner, ip, _ := strings.Cut(o, "=")
		if err := m.Release(owner, netip.MustParseAddr(ip), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if s := m.Status(time.Now()); s.Free <= 5 {
		t.Fatalf("free %d after releasing 6: the test needs a surplus", s.Free)
	}
	eventually(t, "the surplus given back", func() bool { return m.Status(time.Now()).Free == 5 })
	held, _ := c.Held(context.Background())
	if s := m.Status(time.Now()); len(held) != s.Free+s.Allocated+s.Cooling {
		t.Fatalf("provider holds %d, pool %d free %d allocated %d cooling", len(held), s.Free, s.Allocated, s.Cooling)
	}
}

// Degraded: the cloud fails after the pool filled. ADDs are served from
// the pool, STATUS says degraded, and nothing is given back meanwhile even
// far above MaxFree. When the cloud answers again the state clears.
func TestDegradedServesFromThePoolAndReleasesNothing(t *testing.T) {
	c := newCloud(t, "10.2.0.0/24")
	p := policy()
	p.WarmTarget, p.MaxFree, p.BatchSize = 8, 8, 8
	m := addresses.New(p, "n", connectTo(c), &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	eventually(t, "the warm pool", func() bool { return m.Status(time.Now()).Free == 8 })
	c.down.Store(true)
	var taken []alloc.Lease
	for i := range 3 {
		l, err := m.Take(context.Background(), string(rune('a'+i)))
		if err != nil {
			t.Fatalf("Take while the cloud is down (pool not empty): %v", err)
		}
		taken = append(taken, l)
	}
	eventually(t, "degraded", func() bool { s := m.Status(time.Now()); return s.Degraded && s.Ready })
	if r := m.Status(time.Now()).Reason; !strings.Contains(r, "degraded") || !strings.Contains(r, "cloud down") {
		t.Fatalf("reason %q does not say degraded and why", r)
	}
	// Far above MaxFree while degraded: nothing goes back.
	p2 := m.Status(time.Now())
	for i, l := range taken {
		_ = m.Release(string(rune('a'+i)), l.Address, time.Now())
	}
	releases := c.release.Load()
	time.Sleep(300 * time.Millisecond) // three grace periods, fifteen ticks
	if c.release.Load() != releases || m.Status(time.Now()).Free != p2.Free+3 {
		t.Fatalf("released %d times while degraded (free %d)", c.release.Load()-releases, m.Status(time.Now()).Free)
	}
	c.down.Store(false)
	eventually(t, "recovery", func() bool { s := m.Status(time.Now()); return !s.Degraded && s.Ready && s.Reason == "" })
	eventually(t, "the surplus given back after recovery", func() bool { return m.Status(time.Now()).Free == 8 })
}

// An empty pool with the cloud down: Take waits AddWait and says why, as
// CNI "try again later". Once the cloud answers, the next Take succeeds.
func TestEmptyPoolAndCloudDown(t *testing.T) {
	c := newCloud(t, "10.3.0.0/24")
	c.down.Store(true)
	p := policy()
	m := addresses.New(p, "node-x", func(context.Context) (provider.Provider, error) {
		if c.down.Load() {
			return nil, errDown
		}
		return c, nil
	}, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	start := time.Now()
	_, err := m.Take(context.Background(), "a")
	var s *addresses.Shortage
	if !errors.As(err, &s) || !strings.Contains(s.Msg, "could not be reached") || !strings.Contains(s.Details, "cloud down") {
		t.Fatalf("Take with no provider = %v, want a shortage naming the cause", err)
	}
	if d := time.Since(start); d < p.AddWait/2 || d > 3*p.AddWait {
		t.Errorf("Take gave up after %s, AddWait is %s", d, p.AddWait)
	}
	if st := m.Status(time.Now()); st.Ready || !strings.Contains(st.Reason, "cloud down") {
		t.Fatalf("STATUS without provider nor addresses: ready=%v %q", st.Ready, st.Reason)
	}
	c.down.Store(false)
	if _, err := m.Take(context.Background(), "a"); err != nil {
		// The loop retries the connection with backoff from 1s.
		eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
		if _, err := m.Take(context.Background(), "a"); err != nil {
			t.Fatalf("Take once the cloud answers: %v", err)
		}
	}
}

// Exhausted: capacity used up. Take says so at once (no waiting for a
// cloud that will not give more) and names the node and the counts.
func TestExhausted(t *testing.T) {
	c := newCloud(t, "10.4.0.0/29") // .2-.6: 5 usable
	p := policy()
	p.WarmTarget, p.BatchSize = 0, 5
	m := addresses.New(p, "node-y", connectTo(c), &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	for i := range 5 {
		if _, err := m.Take(context.Background(), string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	_, err := m.Take(context.Background(), "f")
	var s *addresses.Shortage
	if !errors.As(err, &s) || !strings.Contains(s.Msg, "no free address on node node-y: 5 allocated") {
		t.Fatalf("Take with all 5 allocated = %v", err)
	}
	if time.Since(start) > p.AddWait {
		t.Errorf("an exhausted Take waited %s", time.Since(start))
	}
	if st := m.Status(time.Now()); st.Ready || !strings.Contains(st.Reason, "none obtainable") {
		t.Fatalf("STATUS exhausted: ready=%v %q", st.Ready, st.Reason)
	}
	if info := m.Provider(); info.Capacity != 5 || !strings.Contains(info.CapacityReason, "5 usable") {
		t.Fatalf("provider info %+v", info)
	}
}

// Cooldown: a released address rests; a Take waits for it (within
// AddWait) rather than failing; the store's cooling row is forgotten once
// it is free again; Status never promotes.
func TestCooldown(t *testing.T) {
	c := newCloud(t, "10.5.0.0/30") // one usable address: .2
	p := policy()
	p.WarmTarget, p.BatchSize, p.MaxFree = 0, 1, 1
	p.Cooldown, p.AddWait = 150*time.Millisecond, time.Second
	st := &memStore{cooling: map[netip.Addr]bool{}}
	m := addresses.New(p, "n", connectTo(c), st, logger())
	run(t, m)
	l, err := m.Take(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if until := m.CoolUntil(now); !until.Equal(now.Add(150 * time.Millisecond)) {
		t.Fatalf("CoolUntil = %s", until)
	}
	st.cool(l.Address)
	if err := m.Release("a", l.Address, now); err != nil {
		t.Fatal(err)
	}
	if err := m.Release("a", l.Address, now); err == nil {
		t.Fatal("a second release of the same address was accepted")
	}
	start := time.Now()
	again, err := m.Take(context.Background(), "b")
	if err != nil || again.Address != l.Address {
		t.Fatalf("Take during the cooldown = %+v, %v; want %s after its rest", again, err, l.Address)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("handed out again after %s, before its rest", d)
	}
	eventually(t, "the store's cooling row forgotten", func() bool { return st.count() == 0 })
}

// Restore at start: recorded allocations are allocated at once (never
// handed out), cooling ones rest, expired ones are forgotten, and a second
// record of one address is returned as a conflict.
func TestRestore(t *testing.T) {
	c := newCloud(t, "10.6.0.0/24")
	// The provider holds .2-.5 from the previous run.
	if _, err := c.Assign(context.Background(), provider.AssignRequest{Count: 4}); err != nil {
		t.Fatal(err)
	}
	st := &memStore{cooling: map[netip.Addr]bool{}}
	p := policy()
	p.Cooldown, p.WarmTarget = time.Minute, 0
	m := addresses.New(p, "n", connectTo(c), st, logger())
	ip := func(s string) netip.Addr { return netip.MustParseAddr("10.6.0." + s) }
	recs := []*alloc.Allocation{
		{ContainerID: "a", IfName: "eth0", Lease: alloc.Lease{Address: ip("2")}},
		{ContainerID: "b", IfName: "eth0", Lease: alloc.Lease{Address: ip("2")}},
		{ContainerID: "c", IfName: "eth0", Lease: alloc.Lease{Address: ip("3")}},
	}
	now := time.Now()
	st.cool(ip("4"))
	st.cool(ip("5"))
	conflicts, err := m.Restore(recs, map[netip.Addr]time.Time{ip("4"): now.Add(time.Minute), ip("5"): now.Add(-time.Second)}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(conflicts) != 1 || conflicts[0].ContainerID != "b" {
		t.Fatalf("conflicts = %+v, want b's record", conflicts)
	}
	if st.count() != 1 {
		t.Fatalf("expired cooling rows not forgotten: %d left", st.count())
	}
	if !m.Owns("a/eth0", ip("2")) || !m.Owns("c/eth0", ip("3")) || m.Owns("b/eth0", ip("2")) {
		t.Fatal("restored owners wrong")
	}
	run(t, m)
	var got []netip.Addr
	for i := range 3 {
		l, err := m.Take(context.Background(), string(rune('x'+i)))
		if err != nil {
			break
		}
		got = append(got, l.Address)
	}
	for _, bad := range []netip.Addr{ip("2"), ip("3"), ip("4")} {
		if slices.Contains(got, bad) {
			t.Fatalf("handed out %s (allocated or cooling) after the restore: %v", bad, got)
		}
	}
	if !slices.Contains(got, ip("5")) {
		t.Fatalf("the address whose rest was over (.5) was not handed out first: %v", got)
	}
	if idle := m.Idle(); !slices.Contains(idle, ip("4")) {
		t.Fatalf("Idle %v lacks the cooling .4", idle)
	}
}

// An ADD that comes while the agent is still connecting its provider waits
// for that first attempt, even with addWait 0, rather than failing for
// want of a provider it is about to have.
func TestTakeWaitsForTheFirstConnect(t *testing.T) {
	c := newCloud(t, "10.7.0.0/24")
	p := policy()
	p.AddWait, p.WarmTarget = 0, 0
	m := addresses.New(p, "n", func(context.Context) (provider.Provider, error) {
		time.Sleep(200 * time.Millisecond) // a slow Keystone login
		return c, nil
	}, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	l, err := m.Take(context.Background(), "a")
	if err != nil || !l.Address.IsValid() {
		t.Fatalf("Take during the first connect = %+v, %v; want it to wait for the provider", l, err)
	}
	// Once the first attempt failed, addWait 0 means no waiting at all.
	c2 := newCloud(t, "10.8.0.0/24")
	c2.down.Store(true)
	m2 := addresses.New(p, "n", func(context.Context) (provider.Provider, error) { return nil, errDown }, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m2)
	start := time.Now()
	if _, err := m2.Take(context.Background(), "a"); err == nil {
		t.Fatal("Take with the provider down and addWait 0 succeeded")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("Take with addWait 0 took %s after a failed first connect", d)
	}
}

// While the first connect is under way STATUS says ready (an ADD waits for
// it); an address restored as cooling is not handed out before the pool
// was compared with the provider, and one the provider no longer holds is
// forgotten then.
func TestBeforeTheFirstSync(t *testing.T) {
	c := newCloud(t, "10.9.0.0/24")
	got, err := c.Assign(context.Background(), provider.AssignRequest{Count: 1}) // .2, held
	if err != nil {
		t.Fatal(err)
	}
	held := got[0].Address
	gone := netip.MustParseAddr("10.9.0.77") // cooling in the store, not held any more
	p := policy()
	p.WarmTarget, p.Cooldown = 0, time.Minute
	release := make(chan struct{})
	m := addresses.New(p, "n", func(context.Context) (provider.Provider, error) {
		<-release
		return c, nil
	}, &memStore{cooling: map[netip.Addr]bool{held: true, gone: true}}, logger())
	now := time.Now()
	// Both restored with their rest already over by the time anyone asks.
	if _, err := m.Restore(nil, map[netip.Addr]time.Time{held: now.Add(10 * time.Millisecond), gone: now.Add(10 * time.Millisecond)}, nil, now); err != nil {
		t.Fatal(err)
	}
	run(t, m)
	time.Sleep(20 * time.Millisecond)
	s := m.Status(time.Now())
	if !s.Ready || !strings.Contains(s.Reason, "connecting") {
		t.Fatalf("STATUS while connecting: ready=%v %q, want ready (an ADD waits)", s.Ready, s.Reason)
	}
	if s.Free != 0 {
		t.Fatalf("before the first sync %d restored cooling addresses count as free", s.Free)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if l, err := m.Take(ctx, "a"); err == nil {
		t.Fatalf("Take before the first sync handed out %s", l.Address)
	}
	close(release)
	l, err := m.Take(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	if l.Address == gone {
		t.Fatalf("handed out %s, which the provider no longer holds", gone)
	}
	if slices.Contains(m.Idle(), gone) {
		t.Fatalf("%s is still in the pool after the sync", gone)
	}
}

// A requested address is the pod's: GiveBack releases it to the provider
// at once; when the cloud refuses it stays out of the pool (a resync does
// not adopt it as free) and goes back once the cloud answers again.
func TestGiveBackRetries(t *testing.T) {
	c := newCloud(t, "10.1.9.0/24")
	pol := policy()
	pol.Resync = 30 * time.Millisecond
	m := addresses.New(pol, "n", connectTo(c), &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	ctx := context.Background()
	ip := netip.MustParseAddr("10.1.9.77")
	if l, err := m.TakeAddress(ctx, "pod", ip); err != nil || l.Address != ip {
		t.Fatalf("TakeAddress(%s) = %+v, %v", ip, l, err)
	}
	providerHolds := func() bool {
		held, err := c.Provider.Held(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(held, func(l alloc.Lease) bool { return l.Address == ip })
	}
	poolHolds := func() bool {
		for state, list := range m.Status(time.Now()).Addresses {
			if state != "leaving" && slices.Contains(list, ip) {
				return true
			}
		}
		return false
	}
	// The cloud answers but refuses the release: resyncs go on meanwhile
	// and must not adopt the address as free (another pod could take it
	// while it is leaving).
	c.noRelease.Store(true)
	if err := m.GiveBack(ctx, "other", ip); err == nil {
		t.Fatal("GiveBack by a record that does not own the address succeeded")
	}
	if err := m.GiveBack(ctx, "pod", ip); err == nil {
		t.Fatal("GiveBack with the release refused succeeded")
	}
	for end := time.Now().Add(5 * pol.Resync); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if poolHolds() {
			t.Fatalf("the pool adopted %s, which belongs to a pod that left", ip)
		}
	}
	if !providerHolds() {
		t.Fatal("the provider let go of the address while it refused releases")
	}
	if st := m.Status(time.Now()); !slices.Contains(st.Addresses["leaving"], ip) || st.Leaving != 1 {
		t.Fatalf("STATUS does not show %s leaving: %+v", ip, st.Addresses)
	}
	c.noRelease.Store(false)
	eventually(t, "the address given back once the cloud lets it go", func() bool { return !providerHolds() })
	if poolHolds() {
		t.Errorf("the pool holds %s after it went back", ip)
	}
}
