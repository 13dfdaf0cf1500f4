// Package agent is vpcnid, the node agent: it owns the node's addresses
// (pool + store), wires pods (datapath) and answers the CNI plugin over a
// unix socket.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/metrics"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/store"
)

// Agent is one node's vpcnid.
type Agent struct {
	cfg     config.Config
	log     *slog.Logger
	store   *store.Store
	prov    provider.Provider
	dp      *datapath.Veth
	started time.Time

	locks keyedMutex // one ADD/DEL/CHECK at a time per attachment

	mu          sync.Mutex // guards pool, capacity, providerErr
	pool        *ipam.Pool
	capacity    int
	providerErr error // last failure to obtain addresses, for STATUS

	refillMu sync.Mutex // one provider refill at a time
	kick     chan struct{}
	metrics  *metrics.Metrics
	cluster  Cluster // nil: no orchestrator

	surplusSince time.Time     // when free first went above maxFree (zero: not above)
	surplusAfter time.Duration // this time's grace, with jitter
}

// New opens the store and the datapath, restores every recorded pod (its
// address and its wiring), removes links vpcni made for attachments it no
// longer knows, and connects the provider. A provider that cannot be
// reached yet does not stop the agent: Run keeps trying, and STATUS says
// why the node is not ready meanwhile.
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (_ *Agent, err error) {
	a := &Agent{cfg: cfg, log: log, started: time.Now(), pool: ipam.NewPool(cfg.Cooldown.Duration), kick: make(chan struct{}, 1), metrics: metrics.New()}
	a.metrics.Watch(a.snapshot)
	if a.store, err = store.Open(cfg.StateDir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if a.dp != nil {
				a.dp.Close()
			}
			a.store.Close()
		}
	}()
	if a.dp, err = datapath.NewVeth(cfg.Uplink, cfg.MTU); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	if err = a.restoreLocal(); err != nil {
		return nil, fmt.Errorf("restore at start: %w", err)
	}
	if err := a.connect(ctx); err != nil {
		log.Error("provider not ready; the agent keeps trying", "provider", cfg.Provider.Type, "err", err)
	}
	return a, nil
}

// Metrics is the agent's instrumentation.
func (a *Agent) Metrics() *metrics.Metrics { return a.metrics }

func (a *Agent) snapshot() metrics.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.pool.Counts()
	return metrics.Snapshot{Free: c.Free, Cooling: c.Cooling, Allocated: c.Allocated, Degraded: a.degradedLocked()}
}

// degradedLocked: the provider is connected but failing (not merely out of
// addresses), so the agent serves from its pool and releases nothing.
func (a *Agent) degradedLocked() bool {
	return a.prov != nil && a.providerErr != nil && !errors.Is(a.providerErr, provider.ErrExhausted)
}

// sweep removes, before the agent serves, kernel state a crash can leave
// for addresses no pod holds: proxy ARP entries and vpcni routes of the
// node's free and cooling addresses.
func (a *Agent) sweep() {
	// The free addresses leave the pool while they are swept, so no ADD
	// wires one meanwhile; cooling ones are not handed out anyway.
	a.mu.Lock()
	var idle, taken []netip.Addr
	for _, ip := range a.pool.Held() {
		switch a.pool.State(ip) {
		case ipam.Free:
			_ = a.pool.Claim(ip, "sweep")
			taken = append(taken, ip)
			idle = append(idle, ip)
		case ipam.Cooling:
			idle = append(idle, ip)
		}
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		for _, ip := range taken {
			_ = a.pool.Unallocate(ip)
		}
		a.mu.Unlock()
	}()
	for _, ip := range idle {
		if removed, err := a.dp.Forget(ip); err != nil {
			a.log.Warn("could not remove stale kernel state", "address", ip, "err", err)
		} else if removed {
			a.log.Info("removed stale kernel state of an idle address", "address", ip)
		}
	}
}

