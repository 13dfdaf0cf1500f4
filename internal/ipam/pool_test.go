package ipam_test

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vpcni/vpcni/internal/ipam"
)

// poolModel is the reference the Pool is checked against after every step.
//
// The free list is a queue of groups: between groups the order is FIFO and
// exact; inside a group it is unspecified. A group has more than one member
// only when several cooldowns end at the very same instant, which Promote
// may free in any order.
type poolModel struct {
	pool     *ipam.Pool
	cooldown time.Duration
	now      time.Time
	universe []netip.Addr

	state  map[netip.Addr]ipam.State
	owner  map[netip.Addr]string
	until  map[netip.Addr]time.Time
	aside  map[netip.Addr]time.Time
	free   [][]netip.Addr
	owners int
}

func newPoolModel(cooldown time.Duration) *poolModel {
	m := &poolModel{
		pool:     ipam.NewPool(cooldown),
		cooldown: cooldown,
		now:      time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		state:    map[netip.Addr]ipam.State{},
		owner:    map[netip.Addr]string{},
		until:    map[netip.Addr]time.Time{},
		aside:    map[netip.Addr]time.Time{},
	}
	// A small universe so that actions keep hitting the same addresses.
	for i := 1; i <= 10; i++ {
		m.universe = append(m.universe, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	return m
}

func (m *poolModel) addr(t *rapid.T, label string) netip.Addr {
	return rapid.SampledFrom(m.universe).Draw(t, label)
}

func (m *poolModel) freeCount() int {
	n := 0
	for _, g := range m.free {
		n += len(g)
	}
	return n
}

func (m *poolModel) dropFree(a netip.Addr) {
	for i, g := range m.free {
		if j := slices.Index(g, a); j >= 0 {
			g = slices.Delete(slices.Clone(g), j, j+1)
			if len(g) == 0 {
				m.free = slices.Delete(m.free, i, i+1)
			} else {
				m.free[i] = g
			}
			return
		}
	}
}

// promote moves every address whose cooldown is over to the tail of the
// free list, earliest end first, and returns them.
func (m *poolModel) promote() map[netip.Addr]bool {
	byEnd := map[time.Time][]netip.Addr{}
	done := map[netip.Addr]bool{}
	for a, u := range m.until {
		if !m.now.Before(u) {
			byEnd[u] = append(byEnd[u], a)
			done[a] = true
		}
	}
	ends := slices.SortedFunc(maps.Keys(byEnd), time.Time.Compare)
	for _, u := range ends {
		for _, a := range byEnd[u] {
			delete(m.until, a)
			m.state[a] = ipam.Free
		}
		m.free = append(m.free, byEnd[u])
	}
	return done
}

func (m *poolModel) AddFree(t *rapid.T) {
	addrs := rapid.SliceOfN(rapid.SampledFrom(m.universe), 1, 3).Draw(t, "addrs")
	err := m.pool.AddFree(addrs...)
	valid := true
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		if m.state[a] != ipam.Unknown || seen[a] {
			valid = false
		}
		seen[a] = true
	}
	if !valid {
		if err == nil {
			t.Fatalf("AddFree(%v) accepted an address already in the pool or given twice", addrs)
		}
		return // and nothing changed: Check compares every address
	}
	if err != nil {
		t.Fatalf("AddFree(%v): %v", addrs, err)
	}
	for _, a := range addrs {
		m.state[a] = ipam.Free
		m.free = append(m.free, []netip.Addr{a})
	}
}

func (m *poolModel) Take(t *rapid.T) {
	m.owners++
	owner := fmt.Sprintf("pod-%d", m.owners)
	// What was cooling before the call, to prove Take never hands out an
	// address whose rest is not over.
	coolingBefore := maps.Clone(m.until)
	a, ok := m.pool.Take(owner)
	if len(m.free) == 0 {
		if ok {
			t.Fatalf("Take returned %s with nothing free", a)
		}
		return
	}
	if !ok {
		t.Fatalf("Take found nothing; the model has %d free", m.freeCount())
	}
	switch s := m.state[a]; s {
	case ipam.Allocated:
		t.Fatalf("Take handed out %s, already allocated to %s", a, m.owner[a])
	case ipam.Cooling:
		t.Fatalf("Take handed out %s, cooling until %s (now %s)", a, m.until[a], m.now)
	case ipam.Unknown:
		t.Fatalf("Take handed out %s, which the pool never held", a)
	}
	if u, was := coolingBefore[a]; was && m.now.Before(u) {
		t.Fatalf("Take handed out %s before its cooldown ended (%s < %s)", a, m.now, u)
	}
	if !slices.Contains(m.free[0], a) {
		t.Fatalf("Take returned %s; the longest-rested free address is one of %v (free list %v)", a, m.free[0], m.free)
	}
	m.dropFree(a)
	m.state[a] = ipam.Allocated
	m.owner[a] = owner
}

func (m *poolModel) Release(t *rapid.T) {
	a := m.addr(t, "addr")
	until, err := m.pool.Release(a, m.now)
	if m.state[a] != ipam.Allocated {
		if err == nil {
			t.Fatalf("Release(%s) of a %s address succeeded", a, m.state[a])
		}
		return
	}
	if err != nil {
		t.Fatalf("Release(%s): %v", a, err)
	}
	delete(m.owner, a)
	if m.cooldown <= 0 {
		if !until.IsZero() {
			t.Fatalf("Release with no cooldown returned until=%s, want the zero time", until)
		}
		m.state[a] = ipam.Free
		m.free = append(m.free, []netip.Addr{a})
		return
	}
	if want := m.now.Add(m.cooldown); !until.Equal(want) {
		t.Fatalf("Release(%s) rests until %s, want %s", a, until, want)
	}
	m.state[a] = ipam.Cooling
	m.until[a] = until
}

func (m *poolModel) Unallocate(t *rapid.T) {
	a := m.addr(t, "addr")
	err := m.pool.Unallocate(a)
	if m.state[a] != ipam.Allocated {
		if err == nil {
			t.Fatalf("Unallocate(%s) of a %s address succeeded", a, m.state[a])
		}
		return
	}
	if err != nil {
		t.Fatalf("Unallocate(%s): %v", a, err)
	}
	delete(m.owner, a)
	m.state[a] = ipam.Free
	m.free = slices.Insert(m.free, 0, []netip.Addr{a})
}

func (m *poolModel) Requeue(t *rapid.T) {
	a := m.addr(t, "addr")
	err := m.pool.Requeue(a)
	if m.state[a] != ipam.Allocated {
		if err == nil {
			t.Fatalf("Requeue(%s) of a %s address succeeded", a, m.state[a])
		}
		return
	}
	if err != nil {
		t.Fatalf("Requeue(%s): %v", a, err)
	}
	delete(m.owner, a)
	m.state[a] = ipam.Free
	m.free = append(m.free, []netip.Addr{a})
}

func (m *poolModel) SetAside(t *rapid.T) {
	a := m.addr(t, "addr")
	until := m.now.Add(time.Duration(rapid.IntRange(0, 60).Draw(t, "aside")) * time.Second)
	err := m.pool.SetAside(a, until)
	if m.state[a] != ipam.Allocated {
		if err == nil {
			t.Fatalf("SetAside(%s) of a %s address succeeded", a, m.state[a])
		}
		return
	}
	if err != nil {
		t.Fatalf("SetAside(%s): %v", a, err)
	}
	delete(m.owner, a)
	m.state[a] = ipam.Aside
	m.aside[a] = until
}

func (m *poolModel) Unaside(t *rapid.T) {
	got := m.pool.Unaside(m.now)
	var want []netip.Addr
	for a, u := range m.aside {
		if !m.now.Before(u) {
			want = append(want, a)
		}
	}
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		t.Fatalf("Unaside(%s) = %v, want %v", m.now, got, want)
	}
	for _, a := range want {
		delete(m.aside, a)
		m.state[a] = ipam.Free
		m.free = append(m.free, []netip.Addr{a})
	}
}

