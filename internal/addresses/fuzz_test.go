package addresses

// FuzzManagerOps drives the manager with sequences of operations — the
// agent's (Take, Untake, Unwired, Wired, Release, TakeAddress, GiveBack, a
// restart from what the store kept), Run's rounds and syncs, another node
// taking addresses, and a cloud failing whole or in part — and checks the
// node's invariant after every step: no address on two live pods (here or
// on another node), every live pod's address held by the cloud for this
// node and given to it by the pool, nothing leaving that the pool holds,
// and after a sync: the cloud holds exactly the pool ∪ leaving.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// fuzzCloud is a subnet shared by this node and others, in memory: who
// holds each address, and the faults the fuzzer switches on.
type fuzzCloud struct {
	universe []netip.Addr
	holder   map[netip.Addr]string // "" free, "n" this node, else another node
	// The faults.
	down        bool                // every call fails, nothing happens
	refuse      map[netip.Addr]bool // Release keeps these and fails after letting the rest go
	lostRelease bool                // Release lands, its answer is lost
	lostAssign  bool                // Assign lands, its answer is lost
	full        bool                // Assign by count finds nothing
}

var errFuzzDown = errors.New("cloud down: " + provider.ErrUnavailable.Error())

func newFuzzCloud() *fuzzCloud {
	c := &fuzzCloud{holder: map[netip.Addr]string{}, refuse: map[netip.Addr]bool{}}
	for i := 1; i <= 12; i++ {
		c.universe = append(c.universe, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	return c
}

func (c *fuzzCloud) lease(a netip.Addr) alloc.Lease {
	return alloc.Lease{Address: a, Prefix: netip.MustParsePrefix("10.0.0.0/24")}
}

func (c *fuzzCloud) Assign(_ context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	if c.down {
		return nil, errFuzzDown
	}
	var got []alloc.Lease
	var errs []error
	for _, a := range req.Addresses {
		switch h := c.holder[a]; {
		case !slices.Contains(c.universe, a):
			errs = append(errs, fmt.Errorf("%s: %w", a, provider.ErrOutside))
		case h == "" || h == "n":
			c.holder[a] = "n"
			got = append(got, c.lease(a))
		default:
			errs = append(errs, fmt.Errorf("%s held by %s: %w", a, h, provider.ErrTaken))
		}
	}
	want := req.Count
	for _, a := range c.universe {
		if want <= 0 || c.full {
			break
		}
		if c.holder[a] == "" {
			c.holder[a] = "n"
			got = append(got, c.lease(a))
			want--
		}
	}
	if want > 0 {
		errs = append(errs, fmt.Errorf("subnet full: %w", provider.ErrExhausted))
	}
	if c.lostAssign && len(got) > 0 {
		return nil, errors.New("connection reset after the update")
	}
	return got, errors.Join(errs...)
}

func (c *fuzzCloud) Release(_ context.Context, addrs []netip.Addr) error {
	if c.down {
		return errFuzzDown
	}
	var kept []netip.Addr
	for _, a := range addrs {
		switch {
		case c.refuse[a]:
			kept = append(kept, a)
		case c.holder[a] == "n":
			c.holder[a] = ""
		}
	}
	switch {
	case len(kept) > 0:
		return fmt.Errorf("%v: a floating IP points at them", kept)
	case c.lostRelease:
		return errors.New("read-back after the update failed")
	}
	return nil
}

func (c *fuzzCloud) Held(context.Context) ([]alloc.Lease, error) {
	if c.down {
		return nil, errFuzzDown
	}
	var out []alloc.Lease
	for _, a := range c.universe {
		if c.holder[a] == "n" {
			out = append(out, c.lease(a))
		}
	}
	return out, nil
}

func (c *fuzzCloud) Info() provider.Info {
	return provider.Info{Name: "fuzz", Capacity: len(c.universe)}
}

// fuzzStore is the agent's store as the manager sees it, plus the records
// the agent keeps beside it.
type fuzzStore struct {
	records map[string]*alloc.Allocation // by owner
	leaving map[netip.Addr]bool
}

func (s *fuzzStore) Uncool([]netip.Addr) error { return nil } // no cooldown here
func (s *fuzzStore) Claim(a netip.Addr) error {
	s.leaving[a] = true
	return nil
}
func (s *fuzzStore) Left(addrs []netip.Addr) error {
	for _, a := range addrs {
		delete(s.leaving, a)
	}
	return nil
}

// put records an allocation, as store.Put does (it is no longer leaving).
// owner is the allocation's key.
func (s *fuzzStore) put(owner string, l alloc.Lease, requested bool) {
	id, ifName, _ := strings.Cut(owner, "/")
	s.records[owner] = &alloc.Allocation{ContainerID: id, IfName: ifName, Lease: l, Requested: requested}
	delete(s.leaving, l.Address)
}

type fuzzRun struct {
	t     *testing.T
	ctx   context.Context
	cloud *fuzzCloud
	store *fuzzStore
	m     *Manager
	n     int // owners made
	log   []string
}

func (r *fuzzRun) start() {
	pol := Policy{WarmTarget: 2, BatchSize: 3, MaxFree: 4, AddWait: time.Millisecond, Resync: time.Hour, Tick: time.Hour}
	r.m = New(pol, "n", func(context.Context) (provider.Provider, error) { return r.cloud, nil }, r.store,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	var allocs []*alloc.Allocation
	for _, rec := range r.store.records {
		allocs = append(allocs, rec)
	}
	conflicts, err := r.m.Restore(allocs, nil, slices.Collect(maps.Keys(r.store.leaving)), time.Now())
	if err != nil || len(conflicts) > 0 {
		r.fail("restore: %v, conflicts %v", err, conflicts)
	}
	_ = r.m.tryConnect(r.ctx)
	r.m.triedOnce.Do(func() { close(r.m.tried) })
}

func (r *fuzzRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\nafter: %v", fmt.Sprintf(format, args...), r.log)
}

// owner picks a live pod by b, requested ones or any.
func (r *fuzzRun) owner(b byte, requested bool) (string, *alloc.Allocation) {
	var owners []string
	for o, rec := range r.store.records {
		if !requested || rec.Requested {
			owners = append(owners, o)
		}
	}
	if len(owners) == 0 {
		return "", nil
	}
	slices.Sort(owners)
	o := owners[int(b)%len(owners)]
	return o, r.store.records[o]
}

func (r *fuzzRun) step(op, arg byte) {
	m, c, s := r.m, r.cloud, r.store
	switch op % 13 {
	case 0: // an ADD
		r.n++
		o := alloc.Key(fmt.Sprintf("pod-%d", r.n), "eth0")
		if l, err := m.Take(r.ctx, o); err == nil {
			s.put(o, l, false)
		}
		r.log = append(r.log, "take "+o)
	case 1: // an ADD asking for an address by name
		r.n++
		o := alloc.Key(fmt.Sprintf("sticky-%d", r.n), "eth0")
		a := c.universe[int(arg)%len(c.universe)]
		if l, err := m.TakeAddress(r.ctx, o, a); err == nil {
			s.put(o, l, true)
		}
		r.log = append(r.log, fmt.Sprintf("take %s for %s", a, o))
	case 2, 3: // an ADD that fails after the allocation: the record goes
		o, rec := r.owner(arg, false)
		if rec == nil {
			return
		}
		delete(s.records, o)
		switch {
		case rec.Requested:
			s.leaving[rec.Address] = true
			_ = m.GiveBack(r.ctx, o, rec.Address)
		case op%13 == 2:
			m.Untake(rec.Address)
		default:
			m.Unwired(rec.Address, errors.New("no NIC"))
		}
		r.log = append(r.log, fmt.Sprintf("failed ADD %s (%s)", o, rec.Address))
	case 4, 5: // a DEL
		o, rec := r.owner(arg, op%13 == 5)
		if rec == nil {
			return
		}
		delete(s.records, o)
		if rec.Requested {
			s.leaving[rec.Address] = true
			_ = m.GiveBack(r.ctx, o, rec.Address)
		} else if err := m.Release(o, rec.Address, time.Now()); err != nil {
			r.fail("Release(%s, %s): %v", o, rec.Address, err)
		}
		r.log = append(r.log, fmt.Sprintf("del %s (%s)", o, rec.Address))
	case 6:
		if o, rec := r.owner(arg, false); rec != nil {
			m.Wired(rec.Address)
			r.log = append(r.log, "wired "+o)
		}
	case 7: // the agent restarts
		r.start()
		r.log = append(r.log, "restart")
	case 8: // one of Run's rounds
		if m.provider() == nil {
			_ = m.tryConnect(r.ctx)
		}
		m.maintain(r.ctx)
		r.log = append(r.log, "round")
	case 9: // a resync
		m.resync(r.ctx)
		r.log = append(r.log, "sync")
		if !c.down && m.provider() != nil {
			r.checkSynced()
		}
	case 10: // another node takes a free address
		for _, a := range c.universe {
			if c.holder[a] == "" {
				c.holder[a] = "other"
				r.log = append(r.log, fmt.Sprintf("other takes %s", a))
				break
			}
		}
	case 11: // another node lets its addresses go
		for a, h := range c.holder {
			if h == "other" {
				c.holder[a] = ""
			}
		}
		r.log = append(r.log, "other releases")
	case 12: // the cloud's faults change
		a := c.universe[int(arg>>3)%len(c.universe)]
		switch arg % 6 {
		case 0:
			c.down = !c.down
		case 1:
			c.refuse[a] = !c.refuse[a]
		case 2:
			c.lostRelease = !c.lostRelease
		case 3:
			c.lostAssign = !c.lostAssign
		case 4:
			c.full = !c.full
		default:
			c.down, c.lostRelease, c.lostAssign, c.full = false, false, false, false
			clear(c.refuse)
		}
		r.log = append(r.log, fmt.Sprintf("faults down=%v refuse=%v lostRelease=%v lostAssign=%v full=%v", c.down, c.refuse, c.lostRelease, c.lostAssign, c.full))
	}
}

// check holds after every step.
func (r *fuzzRun) check() {
	m, c := r.m, r.cloud
	byAddr := map[netip.Addr]string{}
	for o, rec := range r.store.records {
		if other, dup := byAddr[rec.Address]; dup {
			r.fail("%s is on %s and %s", rec.Address, other, o)
		}
		byAddr[rec.Address] = o
		if h := c.holder[rec.Address]; h != "n" {
			r.fail("%s runs on %s, but the cloud gives it to %q: two pods, one IP", o, rec.Address, h)
		}
		if !m.Owns(o, rec.Address) {
			r.fail("%s runs on %s, but the pool does not give it to it", o, rec.Address)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for a := range m.giveBack {
		if st := m.pool.State(a); st != ipam.Unknown {
			r.fail("%s is leaving and %s in the pool at once", a, st)
		}
	}
	for _, a := range m.pool.Held() {
		if c.holder[a] != "n" {
			r.fail("the pool holds %s (%s), the cloud gives it to %q", a, m.pool.State(a), c.holder[a])
		}
		if st := m.pool.State(a); st == ipam.Allocated {
			if o := m.pool.Owner(a); r.store.records[o] == nil {
				r.fail("the pool gives %s to %s, which has no record", a, o)
			}
		}
	}
}

// checkSynced: right after a sync the cloud holds exactly what the pool
// holds and what is leaving.
func (r *fuzzRun) checkSynced() {
	m, c := r.m, r.cloud
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range c.universe {
		inPool, leaving := m.pool.State(a) != ipam.Unknown, m.giveBack[a]
		if (c.holder[a] == "n") != (inPool || leaving) {
			r.fail("after a sync: the cloud gives %s to %q; the pool has it: %v, leaving: %v", a, c.holder[a], inPool, leaving)
		}
	}
}

func FuzzManagerOps(f *testing.F) {
	// Seeds: the partial give-back that released a running pod's address
	// (two requested pods leave while the cloud refuses one of them, a
	// refill takes the other back, a round retries the give-back), a
	// restart while an address is leaving, an address that cannot be
	// wired.
	f.Add([]byte{1, 4, 1, 5, 12, 1<<3*4 + 1, 5, 0, 5, 0, 0, 0, 0, 0, 0, 0, 8, 0, 8, 0})
	f.Add([]byte{1, 7, 12, 0, 5, 0, 7, 0, 12, 0, 8, 0, 9, 0, 0, 0})
	f.Add([]byte{0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 0, 0, 8, 0, 9, 0})
	f.Add([]byte{12, 2, 1, 3, 5, 0, 10, 0, 0, 0, 8, 0, 9, 0, 12, 3, 0, 0, 9, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := &fuzzRun{t: t, ctx: ctx, cloud: newFuzzCloud(), store: &fuzzStore{records: map[string]*alloc.Allocation{}, leaving: map[netip.Addr]bool{}}}
		r.start()
		for i := 0; i+1 < len(ops); i += 2 {
			r.step(ops[i], ops[i+1])
			r.check()
		}
	})
}
