package addresses_test

// The manager under partial cloud failure: a release that lets some
// addresses go and fails on others, a release that lands but reports a
// failure, an exhausted subnet that gets room again, a caller that gives
// up while the cloud is slow.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// partialCloud is the static provider behind a cloud whose Release can
// refuse some addresses while letting the rest go (a floating IP still
// points at them), or let every address go and still report a failure
// (the write landed, its read-back failed).
type partialCloud struct {
	*cloud
	mu sync.Mutex
	// refuse: Release keeps these and fails, after releasing the others.
	refuse map[netip.Addr]bool
	// lost: Release releases everything and then fails.
	lost bool
	// full: Assign by count finds the subnet full.
	full bool
	// slow: Assign waits for its caller to give up.
	slow bool
}

func (c *partialCloud) Release(ctx context.Context, addrs []netip.Addr) error {
	c.mu.Lock()
	refuse, lost := c.refuse, c.lost
	c.mu.Unlock()
	var kept, gone []netip.Addr
	for _, a := range addrs {
		if refuse[a] {
			kept = append(kept, a)
		} else {
			gone = append(gone, a)
		}
	}
	if err := c.Provider.Release(ctx, gone); err != nil {
		return err
	}
	switch {
	case len(kept) > 0:
		return fmt.Errorf("%v: a floating IP still points at them", kept)
	case lost:
		return errors.New("read the port back after the update: connection reset")
	}
	return nil
}

func (c *partialCloud) Assign(ctx context.Context, r provider.AssignRequest) ([]alloc.Lease, error) {
	c.mu.Lock()
	full, slow := c.full, c.slow
	c.mu.Unlock()
	if slow {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if full && r.Count > 0 && len(r.Addresses) == 0 {
		return nil, fmt.Errorf("subnet full: %w", provider.ErrExhausted)
	}
	return c.Provider.Assign(ctx, r)
}

func (c *partialCloud) set(f func(*partialCloud)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func (c *partialCloud) holds(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	held, err := c.Provider.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(held, func(l alloc.Lease) bool { return l.Address == ip })
}

// A give-back that fails after the cloud let some of the addresses go
// must never take one of them off the node again once the node got it
// back from the cloud and handed it to a running pod: two pods, one IP.
func TestPartialGiveBackNeverReleasesARunningPod(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*partialCloud, netip.Addr)
	}{
		{"some released, one refused", func(c *partialCloud, a netip.Addr) { c.refuse = map[netip.Addr]bool{a: true} }},
		{"released, then the read-back failed", func(c *partialCloud, _ netip.Addr) { c.lost = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &partialCloud{cloud: newCloud(t, "10.1.20.0/29")} // .2-.6
			pol := policy()
			pol.WarmTarget, pol.BatchSize, pol.MaxFree = 0, 1, 5
			m := addresses.New(pol, "n", func(context.Context) (provider.Provider, error) { return c, nil }, &memStore{cooling: map[netip.Addr]bool{}}, logger())
			run(t, m)
			ctx := context.Background()
			a, b := netip.MustParseAddr("10.1.20.5"), netip.MustParseAddr("10.1.20.6")
			for owner, ip := range map[string]netip.Addr{"sticky-a": a, "sticky-b": b} {
				if _, err := m.TakeAddress(ctx, owner, ip); err != nil {
					t.Fatalf("TakeAddress(%s): %v", ip, err)
				}
			}
			c.set(func(c *partialCloud) { tc.fault(c, a) })
			// Both pods leave together: the give-backs fail, the cloud
			// let go of some of it all the same.
			_ = m.GiveBack(ctx, "sticky-a", a)
			_ = m.GiveBack(ctx, "sticky-b", b)
			if c.holds(t, b) {
				t.Fatalf("the cloud still holds %s: the fault did not happen", b)
			}
			// New pods: the node asks the cloud for addresses one at a
			// time, and gets the ones it let go of among them.
			got := map[netip.Addr]string{}
			for i := range 5 {
				owner := fmt.Sprintf("pod-%d", i)
				l, err := m.Take(ctx, owner)
				if err != nil {
					break
				}
				got[l.Address] = owner
			}
			_, gotA := got[a]
			if _, gotB := got[b]; !gotA && !gotB {
				t.Fatalf("no new pod got %s or %s (got %v): the test cannot show the defect", a, b, got)
			}
			// The give-back is retried on every tick: it must not take a
			// running pod's address off the node.
			time.Sleep(20 * pol.Tick)
			for ip, owner := range got {
				if !c.holds(t, ip) {
					t.Errorf("%s runs on %s, but the cloud no longer holds it for the node: another node may be given it", owner, ip)
				}
				if !m.Owns(owner, ip) {
					t.Errorf("the pool no longer gives %s to %s", ip, owner)
				}
			}
			// Once the cloud lets go, the refused address leaves.
			c.set(func(c *partialCloud) { c.refuse, c.lost = nil, false })
			if _, held := got[a]; !held {
				eventually(t, "the refused address given back", func() bool { return !c.holds(t, a) })
			}
		})
	}
}

// With warmTarget 0 the node holds no spare address: one "exhausted"
// answer must not keep STATUS not ready once the subnet has room again
// (the ADD that would find out never comes while STATUS says not ready).
func TestExhaustedClearsWhenTheSubnetHasRoom(t *testing.T) {
	c := &partialCloud{cloud: newCloud(t, "10.1.21.0/24")}
	pol := policy()
	pol.WarmTarget, pol.MaxFree = 0, 1
	m := addresses.New(pol, "n", func(context.Context) (provider.Provider, error) { return c, nil }, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	c.set(func(c *partialCloud) { c.full = true })
	var s *addresses.Shortage
	if _, err := m.Take(context.Background(), "a"); !errors.As(err, &s) {
		t.Fatalf("Take from a full subnet = %v, want a shortage", err)
	}
	if st := m.Status(time.Now()); st.Ready {
		t.Fatalf("STATUS ready with the subnet full and nothing free: %+v", st)
	}
	c.set(func(c *partialCloud) { c.full = false })
	eventually(t, "STATUS ready once the subnet has room", func() bool { return m.Status(time.Now()).Ready })
	if _, err := m.Take(context.Background(), "a"); err != nil {
		t.Fatalf("Take once the subnet has room: %v", err)
	}
}

// A caller that gives up while the cloud is slow says nothing about the
// cloud: the node does not turn degraded (which stops giving surplus
// back and tells STATUS the provider fails).
func TestCallerGivingUpIsNotDegraded(t *testing.T) {
	c := &partialCloud{cloud: newCloud(t, "10.1.22.0/24")}
	pol := policy()
	// No tick meanwhile: a probe would clear the error before STATUS is
	// read, hiding it.
	pol.WarmTarget, pol.Tick = 0, time.Hour
	m := addresses.New(pol, "n", func(context.Context) (provider.Provider, error) { return c, nil }, &memStore{cooling: map[netip.Addr]bool{}}, logger())
	run(t, m)
	eventually(t, "the provider connected", func() bool { return m.Provider().Name == "static" })
	c.set(func(c *partialCloud) { c.slow = true })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := m.Take(ctx, "a"); err == nil {
		t.Fatal("Take with a slow cloud and a caller that gave up succeeded")
	}
	c.set(func(c *partialCloud) { c.slow = false })
	if st := m.Status(time.Now()); st.Degraded {
		t.Fatalf("a caller's own timeout made the node degraded: %q", st.Reason)
	}
}
