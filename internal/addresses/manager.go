// Package addresses is the node's address manager: the warm pool of
// leases a provider holds for the node (free, allocated, cooling down),
// the policy that keeps it topped up and gives surplus back, and what the
// node does while the cloud fails (degraded: serve from the pool, release
// nothing). It knows no CNI and no kernel; the agent records allocations
// and wires them.
package addresses

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// Policy sizes the pool and paces the manager.
type Policy struct {
	// WarmTarget free addresses are kept ready.
	WarmTarget int
	// BatchSize bounds one provider call (0: no bound but the node's
	// capacity).
	BatchSize int
	// MaxFree: free addresses above it go back to the provider after
	// SurplusGrace (±25% jitter), never below MinHeld held.
	MaxFree      int
	MinHeld      int
	SurplusGrace time.Duration
	// AddWait bounds how long Take waits with the pool empty.
	AddWait time.Duration
	// Cooldown is how long a released address rests before reuse.
	Cooldown time.Duration
	// Resync is how often the pool is compared with what the provider
	// holds.
	Resync time.Duration
	// Tick is how often Run looks at the pool without being kicked
	// (default 5s).
	Tick time.Duration
}

// Connect builds the provider; the cloud may not answer yet.
type Connect func(ctx context.Context) (provider.Provider, error)

// Store persists the addresses at rest and those leaving. The agent writes
// both with the release of a pod's record, in the same transaction (a
// cooling address with the release, a leaving one — a requested address
// going back to the cloud — in place of it); the manager forgets them.
type Store interface {
	// Uncool forgets cooling addresses whose rest is over.
	Uncool(addrs []netip.Addr) error
	// Left forgets leaving addresses: the cloud has them back, or the node
	// got them again from it.
	Left(addrs []netip.Addr) error
	// Claim marks a requested address leaving before the provider is asked
	// for it, until the pod's record (or Left) clears the mark.
	Claim(addr netip.Addr) error
}

// Manager is one node's address manager. Its methods are safe for
// concurrent use.
type Manager struct {
	policy  Policy
	node    string
	connect Connect
	store   Store
	log     *slog.Logger
	// Synced, if set, is called after every successful reconciliation with
	// the provider (the set of idle addresses may have changed).
	Synced func()
	// Report, if set, hears of what a person should look at (an address
	// set aside because it cannot be wired), besides the log.
	Report func(reason, message string)

	mu          sync.Mutex // guards everything below but the refill state
	pool        *ipam.Pool
	leases      map[netip.Addr]alloc.Lease
	prov        provider.Provider
	info        provider.Info
	providerErr error        // last failure to reach or use the provider
	uncool      []netip.Addr // promoted, still in the store's cooling list
	// synced: the pool has been compared with the provider once. Until
	// then addresses restored as cooling stay cooling: the provider may
	// have taken them back while the agent was away.
	synced bool
	// giveBack: requested addresses whose pods are gone, on their way back
	// to the provider (leaving). Never in the pool at the same time: sync
	// does not adopt them, and one the node gets again from the provider
	// (a release that let it go and failed on another address, or whose
	// answer was lost) or takes back for its pod leaves this list first —
	// a later retry would otherwise take it off a running pod. Run retries
	// them until the provider has them. Persisted by the agent's store
	// (Restore reads them back), so a restart does not adopt them as free.
	giveBack map[netip.Addr]bool
	// wireFailures counts, per address, the ADDs in a row whose wiring
	// failed (Unwired); Wired clears it.
	wireFailures map[netip.Addr]int
	// exhaustedProbe: when the provider said it has no more, the next time
	// Run asks it again although nothing else would (warmTarget 0), and
	// the pause after that.
	exhaustedProbe time.Time
	exhaustedPause time.Duration

	// The ADDs waiting for an address, first come first served, and the
	// refill calls made for them (refill.go).
	waiters []*waiter
	calls   uint64    // refill calls started
	ended   uint64    // the number of the last refill call that ended
	lastErr error     // the last refill call's failure (nil: it succeeded)
	retryAt time.Time // no refill call for waiting ADDs before this
	backoff time.Duration
	adds    []time.Time // when the ADDs of the last churnWindow were served

	// refill is held by the one provider write at a time — a refill, a
	// resync, a trim, a requested address, a give-back (lockRefill). A
	// channel, not a mutex: a waiting ADD tries it without blocking.
	refill       chan struct{}
	surplusSince time.Time // when free first went above MaxFree (zero: not above)
	surplusAfter time.Duration
	kick         chan struct{}
	// tried is closed once Run's first attempt to connect has ended, either
	// way: an ADD that comes while the agent is starting waits for it
	// rather than failing for want of a provider it is about to have.
	tried     chan struct{}
	triedOnce sync.Once
}

