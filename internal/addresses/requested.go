package addresses

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// BadRequest is TakeAddress's failure for an address the node can never
// have (outside the provider's subnet or ranges): retrying will not help.
type BadRequest struct{ Msg string }

func (b *BadRequest) Error() string { return b.Msg }

// TakeAddress allocates one address asked for by name (a pod's own fixed
// IP, following it from node to node) to owner. Free here: taken at once.
// Cooling here: taken too — the rest protects a different pod from stale
// state elsewhere, and a request names this address on purpose (so is one
// set aside after failed wirings for other pods). Not held
// by the node: asked of the provider, which refuses it while another node
// or port holds it (a Shortage: try again later, once that one gave it
// back). Held by another pod here: a Shortage as well. A repeated request
// of the same owner returns its lease.
func (m *Manager) TakeAddress(ctx context.Context, owner string, ip netip.Addr) (alloc.Lease, error) {
	select {
	case <-m.tried: // the provider is connected, or its first attempt failed
	case <-ctx.Done():
		return alloc.Lease{}, ctx.Err()
	}
	if l, ok, err := m.claim(owner, ip); ok || err != nil {
		return l, err
	}
	m.lockRefill()
	defer m.unlockRefill()
	// A refill may have brought it in while this waited.
	if l, ok, err := m.claim(owner, ip); ok || err != nil {
		return l, err
	}
	prov := m.provider()
	if prov == nil {
		m.mu.Lock()
		perr := m.providerErr
		m.mu.Unlock()
		return alloc.Lease{}, &Shortage{Msg: fmt.Sprintf("requested address %s: the provider is not connected; try again later", ip), Details: fmt.Sprint(perr)}
	}
	// Marked leaving in the store before the provider is asked: an agent
	// that dies before the ADD records the pod gives the address back at
	// its next start, rather than adopting it as a free one of the node's
	// that another pod may take (the record's write clears the mark).
	if err := m.store.Claim(ip); err != nil {
		return alloc.Lease{}, fmt.Errorf("requested address %s: record the claim: %w", ip, err)
	}
	got, err := prov.Assign(ctx, provider.AssignRequest{Addresses: []netip.Addr{ip}})
	i := slices.IndexFunc(got, func(l alloc.Lease) bool { return l.Address == ip })
	if i < 0 {
		m.mu.Lock()
		switch {
		case m.giveBack[ip]:
			// Leaving already (a pod of this node's had it): it stays so.
		case errors.Is(err, provider.ErrOutside) || errors.Is(err, provider.ErrTaken):
			// The provider did not give it to the node: nothing to undo.
			defer func() { _ = m.store.Left([]netip.Addr{ip}) }()
		default:
			// The assignment may have landed with its answer lost: give it
			// back (releasing an address the node does not hold is a no-op).
			m.giveBack[ip] = true
		}
		m.mu.Unlock()
		switch {
		case errors.Is(err, provider.ErrOutside):
			return alloc.Lease{}, &BadRequest{Msg: fmt.Sprintf("requested address %s cannot be a pod address on node %s: %v", ip, m.node, err)}
		case errors.Is(err, provider.ErrTaken):
			return alloc.Lease{}, &Shortage{Msg: fmt.Sprintf("requested address %s is held by another node or port; try again once it is given back", ip), Details: err.Error()}
		case err == nil:
			err = errors.New("the provider returned without it")
		}
		return alloc.Lease{}, &Shortage{Msg: fmt.Sprintf("requested address %s could not be obtained; try again later", ip), Details: err.Error()}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.giveBack, ip) // its pod came back here before it could leave
	_ = m.pool.AddFree(ip)
	m.leases[ip] = got[i]
	if err := m.pool.Claim(ip, owner); err != nil {
		return alloc.Lease{}, fmt.Errorf("requested address %s: %w", ip, err)
	}
	return got[i], nil
}

// claim takes ip for owner if the pool holds it; ok is false when the
// pool does not.
func (m *Manager) claim(owner string, ip netip.Addr) (l alloc.Lease, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.pool.State(ip) {
	case ipam.Unknown:
		return alloc.Lease{}, false, nil
	case ipam.Allocated:
		if cur := m.pool.Owner(ip); cur != owner {
			return alloc.Lease{}, false, &Shortage{Msg: fmt.Sprintf("requested address %s is in use by %s on node %s; try again once it is released", ip, cur, m.node)}
		}
		return m.leases[ip], true, nil
	case ipam.Cooling:
		_ = m.pool.Remove(ip)
		_ = m.pool.AddFree(ip)
		m.uncool = append(m.uncool, ip)
	case ipam.Aside:
		// Set aside from other pods after failed wirings; a request names
		// it on purpose, and its own failure gives it back to the provider.
		_ = m.pool.Remove(ip)
		_ = m.pool.AddFree(ip)
	}
	if err := m.pool.Claim(ip, owner); err != nil {
		return alloc.Lease{}, false, err
	}
	return m.leases[ip], true, nil
}