func (m *poolModel) Advance(t *rapid.T) {
	// Whole seconds, zero included, so that cooldowns often end at the
	// same instant and exactly at "now".
	m.now = m.now.Add(time.Duration(rapid.IntRange(0, 45).Draw(t, "seconds")) * time.Second)
}

func (m *poolModel) Promote(t *rapid.T) {
	got := m.pool.Promote(m.now)
	ends := make([]time.Time, 0, len(got))
	for _, a := range got {
		ends = append(ends, m.until[a])
	}
	want := m.promote()
	if len(got) != len(want) {
		t.Fatalf("Promote(%s) freed %v, want %v", m.now, got, slices.Collect(maps.Keys(want)))
	}
	for _, a := range got {
		if !want[a] {
			t.Fatalf("Promote(%s) freed %s, which is not due (freed %v)", m.now, a, got)
		}
	}
	if !slices.IsSortedFunc(ends, time.Time.Compare) {
		t.Fatalf("Promote returned %v, not ordered by cooldown end %v", got, ends)
	}
}

func (m *poolModel) Remove(t *rapid.T) {
	a := m.addr(t, "addr")
	err := m.pool.Remove(a)
	switch m.state[a] {
	case ipam.Free:
		m.dropFree(a)
	case ipam.Cooling:
		delete(m.until, a)
	case ipam.Aside:
		delete(m.aside, a)
	default:
		if err == nil {
			t.Fatalf("Remove(%s) of a %s address succeeded", a, m.state[a])
		}
		return
	}
	if err != nil {
		t.Fatalf("Remove(%s) of a %s address: %v", a, m.state[a], err)
	}
	delete(m.state, a)
}