// New returns a manager with an empty pool and no provider yet: Restore
// fills it from the store, Run connects.
func New(policy Policy, node string, connect Connect, store Store, log *slog.Logger) *Manager {
	if policy.Tick == 0 {
		policy.Tick = 5 * time.Second
	}
	return &Manager{
		policy: policy, node: node, connect: connect, store: store, log: log,
		pool: ipam.NewPool(policy.Cooldown), leases: map[netip.Addr]alloc.Lease{}, giveBack: map[netip.Addr]bool{},
		wireFailures: map[netip.Addr]int{},
		providerErr:  errConnecting,
		kick:         make(chan struct{}, 1),
		tried:        make(chan struct{}),
		refill:       make(chan struct{}, 1),
	}
}

// Restore puts the store's allocations, cooling and leaving addresses into
// the pool, before anything else happens. An allocation whose address
// another one holds already is returned and left out: wiring or releasing
// it would touch the other's pod, so a person resolves it. Cooling entries
// whose rest is over are forgotten; leaving ones go back to the provider
// once Run connects it (one a pod here holds again stays the pod's).
func (m *Manager) Restore(allocs []*alloc.Allocation, cooling map[netip.Addr]time.Time, leaving []netip.Addr, now time.Time) (conflicts []*alloc.Allocation, err error) {
	var expired, stayed []netip.Addr
	m.mu.Lock()
	for _, a := range allocs {
		if err := m.pool.Restore(a.Address, a.Key()); err != nil {
			conflicts = append(conflicts, a)
			continue
		}
		m.leases[a.Address] = a.Lease
	}
	for ip, until := range cooling {
		if !now.Before(until) || m.pool.State(ip) != ipam.Unknown {
			expired = append(expired, ip)
			continue
		}
		_ = m.pool.RestoreCooling(ip, until)
		m.leases[ip] = alloc.Lease{Address: ip}
	}
	for _, ip := range leaving {
		if m.pool.State(ip) != ipam.Unknown {
			stayed = append(stayed, ip)
			continue
		}
		m.giveBack[ip] = true
	}
	m.mu.Unlock()
	return conflicts, errors.Join(m.store.Uncool(expired), m.store.Left(stayed))
}

// errConnecting is the provider's state until Run's first attempt to
// connect ends.
var errConnecting = errors.New("not connected to the provider yet")

// Shortage is Take's failure: no address now, and why. A retry later may
// succeed (CNI "try again later").
type Shortage struct {
	Msg, Details string
	// Exhausted: the pool cannot grow — the provider said it has no more
	// (a subnet full, no NIC slot left), or the node holds its capacity —
	// rather than the cloud being slow or out of reach.
	Exhausted bool
}

func (s *Shortage) Error() string { return s.Msg + ": " + s.Details }