// GiveBack hands a requested address back to the provider once its pod
// is gone (the store recorded its record's release and the address as
// leaving, in one transaction): it is the pod's, not the node's, so
// another node may take it at once (the pod started elsewhere). The pool
// forgets it now, marked as leaving so that no resync adopts it, and asks
// the provider to release it, waiting up to giveBackWait. When the
// provider fails or is slow, GiveBack returns the error and the address
// stays leaving — Run retries it, across restarts too — so the pod's next
// node gets "try again later" until it is back with the provider. The
// caller must not hold a lock an ADD needs: this waits on the cloud.
func (m *Manager) GiveBack(ctx context.Context, owner string, ip netip.Addr) error {
	if err := m.forget(owner, ip); err != nil {
		return err
	}
	c, cancel := context.WithTimeout(ctx, giveBackWait)
	defer cancel()
	if err := m.retryGiveBack(c); err != nil {
		return fmt.Errorf("give %s back to the provider (retried in the background): %w", ip, err)
	}
	return nil
}

// GiveBackLater is GiveBack without the wait: the provider's release runs
// in the background at once (for a caller that holds a lock an ADD needs).
func (m *Manager) GiveBackLater(owner string, ip netip.Addr) error {
	if err := m.forget(owner, ip); err != nil {
		return err
	}
	go func() {
		c, cancel := context.WithTimeout(context.Background(), giveBackWait)
		defer cancel()
		_ = m.retryGiveBack(c)
	}()
	return nil
}

// giveBackWait bounds one attempt to give addresses back.
const giveBackWait = 10 * time.Second

// forget takes owner's requested address out of the pool, marked as
// leaving.
func (m *Manager) forget(owner string, ip netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.pool.Owner(ip); cur != owner {
		return fmt.Errorf("pool gives %s to %q, not %q: left alone", ip, cur, owner)
	}
	_ = m.pool.Unallocate(ip)
	_ = m.pool.Remove(ip)
	delete(m.leases, ip)
	delete(m.wireFailures, ip)
	m.giveBack[ip] = true
	return nil
}

// release gives addresses back to the provider and forgets them as
// leaving once it did. On a failure they all stay leaving, also those the
// provider may have let go of before it failed: releasing one again is
// harmless, and one the node gets anew from the provider leaves the list
// then (obtain, sync). The caller holds the refill slot.
func (m *Manager) release(ctx context.Context, prov provider.Provider, ips []netip.Addr) error {
	if prov == nil {
		return errors.New("provider not connected")
	}
	if err := prov.Release(ctx, ips); err != nil {
		return err
	}
	m.mu.Lock()
	for _, ip := range ips {
		delete(m.giveBack, ip)
	}
	m.mu.Unlock()
	if err := m.store.Left(ips); err != nil {
		m.log.Warn("forget addresses given back; the next start gives them back again (harmless)", "addresses", ips, "err", err)
	}
	return nil
}

// retryGiveBack releases the requested addresses still leaving. The list
// is read holding the refill slot, which every path that puts an address into the
// pool holds (TakeAddress taking one back for its pod, a refill, a sync):
// a list read before would release a running pod's address. An address
// the pool holds is never released from here, whatever the list says.
func (m *Manager) retryGiveBack(ctx context.Context) error {
	m.lockRefill()
	defer m.unlockRefill()
	m.mu.Lock()
	prov := m.prov
	var ips, pooled []netip.Addr
	for ip := range m.giveBack {
		if m.pool.State(ip) != ipam.Unknown {
			delete(m.giveBack, ip)
			pooled = append(pooled, ip)
			continue
		}
		ips = append(ips, ip)
	}
	m.mu.Unlock()
	if len(pooled) > 0 {
		m.log.Error("leaving addresses found in the pool; kept, not given back", "addresses", pooled)
		_ = m.store.Left(pooled)
	}
	if len(ips) == 0 {
		return nil
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	if err := m.release(ctx, prov, ips); err != nil {
		m.log.Warn("requested addresses not given back to the provider yet; retrying", "addresses", ips, "err", err)
		return err
	}
	m.log.Info("requested addresses given back to the provider", "addresses", ips)
	return nil
}