// connect builds the provider and reconciles the pool with what it holds.
func (a *Agent) connect(ctx context.Context) error {
	var prov provider.Provider
	var err error
	switch a.cfg.Provider.Type {
	case "static":
		prov, err = static.New(a.cfg.Provider.Static, a.cfg.StateDir)
	case "openstack":
		prov, err = openstack.New(ctx, *a.cfg.Provider.OpenStack, a.dp.UplinkIP())
	default:
		err = fmt.Errorf("provider %q is not supported", a.cfg.Provider.Type)
	}
	if err == nil {
		prov = a.metrics.Instrument(prov)
		err = a.syncProvider(ctx, prov)
	}
	a.mu.Lock()
	if err != nil {
		a.providerErr = fmt.Errorf("provider %s: %w", a.cfg.Provider.Type, err)
		a.mu.Unlock()
		return a.providerErr
	}
	a.prov, a.providerErr = prov, nil
	a.mu.Unlock()
	a.sweep()
	return nil
}

// provider is the connected provider, or nil.
func (a *Agent) provider() provider.Provider {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.prov
}

// Close releases the store. Pods keep running: an agent restart never
// touches their datapath.
func (a *Agent) Close() error { return errors.Join(a.dp.Close(), a.store.Close()) }

// restoreLocal rebuilds the pool's allocated and cooling addresses from the
// store and repairs the kernel: every recorded pod wired, nothing vpcni
// made left over.
func (a *Agent) restoreLocal() error {
	records, err := a.store.List()
	if err != nil {
		return err
	}
	cooling, err := a.store.Cooling()
	if err != nil {
		return err
	}
	live := map[string]bool{}
	now := time.Now()
	var expired []netip.Addr
	a.mu.Lock()
	var restored []*store.Record
	for _, r := range records {
		if err := a.pool.Restore(r.Address, r.Key()); err != nil {
			// Never wired nor released: that would touch the other
			// record's pod. An operator resolves it (vpcnictl status).
			a.log.Error("allocation record conflicts with another; keeping the first, leaving this one alone", "container", r.ContainerID, "ifName", r.IfName, "err", err)
			continue
		}
		live[r.HostIf] = true
		restored = append(restored, r)
	}
	for ip, until := range cooling {
		if !now.Before(until) || a.pool.State(ip) != ipam.Unknown {
			expired = append(expired, ip)
			continue
		}
		_ = a.pool.RestoreCooling(ip, until)
	}
	a.mu.Unlock()
	if err := a.store.Uncool(expired); err != nil {
		return err
	}
	for _, r := range restored {
		a.repair(r)
	}
	links, err := a.dp.HostLinks()
	if err != nil {
		return err
	}
	for name, key := range links {
		if !live[name] {
			a.log.Info("removing orphan pod link", "link", name, "attachment", key)
			if err := a.dp.RemoveOrphan(name, key); err != nil {
				a.log.Warn("could not remove orphan pod link", "link", name, "err", err)
			}
		}
	}
	return nil
}

// syncProvider reconciles the pool with what the provider holds: recorded
// pods keep their addresses (one the provider lost is asked for again by
// name), held addresses nobody uses become free, cooling addresses the
// provider no longer holds are forgotten.
func (a *Agent) syncProvider(ctx context.Context, prov provider.Provider) error {
	capacity, err := prov.Capacity(ctx)
	if err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	held, err := prov.Held(ctx)
	if err != nil {
		return fmt.Errorf("holdings: %w", err)
	}
	heldSet := map[netip.Addr]bool{}
	for _, ip := range held {
		heldSet[ip] = true
	}
	a.mu.Lock()
	var lost, gone []netip.Addr
	for _, ip := range a.pool.Held() {
		if heldSet[ip] {
			continue
		}
		switch a.pool.State(ip) {
		case ipam.Allocated:
			lost = append(lost, ip)
		default:
			gone = append(gone, ip)
			_ = a.pool.Remove(ip)
		}
	}
	for _, ip := range held {
		if a.pool.State(ip) == ipam.Unknown {
			_ = a.pool.AddFree(ip)
		}
	}
	a.capacity = capacity
	a.mu.Unlock()
	if err := a.store.Uncool(gone); err != nil {
		return err
	}
	if len(lost) > 0 {
		if _, err := prov.Assign(ctx, provider.AssignRequest{Addresses: lost}); err != nil {
			a.log.Error("provider no longer holds addresses of running pods and could not get them back", "addresses", lost, "err", err)
		} else {
			a.log.Warn("provider had lost addresses of running pods; got them back", "addresses", lost)
		}
	}
	return nil
}