// promoteLocked frees the addresses whose rest is over; Run forgets them
// in the store (an ADD does not wait for that write, and an address handed
// out again leaves the store's cooling list with its record anyway).
func (m *Manager) promoteLocked(now time.Time) {
	if !m.synced {
		return
	}
	if done := m.pool.Promote(now); len(done) > 0 {
		m.uncool = append(m.uncool, done...)
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
}

func (m *Manager) exhaustedLocked() *Shortage {
	c, capacity := m.pool.Counts(), m.info.Capacity
	details := "free addresses by deleting pods, wait for the cooldown, or give the node more addresses"
	exhausted := capacity > 0 && c.Held() >= capacity
	if m.lastErr != nil && errors.Is(m.lastErr, provider.ErrExhausted) {
		// What bounds the node now, in the provider's words (a subnet
		// full, no NIC slot left for another network).
		details += "; the provider's last answer: " + m.lastErr.Error()
		exhausted = true
	}
	return &Shortage{
		Msg: fmt.Sprintf("no free address on node %s: %d allocated, %d cooling down (%s), capacity %d; try again later",
			m.node, c.Allocated, c.Cooling, m.policy.Cooldown, capacity),
		Details: details, Exhausted: exhausted}
}

// Untake puts back a lease that never reached a pod because its ADD
// failed for a reason of its own (the record could not be written): first
// in line and without a cooldown.
func (m *Manager) Untake(ip netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.pool.Unallocate(ip); err != nil {
		m.log.Error("return unused address", "address", ip, "err", err)
	}
	m.serveLocked(time.Now())
}

// setAsideAfter wiring failures in a row set an address aside; it is tried
// again after setAsideFor, doubled with every further failure up to
// setAsideMax: a NIC that shows up late still gets its address used, and
// an address that never wires costs one failed ADD per period.
const (
	setAsideAfter = 3
	setAsideFor   = time.Minute
	setAsideMax   = time.Hour
)

// Unwired puts back a lease whose wiring failed (the ADD's datapath setup):
// the address may be why (a passthrough or secondary NIC that never shows
// up in the guest), so every other free address goes out before it is
// tried again, and after setAsideAfter failures in a row it is set aside —
// held, handed to nobody, reported — for a while.
func (m *Manager) Unwired(ip netip.Addr, cause error) {
	m.mu.Lock()
	m.wireFailures[ip]++
	n := m.wireFailures[ip]
	if n < setAsideAfter {
		if err := m.pool.Requeue(ip); err != nil {
			m.log.Error("return unused address", "address", ip, "err", err)
		}
		m.serveLocked(time.Now())
		m.mu.Unlock()
		return
	}
	pause := min(setAsideFor<<min(n-setAsideAfter, 6), setAsideMax) // the shift capped: no overflow
	if err := m.pool.SetAside(ip, time.Now().Add(pause)); err != nil {
		m.log.Error("set aside an address that cannot be wired", "address", ip, "err", err)
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	msg := fmt.Sprintf("address %s on node %s could not be wired %d times in a row and is set aside for %s (the pool hands out other addresses meanwhile): %v", ip, m.node, n, pause, cause)
	m.log.Error("address set aside: it cannot be wired", "address", ip, "failures", n, "retry_in", pause, "err", cause)
	if m.Report != nil {
		m.Report(ReasonSetAside, msg)
	}
}

// ReasonSetAside is Report's reason for an address set aside (an Event
// reason on the Node).
const ReasonSetAside = "VpcniAddressSetAside"

// Wired forgets the wiring failures of an address that was wired.
func (m *Manager) Wired(ip netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.wireFailures, ip)
}

// CoolUntil is when an address released at now may be reused (zero: at
// once), for the store's record of the release.
func (m *Manager) CoolUntil(now time.Time) time.Time {
	if m.policy.Cooldown <= 0 {
		return time.Time{}
	}
	return now.Add(m.policy.Cooldown)
}

// Release puts an owner's address to rest after its pod is gone and the
// store recorded that. An address the pool gives to another owner is left
// alone (and said so).
func (m *Manager) Release(owner string, ip netip.Addr, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.pool.Owner(ip); cur != owner {
		return fmt.Errorf("pool gives %s to %q, not %q: left alone", ip, cur, owner)
	}
	if _, err := m.pool.Release(ip, now); err != nil {
		return fmt.Errorf("pool disagrees with store: %w", err)
	}
	m.serveLocked(now) // free at once with no cooldown
	m.Kick()           // surplus may go back to the provider
	return nil
}

// Owns says whether the pool gives ip to owner.
func (m *Manager) Owns(owner string, ip netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pool.State(ip) == ipam.Allocated && m.pool.Owner(ip) == owner
}

// Idle lists the addresses the node holds that no pod uses (free,
// cooling, set aside): anything wired for them is stale.
func (m *Manager) Idle() []netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []netip.Addr
	for _, ip := range m.pool.Held() {
		if s := m.pool.State(ip); s != ipam.Allocated {
			out = append(out, ip)
		}
	}
	return out
}