// Check runs after every action.
func (m *poolModel) Check(t *rapid.T) {
	var want ipam.Counts
	var held []netip.Addr
	for _, a := range m.universe {
		s, got := m.state[a], m.pool.State(a)
		if got != s {
			t.Fatalf("State(%s) = %s, model says %s", a, got, s)
		}
		switch s {
		case ipam.Free:
			want.Free++
		case ipam.Cooling:
			want.Cooling++
		case ipam.Allocated:
			want.Allocated++
		case ipam.Aside:
			want.Aside++
		}
		if s != ipam.Unknown {
			held = append(held, a)
		}
		if o := m.pool.Owner(a); o != m.owner[a] {
			t.Fatalf("Owner(%s) = %q, model says %q (state %s)", a, o, m.owner[a], s)
		}
	}
	if n := m.freeCount(); n != want.Free {
		t.Fatalf("model broken: %d addresses in its free list, %d in state free", n, want.Free)
	}
	if got := m.pool.Counts(); got != want {
		t.Fatalf("Counts() = %+v, want %+v", got, want)
	}
	if got := m.pool.Counts().Held(); got != len(held) {
		t.Fatalf("Counts().Held() = %d, want %d", got, len(held))
	}
	if got := m.pool.Held(); !slices.Equal(got, held) {
		t.Fatalf("Held() = %v, want free ∪ cooling ∪ allocated ∪ aside = %v", got, held)
	}
	next, ok := m.pool.NextCooled()
	if len(m.until) == 0 {
		if ok {
			t.Fatalf("NextCooled() = %s with nothing cooling", next)
		}
	} else {
		earliest := slices.MinFunc(slices.Collect(maps.Values(m.until)), time.Time.Compare)
		if !ok || !next.Equal(earliest) {
			t.Fatalf("NextCooled() = %s, %v; want %s", next, ok, earliest)
		}
	}
}

func TestPoolStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cooldown := time.Duration(rapid.SampledFrom([]int{0, 1, 10, 30}).Draw(t, "cooldownSeconds")) * time.Second
		m := newPoolModel(cooldown)
		t.Repeat(rapid.StateMachineActions(m))
	})
}

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
	addrC = netip.MustParseAddr("10.0.0.3")
	t0    = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
)

