// Package agent is vpcnid, the node agent: it owns the node's addresses
// (pool + store), wires pods (datapath) and answers the CNI plugin over a
// unix socket.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
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
}

// New opens the store, the provider and the datapath and reconciles them:
// every recorded pod keeps its address and its wiring; links vpcni made for
// attachments it no longer knows are removed.
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (_ *Agent, err error) {
	a := &Agent{cfg: cfg, log: log, started: time.Now(), pool: ipam.NewPool(cfg.Cooldown.Duration), kick: make(chan struct{}, 1)}
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
	switch cfg.Provider.Type {
	case "static":
		a.prov, err = static.New(cfg.Provider.Static, cfg.StateDir)
	default:
		err = fmt.Errorf("provider %q is not supported", cfg.Provider.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", cfg.Provider.Type, err)
	}
	if a.dp, err = datapath.NewVeth(cfg.Uplink, cfg.MTU); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	if err = a.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile at start: %w", err)
	}
	return a, nil
}

// Close releases the store. Pods keep running: an agent restart never
// touches their datapath.
func (a *Agent) Close() error { return errors.Join(a.dp.Close(), a.store.Close()) }

// reconcile rebuilds the pool from provider and store and repairs the
// kernel: provider ↔ store ↔ datapath.
func (a *Agent) reconcile(ctx context.Context) error {
	capacity, err := a.prov.Capacity(ctx)
	if err != nil {
		return fmt.Errorf("provider capacity: %w", err)
	}
	held, err := a.prov.Held(ctx)
	if err != nil {
		return fmt.Errorf("provider holdings: %w", err)
	}
	records, err := a.store.List()
	if err != nil {
		return err
	}
	cooling, err := a.store.Cooling()
	if err != nil {
		return err
	}
	heldSet := map[netip.Addr]bool{}
	for _, ip := range held {
		heldSet[ip] = true
	}

	a.mu.Lock()
	a.capacity = capacity
	a.mu.Unlock()

	// Every recorded pod keeps its address: one the provider lost is asked
	// for again by name.
	var lost []netip.Addr
	for _, r := range records {
		if !heldSet[r.Address] {
			lost = append(lost, r.Address)
		}
	}
	if len(lost) > 0 {
		got, err := a.prov.Assign(ctx, provider.AssignRequest{Addresses: lost})
		for _, ip := range got {
			heldSet[ip] = true
		}
		if err != nil {
			a.log.Error("provider no longer holds addresses recorded for running pods", "addresses", lost, "err", err)
		}
	}

	live := map[string]bool{}
	now := time.Now()
	a.mu.Lock()
	for _, r := range records {
		if err := a.pool.Restore(r.Address, r.Key()); err != nil {
			a.log.Error("allocation record conflicts with another; keeping the first", "container", r.ContainerID, "ifName", r.IfName, "err", err)
			continue
		}
		live[r.HostIf] = true
	}
	var expired []netip.Addr
	for ip, until := range cooling {
		if !heldSet[ip] || !now.Before(until) || a.pool.State(ip) != ipam.Unknown {
			expired = append(expired, ip)
			continue
		}
		_ = a.pool.RestoreCooling(ip, until)
	}
	for _, ip := range held {
		if a.pool.State(ip) == ipam.Unknown {
			_ = a.pool.AddFree(ip)
		}
	}
	a.mu.Unlock()
	if err := a.store.Uncool(expired); err != nil {
		return err
	}

	// The kernel: every recorded pod wired, nothing vpcni made left over.
	for _, r := range records {
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

// repair makes one recorded attachment whole again. A pod whose namespace
// is gone has been deleted while the agent was away: its DEL is done now.
func (a *Agent) repair(r *store.Record) {
	att := attachmentOf(r)
	if _, err := os.Stat(r.Netns); errors.Is(err, os.ErrNotExist) {
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

// Run keeps the pool topped up and cooled addresses returned until ctx ends.
func (a *Agent) Run(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	a.topUp(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.kick:
		}
		a.mu.Lock()
		cooled := a.pool.Promote(time.Now())
		a.mu.Unlock()
		if err := a.store.Uncool(cooled); err != nil {
			a.log.Warn("forget cooled addresses", "err", err)
		}
		a.topUp(ctx)
	}
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
	got, err := a.prov.Assign(ctx, provider.AssignRequest{Count: n})
	a.mu.Lock()
	defer a.mu.Unlock()
	if aerr := a.pool.AddFree(got...); aerr != nil {
		a.log.Error("provider returned addresses the pool already has", "err", aerr)
		return 0, aerr
	}
	a.providerErr = err
	return len(got), err
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