// Status is the pool as it stands, for STATUS, the agent's state, metrics
// and node annotations.
type Status struct {
	Free, Cooling, Allocated int
	// Aside: held but handed to nobody, their wiring kept failing.
	// Leaving: requested addresses on their way back to the provider.
	Aside, Leaving int
	// Waiting: ADDs in line for an address; WarmTarget: the free
	// addresses the pool keeps ready now (it follows the node's churn).
	Waiting, WarmTarget int
	// Ready: an ADD could be served now; Reason says why not, or what is
	// wrong while it still can (degraded).
	Ready  bool
	Reason string
	// Degraded: the provider is connected but failing (not merely out of
	// addresses), so the node serves from its pool and releases nothing.
	Degraded bool
	Provider provider.Info
	// Addresses lists every held address by state name.
	Addresses map[string][]netip.Addr
}

// Status reads the pool without changing it: addresses whose cooldown is
// over count as free (once the pool has been compared with the provider).
// While the first connect is under way the node counts as ready: an ADD
// waits for it.
func (m *Manager) Status(now time.Time) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, due := m.pool.Counts(), 0
	if m.synced {
		due = m.pool.Due(now)
	}
	s := Status{Free: c.Free + due, Cooling: c.Cooling - due, Allocated: c.Allocated, Aside: c.Aside, Leaving: len(m.giveBack),
		Waiting: len(m.waiters), WarmTarget: m.warmLocked(now),
		Provider: m.info, Degraded: m.degradedLocked(), Addresses: map[string][]netip.Addr{}}
	if m.prov != nil {
		s.Provider = m.prov.Info()
	}
	for _, ip := range m.pool.Held() {
		st := m.pool.State(ip).String()
		s.Addresses[st] = append(s.Addresses[st], ip)
	}
	if len(m.giveBack) > 0 {
		s.Addresses["leaving"] = slices.SortedFunc(maps.Keys(m.giveBack), netip.Addr.Compare)
	}
	switch {
	case s.Free > 0 && s.Degraded:
		s.Ready, s.Reason = true, fmt.Sprintf("degraded: serving %d free addresses from the pool while the provider fails: %v", s.Free, m.providerErr)
	case s.Free > 0:
		s.Ready = true
	case errors.Is(m.providerErr, errConnecting):
		s.Ready, s.Reason = true, "connecting to the provider; an ADD waits for it"
	case s.Provider.Capacity > 0 && c.Held() >= s.Provider.Capacity:
		s.Reason = fmt.Sprintf("no free address and none obtainable: all %d addresses are allocated (%d) or cooling down (%d)", s.Provider.Capacity, s.Allocated, s.Cooling)
	case m.providerErr != nil:
		s.Reason = "no free address and the provider fails: " + m.providerErr.Error()
	default:
		s.Ready = true
	}
	return s
}

func (m *Manager) degradedLocked() bool {
	return m.prov != nil && m.providerErr != nil && !errors.Is(m.providerErr, provider.ErrExhausted)
}

// Provider is the connected provider's description (Name empty before it
// connects).
func (m *Manager) Provider() provider.Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prov != nil {
		return m.prov.Info()
	}
	return m.info
}

// CloudHolds reads from the cloud now whether the provider holds a for
// this node, and on which port or NIC ("" the node's own), for vpcnictl
// trace.
func (m *Manager) CloudHolds(ctx context.Context, a netip.Addr) (held bool, where string, err error) {
	prov := m.provider()
	if prov == nil {
		return false, "", errors.New("the provider is not connected yet")
	}
	leases, err := prov.Held(ctx)
	if err != nil {
		return false, "", err
	}
	where = prov.Info().Port
	for _, l := range leases {
		if l.Address == a {
			if l.Interface != "" {
				where = l.Interface
			}
			return true, where, nil
		}
	}
	return false, where, nil
}

// Kick wakes Run now.
func (m *Manager) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// provider is the connected provider, or nil.
func (m *Manager) provider() provider.Provider {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prov
}

// Run connects the provider (retrying with backoff while it cannot be
// reached), keeps the pool topped up, forgets cooled addresses in the
// store, gives surplus back and compares the pool with the provider every
// Resync, until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	tick := time.NewTicker(m.policy.Tick)
	defer tick.Stop()
	retry := time.Second
	lastSync := time.Now()
	for {
		if m.provider() == nil {
			err := m.tryConnect(ctx)
			m.triedOnce.Do(func() { close(m.tried) })
			if err != nil {
				m.log.Warn("provider not ready; retrying", "err", err, "retry_in", retry)
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
				retry = min(retry*2, 30*time.Second)
				continue
			}
			m.log.Info("provider ready", "provider", m.Provider().Name)
			lastSync = time.Now()
		}
		if time.Since(lastSync) >= m.policy.Resync {
			m.resync(ctx)
			lastSync = time.Now()
		}
		m.maintain(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-m.kick:
		}
	}
}