func TestPoolZeroCooldownFreesAtOnce(t *testing.T) {
	p := ipam.NewPool(0)
	if err := p.AddFree(addrA); err != nil {
		t.Fatal(err)
	}
	a, ok := p.Take("pod-1")
	if !ok || a != addrA {
		t.Fatalf("Take = %s, %v; want %s", a, ok, addrA)
	}
	until, err := p.Release(a, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !until.IsZero() {
		t.Errorf("until = %s, want the zero time", until)
	}
	if s := p.State(addrA); s != ipam.Free {
		t.Errorf("state after release = %s, want free", s)
	}
	if _, ok := p.NextCooled(); ok {
		t.Error("NextCooled reports a cooling address")
	}
	// Same instant: no time has to pass.
	if a, ok := p.Take("pod-2"); !ok || a != addrA {
		t.Fatalf("Take after release = %s, %v; want %s at once", a, ok, addrA)
	}
	if o := p.Owner(addrA); o != "pod-2" {
		t.Errorf("Owner = %q, want pod-2", o)
	}
}

func TestPoolCooldownDelaysReuse(t *testing.T) {
	p := ipam.NewPool(30 * time.Second)
	if err := p.AddFree(addrA); err != nil {
		t.Fatal(err)
	}
	a, _ := p.Take("pod-1")
	until, err := p.Release(a, t0)
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(30 * time.Second); !until.Equal(want) {
		t.Fatalf("until = %s, want %s", until, want)
	}
	if got := p.Promote(until.Add(-time.Nanosecond)); len(got) != 0 || p.Due(until.Add(-time.Nanosecond)) != 0 {
		t.Fatalf("1ns before the cooldown ends, Promote freed %v", got)
	}
	if a, ok := p.Take("pod-2"); ok {
		t.Fatalf("Take 1ns before the cooldown ends returned %s", a)
	}
	if due := p.Due(until); due != 1 {
		t.Fatalf("Due when the cooldown ends = %d, want 1", due)
	}
	if p.Counts().Cooling != 1 {
		t.Fatal("Due changed the pool")
	}
	if got := p.Promote(until); len(got) != 1 || got[0] != addrA {
		t.Fatalf("Promote when the cooldown ends = %v, want [%s]", got, addrA)
	}
	if a, ok := p.Take("pod-2"); !ok || a != addrA {
		t.Fatalf("Take when the cooldown ends = %s, %v; want %s", a, ok, addrA)
	}
}

func TestPoolRemoveAllocatedFails(t *testing.T) {
	p := ipam.NewPool(time.Minute)
	if err := p.AddFree(addrA, addrB); err != nil {
		t.Fatal(err)
	}
	a, _ := p.Take("pod-1")
	if err := p.Remove(a); err == nil {
		t.Fatalf("Remove of allocated %s succeeded", a)
	}
	if s := p.State(a); s != ipam.Allocated {
		t.Errorf("state after failed Remove = %s, want allocated", s)
	}
	if o := p.Owner(a); o != "pod-1" {
		t.Errorf("owner after failed Remove = %q, want pod-1", o)
	}
	if c := p.Counts(); c != (ipam.Counts{Free: 1, Allocated: 1}) {
		t.Errorf("Counts = %+v", c)
	}
	if err := p.Remove(addrC); err == nil {
		t.Error("Remove of an address not in the pool succeeded")
	}
}

func TestPoolUnallocateGoesFirst(t *testing.T) {
	p := ipam.NewPool(time.Minute)
	if err := p.AddFree(addrA, addrB, addrC); err != nil {
		t.Fatal(err)
	}
	a, _ := p.Take("pod-1") // addrA
	if err := p.Unallocate(a); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.Take("pod-2"); got != addrA {
		t.Fatalf("Take after Unallocate = %s, want %s back first (no cooldown)", got, addrA)
	}
}

func TestPoolAddFreeRejectsDuplicates(t *testing.T) {
	p := ipam.NewPool(0)
	if err := p.AddFree(addrA, addrB, addrA); err == nil {
		t.Fatal("AddFree accepted the same address twice in one call")
	}
	if c := p.Counts(); c != (ipam.Counts{}) {
		t.Fatalf("a rejected AddFree changed the pool: %+v", c)
	}
	if err := p.AddFree(addrA); err != nil {
		t.Fatal(err)
	}
	if err := p.AddFree(addrB, addrA); err == nil {
		t.Fatal("AddFree accepted an address already free")
	}
	if s := p.State(addrB); s != ipam.Unknown {
		t.Fatalf("a rejected AddFree added %s (%s)", addrB, s)
	}
}

func TestPoolCooledAddressesQueueInReleaseOrder(t *testing.T) {
	p := ipam.NewPool(10 * time.Second)
	var addrs []netip.Addr
	for i := range 16 {
		addrs = append(addrs, netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}))
	}
	if err := p.AddFree(addrs...); err != nil {
		t.Fatal(err)
	}
	for range addrs {
		if _, ok := p.Take("pod"); !ok {
			t.Fatal("Take found nothing")
		}
	}
	// Released in reverse address order, one second apart.
	var order []netip.Addr
	for i := range addrs {
		a := addrs[len(addrs)-1-i]
		if _, err := p.Release(a, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		order = append(order, a)
	}
	later := t0.Add(time.Hour)
	if got := p.Promote(later); !slices.Equal(got, order) {
		t.Fatalf("Promote = %v, want release order %v", got, order)
	}
	for i, want := range order {
		if got, _ := p.Take("pod"); got != want {
			t.Fatalf("Take #%d = %s, want %s (the longest-rested)", i, got, want)
		}
	}
}