// repair makes one recorded attachment whole again. A pod whose namespace
// is gone has been deleted while the agent was away: its DEL is done now.
func (a *Agent) repair(r *store.Record) {
	att := attachmentOf(r)
	if _, err := os.Stat(r.Netns); errors.Is(err, os.ErrNotExist) {
		// An empty or missing namespace directory is more likely a mount
		// the agent does not see (a DaemonSet without the runtime's netns
		// dir) than every pod gone: keep the record and say so.
		if entries, derr := os.ReadDir(filepath.Dir(r.Netns)); derr != nil || len(entries) == 0 {
			a.log.Error("pod namespace not found, and its directory is empty or missing: is the runtime's netns directory mounted? keeping the pod", "container", r.ContainerID, "netns", r.Netns, "address", r.Address)
			return
		}
		a.log.Info("pod namespace gone while the agent was down; releasing", "container", r.ContainerID, "address", r.Address)
		if err := a.release(r); err != nil {
			a.log.Error("release of a gone pod failed", "container", r.ContainerID, "err", err)
		}
		return
	}
	err := a.dp.Check(att)
	if err == nil {
		return
	}
	a.log.Info("re-wiring pod", "container", r.ContainerID, "ifName", r.IfName, "problem", err)
	if err := a.dp.Teardown(att); err != nil {
		a.log.Warn("teardown before re-wiring failed", "container", r.ContainerID, "err", err)
	}
	if _, err := a.dp.Setup(att); err != nil {
		a.log.Error("re-wiring pod failed", "container", r.ContainerID, "err", err)
	}
}

func attachmentOf(r *store.Record) *datapath.Attachment {
	return &datapath.Attachment{ContainerID: r.ContainerID, IfName: r.IfName, Netns: r.Netns, Address: r.Address}
}

// Run connects the provider if it was not reachable at start, keeps the
// pool topped up, returns cooled addresses to it and gives surplus back to
// the provider, until ctx ends.
func (a *Agent) Run(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	retry := time.Second
	lastSync := time.Now()
	for {
		if a.provider() == nil {
			if err := a.connect(ctx); err != nil {
				a.log.Warn("provider still not ready", "err", err, "retry_in", retry)
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
				retry = min(retry*2, 30*time.Second)
				continue
			}
			a.log.Info("provider ready", "provider", a.cfg.Provider.Type)
		}
		if time.Since(lastSync) >= a.cfg.Resync.Duration {
			a.resync(ctx)
			lastSync = time.Now()
		}
		a.mu.Lock()
		cooled := a.pool.Promote(time.Now())
		a.mu.Unlock()
		if err := a.store.Uncool(cooled); err != nil {
			a.log.Warn("forget cooled addresses", "err", err)
		}
		a.topUp(ctx)
		a.trimSurplus(ctx)
		a.probeProvider(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.kick:
		}
	}
}

// resync reconciles the pool with the provider again (level-triggered: an
// address someone removed by hand is asked for again if a pod uses it, or
// forgotten if not; one the agent did not know is adopted).
func (a *Agent) resync(ctx context.Context) {
	prov := a.provider()
	if prov == nil {
		return
	}
	a.refillMu.Lock()
	defer a.refillMu.Unlock()
	if err := a.syncProvider(ctx, prov); err != nil {
		a.log.Warn("periodic provider resync failed", "err", err)
	}
}

// surplusDue says whether free addresses have stayed above maxFree for
// the grace period (with ±25% jitter, so nodes do not release in step).
func (a *Agent) surplusDue(now time.Time) bool {
	a.mu.Lock()
	free := a.pool.Counts().Free
	a.mu.Unlock()
	if free <= a.cfg.Pool.MaxFree {
		a.surplusSince = time.Time{}
		return false
	}
	if a.surplusSince.IsZero() {
		a.surplusSince = now
		g := a.cfg.Pool.SurplusGrace.Duration
		a.surplusAfter = g*3/4 + rand.N(g/2+1)
		a.kickAt(now.Add(a.surplusAfter))
	}
	if now.Sub(a.surplusSince) < a.surplusAfter {
		return false
	}
	a.surplusSince = time.Time{}
	return true
}

