package addresses

// Refill: how an ADD gets an address when the pool has none free, and how
// the pool is topped up. ADDs that find the pool empty queue up, first
// come first served. One provider call at a time (the refill slot) asks
// for what is waiting plus the warm target; its answer goes straight to
// the queue, in order, and wakes exactly the ADDs it serves. An ADD that
// queues while a call is in flight is served by that call's surplus or
// counted in the next one; it never makes a call of its own beside it.
// The first ADD in line makes the next call once the slot is free (Run's
// topUp makes it otherwise), so a burst of ADDs on an empty pool costs
// about two calls: one for the ADDs queued when it started, one for all
// that queued meanwhile.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// waiter is an ADD in line for an address.
type waiter struct {
	owner string
	// seq: refill calls started before it queued. A call numbered above
	// it counted it.
	seq uint64
	// wake is signalled when the waiter is served, told exhausted, or
	// first in line with the refill slot free.
	wake chan struct{}
	// Set under the manager's mu.
	lease     alloc.Lease
	served    bool
	exhausted bool // a call that counted it found no more addresses
}

const (
	// churnWindow is how far back the warm target looks at the node's
	// ADDs; churnAhead is how much of that demand it keeps ready (see
	// warmLocked).
	churnWindow = time.Minute
	churnAhead  = 10 * time.Second
	// retryFirst and retryMax pace the calls for waiting ADDs while the
	// provider fails: doubling from the first to the last.
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
)

// Take allocates a free lease to owner. While the agent is starting, an
// empty pool first waits for Run's first attempt to connect the provider
// (bounded by the provider's own timeouts, and ctx). With the pool empty
// the ADD queues and waits, up to AddWait, for a refill call to serve it,
// for a failed call to succeed on a retry, or for a cooldown to end; it
// ends at once when nothing can change in time (capacity used up, no
// cooldown ending before the deadline). A waiting ADD whose ctx ends after
// it was handed an address gives the address back to the pool.
func (m *Manager) Take(ctx context.Context, owner string) (alloc.Lease, error) {
	select {
	case <-m.tried:
	default:
		if l, ok := m.take(owner); ok { // restored or left free: no need to wait
			m.Kick()
			return l, nil
		}
		select {
		case <-m.tried:
		case <-ctx.Done():
		}
	}
	m.mu.Lock()
	if l, ok := m.takeLocked(owner); ok {
		m.mu.Unlock()
		m.Kick()
		return l, nil
	}
	w := &waiter{owner: owner, seq: m.calls, wake: make(chan struct{}, 1)}
	m.waiters = append(m.waiters, w)
	m.wakeHeadLocked()
	m.mu.Unlock()
	l, err := m.await(ctx, w, time.Now().Add(m.policy.AddWait))
	if err == nil {
		m.Kick() // the warm pool may want topping up
	}
	return l, err
}

// take promotes what has cooled (and what was set aside long enough) and
// takes the longest-rested free lease, unless ADDs are in line.
func (m *Manager) take(owner string) (alloc.Lease, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takeLocked(owner)
}

func (m *Manager) takeLocked(owner string) (alloc.Lease, bool) {
	now := time.Now()
	m.serveLocked(now)
	if len(m.waiters) > 0 {
		return alloc.Lease{}, false // first come first served
	}
	ip, ok := m.pool.Take(owner)
	if !ok {
		return alloc.Lease{}, false
	}
	m.countAddLocked(now)
	return m.leases[ip], true
}