// maintain is one round of Run's work with the provider connected: forget
// cooled addresses in the store, top the pool up, give surplus and leaving
// addresses back, and ask a failing provider again.
func (m *Manager) maintain(ctx context.Context) {
	m.mu.Lock()
	m.promoteLocked(time.Now())
	cooled := m.uncool
	m.uncool = nil
	m.mu.Unlock()
	if err := m.store.Uncool(cooled); err != nil {
		m.log.Warn("forget cooled addresses; they stay in the store until the next start", "err", err)
	}
	m.topUp(ctx)
	m.trimSurplus(ctx)
	_ = m.retryGiveBack(ctx) // logged; the next round retries
	m.probe(ctx)
}

// tryConnect builds the provider and reconciles the pool with what it
// holds.
func (m *Manager) tryConnect(ctx context.Context) error {
	prov, err := m.connect(ctx)
	if err == nil {
		m.lockRefill()
		err = m.sync(ctx, prov)
		m.unlockRefill()
	}
	m.mu.Lock()
	if err != nil {
		m.providerErr = err
		m.mu.Unlock()
		return err
	}
	m.prov, m.info, m.providerErr = prov, prov.Info(), nil
	m.mu.Unlock()
	if m.Synced != nil {
		m.Synced()
	}
	return nil
}

// resync reconciles the pool with the provider again (level-triggered: an
// address someone removed by hand is asked for again if a pod uses it, or
// forgotten if not; one the agent did not know is adopted).
func (m *Manager) resync(ctx context.Context) {
	prov := m.provider()
	if prov == nil {
		return
	}
	m.lockRefill()
	err := m.sync(ctx, prov)
	m.unlockRefill()
	if err != nil {
		m.log.Warn("periodic provider resync failed", "err", err)
		return
	}
	if m.Synced != nil {
		m.Synced()
	}
}

// sync reconciles the pool with what the provider holds: allocated
// addresses stay (one the provider lost is asked for again by name), held
// addresses nobody uses become free, free or cooling addresses the
// provider no longer holds are forgotten. The caller holds the refill slot.
func (m *Manager) sync(ctx context.Context, prov provider.Provider) error {
	held, err := prov.Held(ctx)
	if err != nil {
		return fmt.Errorf("holdings: %w", err)
	}
	heldSet := map[netip.Addr]alloc.Lease{}
	for _, l := range held {
		heldSet[l.Address] = l
	}
	m.mu.Lock()
	var lost, gone []netip.Addr
	for _, ip := range m.pool.Held() {
		if l, ok := heldSet[ip]; ok {
			if m.pool.State(ip) != ipam.Allocated {
				m.leases[ip] = l // where it lives now; a pod's keeps what it was wired with
			}
			continue
		}
		switch m.pool.State(ip) {
		case ipam.Allocated:
			lost = append(lost, ip)
		default:
			gone = append(gone, ip)
			_ = m.pool.Remove(ip)
			delete(m.leases, ip)
			delete(m.wireFailures, ip)
		}
	}
	for _, l := range held {
		if m.pool.State(l.Address) == ipam.Unknown && !m.giveBack[l.Address] {
			_ = m.pool.AddFree(l.Address)
			m.leases[l.Address] = l
		}
	}
	// Leaving addresses the provider no longer holds are back with it
	// (a release that landed though its answer said it failed).
	var left []netip.Addr
	for ip := range m.giveBack {
		if _, ok := heldSet[ip]; !ok {
			delete(m.giveBack, ip)
			left = append(left, ip)
		}
	}
	m.synced = true
	m.serveLocked(time.Now()) // adopted ones are free
	m.mu.Unlock()
	if err := errors.Join(m.store.Uncool(gone), m.store.Left(left)); err != nil {
		return err
	}
	if len(lost) > 0 {
		if _, err := prov.Assign(ctx, provider.AssignRequest{Addresses: lost}); err != nil {
			m.log.Error("provider no longer holds addresses of running pods and could not get them back", "addresses", lost, "err", err)
		} else {
			m.log.Warn("provider had lost addresses of running pods; got them back", "addresses", lost)
		}
	}
	return nil
}