// kickAt wakes the Run loop at t.
func (a *Agent) kickAt(t time.Time) {
	time.AfterFunc(time.Until(t), a.kickRefill)
}

// probeProvider clears a standing provider error once the provider answers
// again, so STATUS does not stay "not ready" on an old failure.
func (a *Agent) probeProvider(ctx context.Context) {
	a.mu.Lock()
	prov, perr := a.prov, a.providerErr
	a.mu.Unlock()
	if prov == nil || perr == nil || errors.Is(perr, provider.ErrExhausted) {
		return
	}
	if _, err := prov.Held(ctx); err != nil {
		return
	}
	a.mu.Lock()
	if a.providerErr == perr {
		a.providerErr = nil
	}
	a.mu.Unlock()
}

// trimSurplus gives free addresses above pool.maxFree back to the provider.
// They leave the pool before the call, so no ADD can take one meanwhile; a
// failed call puts them back.
func (a *Agent) trimSurplus(ctx context.Context) {
	a.mu.Lock()
	prov, degraded := a.prov, a.degradedLocked()
	a.mu.Unlock()
	if prov == nil || degraded {
		return // degraded: keep everything until the cloud answers again
	}
	a.refillMu.Lock()
	defer a.refillMu.Unlock()
	if !a.surplusDue(time.Now()) {
		return
	}
	a.mu.Lock()
	var surplus []netip.Addr
	c := a.pool.Counts()
	for range min(c.Free-a.cfg.Pool.MaxFree, c.Held()-a.cfg.Pool.MinHeld) {
		ip, ok := a.pool.Take("surplus", time.Now())
		if !ok {
			break
		}
		_ = a.pool.Unallocate(ip)
		_ = a.pool.Remove(ip)
		surplus = append(surplus, ip)
	}
	a.mu.Unlock()
	if len(surplus) == 0 {
		return
	}
	if err := prov.Release(ctx, surplus); err != nil {
		// The cloud may have acted before the failure: these addresses
		// stay out of the pool, and the next resync adopts those the
		// provider still holds for the node.
		a.log.Warn("giving surplus addresses back failed; the next resync adopts what is still held", "addresses", surplus, "err", err)
		return
	}
	a.log.Info("gave surplus addresses back to the provider", "addresses", surplus)
}

func (a *Agent) kickRefill() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// topUp asks the provider for addresses until WarmTarget are free, in
// batches of at most BatchSize, never beyond capacity.
func (a *Agent) topUp(ctx context.Context) {
	a.refillMu.Lock()
	defer a.refillMu.Unlock()
	for {
		n := a.want(a.cfg.Pool.WarmTarget)
		if n == 0 {
			return
		}
		if got, _ := a.obtain(ctx, n); got == 0 {
			return
		}
	}
}

// want is how many addresses to ask for to have target free ones.
func (a *Agent) want(target int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.pool.Counts()
	n := min(target-c.Free, a.cfg.Pool.BatchSize)
	if a.capacity > 0 {
		n = min(n, a.capacity-c.Held())
	}
	return max(n, 0)
}

// obtain asks the provider for n addresses, puts them in the pool and says
// how many it got.
func (a *Agent) obtain(ctx context.Context, n int) (int, error) {
	prov := a.provider()
	if prov == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		return 0, fmt.Errorf("provider not ready: %w", a.providerErr)
	}
	got, err := prov.Assign(ctx, provider.AssignRequest{Count: n})
	a.mu.Lock()
	defer a.mu.Unlock()
	added := 0
	for _, ip := range got {
		if a.pool.State(ip) != ipam.Unknown {
			a.log.Error("provider returned an address the pool already has", "address", ip, "state", a.pool.State(ip))
			continue
		}
		_ = a.pool.AddFree(ip)
		added++
	}
	a.providerErr = err
	return added, err
}

// keyedMutex serialises work per attachment key.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int
}

func (k *keyedMutex) Lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