// await waits for w's turn: served, or first in line to make the next
// call, or told that no address can come in time.
func (m *Manager) await(ctx context.Context, w *waiter, deadline time.Time) (alloc.Lease, error) {
	for {
		now := time.Now()
		m.mu.Lock()
		m.serveLocked(now)
		if w.served {
			if ctx.Err() != nil {
				// Nobody takes it from here: back to the pool, first in
				// line, for the next ADD.
				m.untakeLocked(w.lease.Address)
				m.mu.Unlock()
				return alloc.Lease{}, &Shortage{Msg: "the ADD ended while waiting for an address", Details: ctx.Err().Error()}
			}
			m.mu.Unlock()
			return w.lease, nil
		}
		look := deadline // when to look again at the latest
		if w.exhausted {
			w.exhausted = false
			next, cooling := m.pool.NextCooled()
			if !cooling || next.After(deadline) {
				m.leaveLocked(w)
				err := m.exhaustedLocked()
				m.mu.Unlock()
				return alloc.Lease{}, err
			}
			look = next
		} else if m.waiters[0] == w && ctx.Err() == nil {
			if now.Before(m.retryAt) {
				if m.retryAt.Before(look) {
					look = m.retryAt
				}
			} else if m.tryLockRefill() {
				m.mu.Unlock()
				m.refillOnce(ctx)
				m.unlockRefill()
				continue
			}
			// Otherwise a call is in flight: its end wakes the first in line.
		}
		// Past the deadline an ADD still hears the answer of one call that
		// counted it (as an ADD always did, AddWait 0 included): one that
		// came while another's call was under way waits for its own.
		heard := m.ended > w.seq
		if ctx.Err() != nil || !now.Before(deadline) && heard {
			m.leaveLocked(w)
			err := m.shortageLocked()
			if ctx.Err() != nil && (m.lastErr == nil || errors.Is(m.lastErr, provider.ErrExhausted)) {
				err = &Shortage{Msg: "the ADD ended while waiting for an address", Details: ctx.Err().Error()}
			}
			m.mu.Unlock()
			return alloc.Lease{}, err
		}
		if !now.Before(deadline) {
			look = now.Add(time.Second) // the call's end wakes the line
		}
		m.mu.Unlock()
		t := time.NewTimer(max(time.Until(look), time.Millisecond))
		select {
		case <-w.wake:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// shortageLocked is the failure of an ADD that waited in vain: the
// provider's last failure, or a provider slower than AddWait.
func (m *Manager) shortageLocked() *Shortage {
	switch {
	case m.lastErr != nil && !errors.Is(m.lastErr, provider.ErrExhausted):
		return &Shortage{
			Msg:     fmt.Sprintf("no free address and the provider could not be reached for more within %s; try again later", m.policy.AddWait),
			Details: m.lastErr.Error()}
	case m.lastErr == nil && len(m.waiters) > 0:
		return &Shortage{
			Msg:     fmt.Sprintf("no free address on node %s within %s: the provider is still assigning addresses to the ADDs in line; try again later", m.node, m.policy.AddWait),
			Details: "a larger pool.warmTarget keeps addresses ready ahead of bursts"}
	}
	return m.exhaustedLocked()
}

// serveLocked promotes what has cooled (and what was set aside long
// enough) and hands free addresses to the ADDs in line, in order.
func (m *Manager) serveLocked(now time.Time) {
	m.promoteLocked(now)
	m.pool.Unaside(now)
	served := 0
	for _, w := range m.waiters {
		ip, ok := m.pool.Take(w.owner)
		if !ok {
			break
		}
		w.lease, w.served = m.leases[ip], true
		m.countAddLocked(now)
		signal(w.wake)
		served++
	}
	if served > 0 {
		m.waiters = slices.Delete(m.waiters, 0, served)
		m.wakeHeadLocked()
	}
}

// untakeLocked puts back an address handed to an ADD that is gone, first
// in line, and serves the next waiting ADD with it.
func (m *Manager) untakeLocked(ip netip.Addr) {
	if err := m.pool.Unallocate(ip); err != nil {
		m.log.Error("return unused address", "address", ip, "err", err)
	}
	m.serveLocked(time.Now())
}

// leaveLocked takes w out of the line.
func (m *Manager) leaveLocked(w *waiter) {
	i := slices.Index(m.waiters, w)
	if i < 0 {
		return
	}
	m.waiters = slices.Delete(m.waiters, i, i+1)
	if i == 0 {
		m.wakeHeadLocked()
	}
}

// wakeHeadLocked tells the first ADD in line to look whether it should
// make the next call.
func (m *Manager) wakeHeadLocked() {
	if len(m.waiters) > 0 {
		signal(m.waiters[0].wake)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (m *Manager) lockRefill() { m.refill <- struct{}{} }

func (m *Manager) tryLockRefill() bool {
	select {
	case m.refill <- struct{}{}:
		return true
	default:
		return false
	}
}

// unlockRefill frees the slot and tells the first ADD in line, which
// makes the next call if it still needs one.
func (m *Manager) unlockRefill() {
	<-m.refill
	m.mu.Lock()
	m.wakeHeadLocked()
	m.mu.Unlock()
}

// refillOnce makes one refill call: for the ADDs in line plus the warm
// target. The caller holds the refill slot.
func (m *Manager) refillOnce(ctx context.Context) (got int, err error) {
	m.mu.Lock()
	m.serveLocked(time.Now())
	n := m.wantLocked(time.Now())
	if n == 0 && len(m.waiters) == 0 {
		m.mu.Unlock()
		return 0, nil // nothing wanted
	}
	m.calls++
	seq, waiting := m.calls, len(m.waiters)
	m.mu.Unlock()
	if n > 0 {
		got, err = m.obtain(ctx, n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended = seq
	switch {
	case errors.Is(err, provider.ErrExhausted) || n == 0 && err == nil && waiting > 0:
		// No more to be had: every ADD the call counted and did not
		// serve hears it (and waits for a cooldown, if one ends in time).
		for _, w := range m.waiters {
			if w.seq < seq {
				w.exhausted = true
				signal(w.wake)
			}
		}
		m.lastErr = err
	case err != nil && ctx.Err() == nil:
		// The provider failed: the ADDs in line retry, backing off.
		m.lastErr = err
		m.backoff = min(max(2*m.backoff, retryFirst), retryMax)
		m.retryAt = time.Now().Add(m.backoff)
	case err == nil:
		m.lastErr, m.backoff, m.retryAt = nil, 0, time.Time{}
	}
	// A call ended by its caller's ctx says nothing of the provider: the
	// next in line calls again at once.
	return got, err
}

// topUp asks the provider for addresses until the warm target is free
// and every ADD in line served, never beyond capacity.
func (m *Manager) topUp(ctx context.Context) {
	m.lockRefill()
	defer m.unlockRefill()
	for {
		if got, _ := m.refillOnce(ctx); got == 0 {
			return
		}
	}
}

// wantLocked is how many addresses one call asks for: the ADDs in line
// plus the warm target, less what is free, within BatchSize and the
// node's capacity.
func (m *Manager) wantLocked(now time.Time) int {
	c := m.pool.Counts()
	n := len(m.waiters) + m.warmLocked(now) - c.Free
	if m.policy.BatchSize > 0 {
		n = min(n, m.policy.BatchSize)
	}
	if m.info.Capacity > 0 {
		n = min(n, m.info.Capacity-c.Held())
	}
	return max(n, 0)
}

// warmLocked is the warm target now: WarmTarget, raised to the node's
// demand of the next churnAhead, at most MaxFree (above it the surplus
// would go back). The demand is the larger of the ADDs of the last
// churnAhead and churnAhead's worth at the rate of the last churnWindow:
// the first follows a burst within seconds, where the minute's rate alone
// lags it (100 ADDs in 20 s: ten seconds in, the minute's rate says 9 and
// the last ten seconds 50), and ADDs bunched behind refill calls wire in
// a crowd; the second carries steady churn. WarmTarget 0 keeps nothing
// ready.
func (m *Manager) warmLocked(now time.Time) int {
	if m.policy.WarmTarget <= 0 {
		return 0
	}
	m.trimAddsLocked(now)
	perWindow := (len(m.adds)*int(churnAhead/time.Second) + int(churnWindow/time.Second) - 1) / int(churnWindow/time.Second)
	lately := len(m.adds) - sort.Search(len(m.adds), func(i int) bool { return now.Sub(m.adds[i]) < churnAhead })
	return max(m.policy.WarmTarget, min(max(perWindow, lately), m.policy.MaxFree))
}

// countAddLocked notes an ADD served from the pool, for the warm target.
func (m *Manager) countAddLocked(now time.Time) {
	m.trimAddsLocked(now)
	m.adds = append(m.adds, now)
}

func (m *Manager) trimAddsLocked(now time.Time) {
	i := 0
	for i < len(m.adds) && now.Sub(m.adds[i]) >= churnWindow {
		i++
	}
	m.adds = slices.Delete(m.adds, 0, i)
}

// obtain asks the provider for n addresses, puts them in the pool, hands
// them to the ADDs in line, and says how many it got. The caller holds the
// refill slot.
func (m *Manager) obtain(ctx context.Context, n int) (int, error) {
	prov := m.provider()
	if prov == nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		return 0, fmt.Errorf("provider not ready: %w", m.providerErr)
	}
	got, err := prov.Assign(ctx, provider.AssignRequest{Count: n})
	m.mu.Lock()
	added := 0
	var back []netip.Addr
	for _, l := range got {
		if s := m.pool.State(l.Address); s != ipam.Unknown {
			m.log.Error("provider returned an address the pool already has", "address", l.Address, "state", s)
			continue
		}
		if m.giveBack[l.Address] {
			// The cloud let it go (though the release said it failed) and
			// gave it to the node anew: it is the node's now, not leaving.
			delete(m.giveBack, l.Address)
			back = append(back, l.Address)
		}
		_ = m.pool.AddFree(l.Address)
		m.leases[l.Address] = l
		added++
	}
	m.serveLocked(time.Now())
	// A caller that gave up (an ADD whose runtime stopped waiting) says
	// nothing about the provider: only the provider's own failure counts.
	if err == nil || ctx.Err() == nil {
		m.providerErr = err
	}
	m.info = prov.Info()
	m.mu.Unlock()
	if err := m.store.Left(back); err != nil {
		m.log.Warn("forget leaving addresses the node holds again; the next start gives them back if still unused", "addresses", back, "err", err)
	}
	return added, err
}