// probe clears a standing provider error once the provider answers again,
// so STATUS does not stay "not ready" on an old failure.
func (m *Manager) probe(ctx context.Context) {
	m.mu.Lock()
	prov, perr := m.prov, m.providerErr
	m.mu.Unlock()
	if prov == nil || perr == nil {
		return
	}
	if errors.Is(perr, provider.ErrExhausted) {
		m.probeExhausted(ctx)
		return
	}
	if _, err := prov.Held(ctx); err != nil {
		return
	}
	m.mu.Lock()
	if m.providerErr == perr {
		m.providerErr = nil
	}
	m.mu.Unlock()
}

// probeExhausted asks the provider for one address again, backing off,
// while it last said it has no more and nothing else would ask: with no
// free address, a warm target of 0 and the node below its capacity,
// STATUS says not ready on that answer, so no ADD comes to find out that
// the subnet has room again. (With a warm target, topUp asks every tick.)
func (m *Manager) probeExhausted(ctx context.Context) {
	m.lockRefill()
	defer m.unlockRefill()
	m.mu.Lock()
	c := m.pool.Counts()
	idle := c.Free > 0 || m.policy.WarmTarget > 0 || m.info.Capacity > 0 && c.Held() >= m.info.Capacity
	due := !time.Now().Before(m.exhaustedProbe)
	m.mu.Unlock()
	if idle || !due {
		return
	}
	if got, _ := m.obtain(ctx, 1); got > 0 {
		m.log.Info("the provider has addresses again")
		m.exhaustedPause = 0
		return
	}
	m.exhaustedPause = min(max(2*m.exhaustedPause, m.policy.Tick), 5*time.Minute)
	m.exhaustedProbe = time.Now().Add(m.exhaustedPause)
}

// surplusDue says whether free addresses have stayed above MaxFree for
// the grace period (with ±25% jitter, so nodes do not release in step).
// The caller holds the refill slot.
func (m *Manager) surplusDue(now time.Time) bool {
	m.mu.Lock()
	free := m.pool.Counts().Free
	m.mu.Unlock()
	if free <= m.policy.MaxFree {
		m.surplusSince = time.Time{}
		return false
	}
	if m.surplusSince.IsZero() {
		m.surplusSince = now
		g := m.policy.SurplusGrace
		m.surplusAfter = g*3/4 + rand.N(g/2+1)
		time.AfterFunc(m.surplusAfter, m.Kick)
	}
	if now.Sub(m.surplusSince) < m.surplusAfter {
		return false
	}
	m.surplusSince = time.Time{}
	return true
}

// trimSurplus gives free addresses above MaxFree back to the provider.
// They leave the pool before the call, so no ADD can take one meanwhile.
// A failed call does not put them back: the cloud may have acted before
// it failed, and the next resync adopts those the provider still holds.
func (m *Manager) trimSurplus(ctx context.Context) {
	m.mu.Lock()
	prov, degraded := m.prov, m.degradedLocked()
	m.mu.Unlock()
	if prov == nil || degraded {
		return // degraded: keep everything until the cloud answers again
	}
	m.lockRefill()
	defer m.unlockRefill()
	if !m.surplusDue(time.Now()) {
		return
	}
	m.mu.Lock()
	var surplus []netip.Addr
	c := m.pool.Counts()
	for range min(c.Free-m.policy.MaxFree, c.Held()-m.policy.MinHeld) {
		ip, ok := m.pool.Take("surplus")
		if !ok {
			break
		}
		_ = m.pool.Unallocate(ip)
		_ = m.pool.Remove(ip)
		delete(m.leases, ip)
		delete(m.wireFailures, ip)
		surplus = append(surplus, ip)
	}
	m.mu.Unlock()
	if len(surplus) == 0 {
		return
	}
	if err := prov.Release(ctx, surplus); err != nil {
		m.log.Warn("giving surplus addresses back failed; the next resync adopts what is still held", "addresses", surplus, "err", err)
		return
	}
	m.log.Info("gave surplus addresses back to the provider", "addresses", surplus)
}
