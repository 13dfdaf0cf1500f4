// Package agent is vpcnid, the node agent: it answers the CNI plugin over a
// unix socket, records every allocation, and joins the parts that do the
// work — the address manager (pool and provider), the datapath mode
// (picked by name from the config) and the cluster side. It names no mode
// and no provider.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/kwatch"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/metrics"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/snat"
	"github.com/vpcni/vpcni/internal/store"
)

// Agent is one node's vpcnid.
type Agent struct {
	cfg   config.Config
	log   *slog.Logger
	store *store.Store
	addrs *addresses.Manager // the default network's pool of the first family
	// fams are the default network's pools by family, addrs among them
	// (families.go).
	fams         map[family.Family]*addresses.Manager
	dp           datapath.Datapath
	started      time.Time
	metrics      *metrics.Metrics
	cluster      Cluster      // nil: no orchestrator
	reservations Reservations // nil: only runtime requests pick an address
	podNets      PodNetworks  // nil: every pod on the node's default network
	nets         netPools     // the pools of the PodNetworks served (networks.go)
	snat         *snat.NAT    // nil: SNAT off

	locks keyedMutex // one ADD/DEL/CHECK at a time per attachment
	// wiring is held shared by every change to the datapath together with
	// its record (ADD, DEL, GC, re-wiring) and exclusively by the node
	// reconcile, so that the store it reads and the kernel it compares
	// agree: a link whose record is still being written is never taken for
	// an orphan. (Marking a record ready, or moving it to a new namespace
	// before its re-wiring, changes no link; those run outside it.)
	wiring sync.RWMutex

	reconcileKick chan struct{}
	kickMu        sync.Mutex
	kickWhy       string // what asked for the next reconcile first
	// restoredKeys are the allocations recorded at start, for Run to check
	// inside their pods; restored is closed once it has.
	restoredKeys []string
	restored     chan struct{}

	health health
}

// New opens the store, the datapath mode and the address manager, puts
// every recorded allocation back into the pool, and brings the node side
// of the datapath in line with the records in one pass. It does not wait
// for the provider or enter pod namespaces: Run does that in the
// background, so the socket serves within a second of start even with
// hundreds of pods (no address is handed out twice meanwhile: the pool
// knows every recorded one before New returns).
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (_ *Agent, err error) {
	st, err := store.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	mode, err := datapath.Lookup(cfg.Datapath.Mode)
	if err != nil {
		return nil, err
	}
	if preg, err := provider.Lookup(cfg.Provider.Type); err != nil {
		return nil, err
	} else if err := checkFamilies(cfg.Families(), cfg.Provider.Type, preg, cfg.Datapath.Mode, mode); err != nil {
		return nil, err
	}
	node := datapath.Node{Uplink: cfg.Uplink, MTU: cfg.MTU, Families: cfg.Families(), Log: log}
	clearOtherModes(node, cfg.Datapath.Mode, log)
	dp, err := mode.New(node, cfg.Datapath.Settings)
	if err != nil {
		return nil, fmt.Errorf("datapath %s: %w", cfg.Datapath.Mode, err)
	}
	defer func() {
		if err != nil {
			dp.Close()
		}
	}()
	nat, err := openSNAT(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a, err := newAgent(ctx, cfg, log, st, dp)
	if err != nil {
		return nil, err
	}
	if a.snat = nat; nat != nil {
		// Before the socket serves: restored pods go out as the node at once.
		// (Writing the table at start is no repair.)
		_ = a.syncSNAT(ctx, a.records())
	}
	return a, nil
}

// newAgent joins the parts; tests give it a fake datapath.
func newAgent(ctx context.Context, cfg config.Config, log *slog.Logger, st *store.Store, dp datapath.Datapath) (*Agent, error) {
	a := &Agent{cfg: cfg, log: log, store: st, dp: dp, started: time.Now(), metrics: metrics.New(),
		reconcileKick: make(chan struct{}, 1), restored: make(chan struct{})}
	prov, err := provider.Lookup(cfg.Provider.Type)
	if err != nil {
		return nil, err
	}
	shared := &sharedProvider{connect: func(ctx context.Context) (provider.Provider, error) {
		p, err := prov.New(ctx, a.providerNode(), cfg.Provider.Settings)
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", cfg.Provider.Type, err)
		}
		return a.metrics.Instrument(p), nil
	}}
	fams := cfg.Families()
	a.fams = map[family.Family]*addresses.Manager{}
	for _, f := range fams {
		mlog := log
		if len(fams) > 1 {
			mlog = log.With("family", f.String())
		}
		m := addresses.New(a.policy(), cfg.NodeName, shared.family(f), st, mlog)
		// After each sync with the provider the idle addresses are known:
		// anything the node still has wired for them goes.
		m.Synced = func() { a.kick("sync") }
		// What the manager reports (an address set aside: its wiring
		// keeps failing) is logged there and told to the cluster as a
		// node warning.
		m.Report = func(reason, message string) {
			if a.cluster != nil {
				a.cluster.NodeWarning(reason, message)
			}
		}
		a.fams[f] = m
	}
	a.addrs = a.fams[fams[0]]
	a.metrics.Watch(a.snapshot)
	if err := a.restore(ctx); err != nil {
		return nil, fmt.Errorf("restore at start: %w", err)
	}
	return a, nil
}

// providerNode is what the provider is told of the node.
func (a *Agent) providerNode() provider.Node {
	info := a.dp.Info()
	link := info.Uplink
	if info.NodeLink != "" {
		link = info.NodeLink
	}
	return provider.Node{Name: a.cfg.NodeName, IP: info.NodeIP, PodMACs: info.OwnMACs, StateDir: a.cfg.StateDir,
		Kubeconfig: a.cfg.Kubernetes.Kubeconfig, Kubernetes: a.cfg.Kubernetes.Enabled(), Uplink: link,
		Families: a.cfg.Families(), Log: a.log, Notify: a.providerNotice}
}

// policy is every pool's policy, the default network's and each
// PodNetwork's alike.
func (a *Agent) policy() addresses.Policy {
	p := a.cfg.Pool
	return addresses.Policy{
		WarmTarget: p.WarmTarget, BatchSize: p.BatchSize, MaxFree: p.MaxFree, MinHeld: p.MinHeld,
		SurplusGrace: p.SurplusGrace.Duration, AddWait: p.AddWait.Duration,
		Cooldown: a.cfg.Cooldown.Duration, Resync: a.cfg.Resync.Duration,
	}
}

// fastPather is a datapath mode with a kernel fast path beside its plain
// one (mode ebpf): whether it runs, and what it did.
type fastPather interface{ FastPath() datapath.FastPath }

// Metrics is the agent's instrumentation.
func (a *Agent) Metrics() *metrics.Metrics { return a.metrics }

func (a *Agent) snapshot() metrics.Snapshot {
	s := a.addrs.Status(time.Now())
	snap := metrics.Snapshot{Free: s.Free, Cooling: s.Cooling, Allocated: s.Allocated, Aside: s.Aside, Leaving: s.Leaving,
		Capacity: s.Provider.Capacity, Degraded: s.Degraded, Mode: a.dp.Info().Mode}
	if f, ok := a.dp.(fastPather); ok {
		fp := f.FastPath()
		snap.FastPath = &fp
	}
	snap.Families = map[string]metrics.NetworkPool{}
	for f, m := range a.fams {
		fs := m.Status(time.Now())
		snap.Families[f.String()] = metrics.NetworkPool{Free: fs.Free, Cooling: fs.Cooling, Allocated: fs.Allocated, Capacity: fs.Provider.Capacity}
	}
	for name, m := range a.netPools() {
		ns := m.Status(time.Now())
		if snap.PodNetworks == nil {
			snap.PodNetworks = map[string]metrics.NetworkPool{}
		}
		snap.PodNetworks[name] = metrics.NetworkPool{Free: ns.Free, Cooling: ns.Cooling, Allocated: ns.Allocated, Capacity: ns.Provider.Capacity}
	}
	return snap
}

// Close releases the datapath's and the store's resources. Pods keep
// running: an agent restart never touches their datapath. Call it after
// Run has returned.
func (a *Agent) Close() error { return errors.Join(a.dp.Close(), a.store.Close()) }

// restore puts the store's allocations and cooling addresses into the pool
// and reconciles the node side once; Run then checks each recorded
// allocation inside its pod.
func (a *Agent) restore(ctx context.Context) error {
	records, err := a.store.List()
	if err != nil {
		return err
	}
	cooling, err := a.store.CoolingByNetwork()
	if err != nil {
		return err
	}
	leaving, err := a.store.LeavingByNetwork()
	if err != nil {
		return err
	}
	// Each record, cooling and leaving address goes back to its network's
	// pool: the default's, or its PodNetwork's (made now, connected by
	// Run). The networks whose pools held addresses when the agent
	// stopped get theirs too, with no pod left.
	byNet := map[string][]*alloc.Allocation{}
	for _, r := range records {
		byNet[r.PodNetwork] = append(byNet[r.PodNetwork], r)
	}
	for _, names := range [][]string{slices.Collect(maps.Keys(cooling)), slices.Collect(maps.Keys(leaving)), a.savedNetworks()} {
		for _, name := range names {
			if _, ok := byNet[name]; !ok {
				byNet[name] = nil
			}
		}
	}
	conflicts, err := a.restoreFamilies(byNet[""], cooling[""], leaving[""])
	if err != nil {
		return err
	}
	for name, recs := range byNet {
		if name == "" {
			continue
		}
		a.nets.mu.Lock()
		m := a.netPoolLocked(name)
		if a.nets.restored == nil {
			a.nets.restored = map[string]bool{}
		}
		a.nets.restored[name] = true
		a.nets.mu.Unlock()
		more, err := m.Restore(recs, cooling[name], leaving[name], time.Now())
		if err != nil {
			return err
		}
		conflicts = append(conflicts, more...)
	}
	for _, c := range conflicts {
		// Never wired nor released: either would touch the other
		// record's pod. Its DEL (or GC, or the controller's release)
		// drops the record alone (release: heldByAnother). vpcnictl
		// status lists both records for an operator to resolve.
		a.log.Error("allocation record conflicts with another for its address; keeping the first, leaving this one alone",
			"container", c.ContainerID, "ifName", c.IfName, "address", c.Address)
	}
	for _, r := range records {
		a.restoredKeys = append(a.restoredKeys, r.Key())
	}
	// What the node side cannot repair alone is re-wired by Run's check of
	// every pending pod.
	_, err = a.reconcileNode(ctx, "start")
	return err
}

// Run serves the background work until ctx ends, and returns only when all
// of it has stopped: the address manager (provider, pool policy), the
// check of every pod recorded at start, the self-healing node reconcile
// and the pods' health probes.
func (a *Agent) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, m := range a.fams {
		wg.Go(func() { m.Run(ctx) })
	}
	wg.Go(func() { a.runNetworks(ctx) })
	wg.Go(func() { a.checkRestored(ctx) })
	wg.Go(func() { a.selfHeal(ctx) })
	wg.Go(func() { a.healthLoop(ctx) })
	wg.Wait()
}

// selfHeal reconciles the node's datapath whenever something asks — the
// kernel watch (a piece of vpcni's changed), a sync with the provider (the
// idle addresses are known) — and every selfHeal.period in any case, but
// never more often than selfHeal.minInterval: a burst of changes (a
// node's pods deleted at once) costs one more pass, not one per change.
// The first change after a quiet spell is repaired at once.
func (a *Agent) selfHeal(ctx context.Context) {
	sh := a.cfg.SelfHeal
	if sh.Watching() {
		if err := kwatch.Watch(ctx, a.dp.Info().Uplink, a.kick); err != nil {
			a.log.Error("kernel watch (partly) failed to start; what it does not watch waits for the periodic reconcile", "period", sh.Period.Duration, "err", err)
		}
	}
	tick := time.NewTicker(sh.Period.Duration)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.reconcileKick:
		case <-tick.C:
		}
		if wait := sh.MinInterval.Duration - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		broken, err := a.reconcileNode(ctx, a.takeKick("timer"))
		if err != nil {
			a.log.Warn("node reconcile failed; the next one retries", "err", err)
		}
		for _, key := range broken {
			if ctx.Err() != nil {
				return
			}
			a.repairKey(ctx, key)
		}
	}
}

// kick asks for a node reconcile, for the reason given (kept for the log
// and the metrics until the reconcile runs: the first reason wins).
func (a *Agent) kick(why string) {
	a.kickMu.Lock()
	if a.kickWhy == "" {
		a.kickWhy = why
	}
	a.kickMu.Unlock()
	select {
	case a.reconcileKick <- struct{}{}:
	default:
	}
}

// takeKick returns what asked for this reconcile (otherwise, the
// default: the timer) and clears it. The kick channel is drained too: a
// kick that came while this pass was waiting is this pass's.
func (a *Agent) takeKick(otherwise string) string {
	select {
	case <-a.reconcileKick:
	default:
	}
	a.kickMu.Lock()
	defer a.kickMu.Unlock()
	why := a.kickWhy
	a.kickWhy = ""
	if why == "" {
		return otherwise
	}
	return why
}

// trigger is the metric label for a reconcile's reason.
func trigger(why string) string {
	switch why {
	case "start", "sync", "timer", "snat", "conflict":
		return why
	}
	return "watch"
}

// reconcileNode brings the datapath's node side in line with the store:
// every recorded allocation's node-side pieces there, nothing of vpcni's
// left for anything else. It returns the keys of allocations the node
// side cannot repair alone, for re-wiring from inside their pods.
// Conflicting records are left as they are.
func (a *Agent) reconcileNode(ctx context.Context, why string) (broken []string, err error) {
	a.wiring.Lock()
	records, err := a.store.List()
	if err != nil {
		a.wiring.Unlock()
		return nil, err
	}
	want := datapath.Desired{Idle: a.idle()}
	for _, r := range records {
		if a.owns(r) {
			want.Allocations = append(want.Allocations, r)
		} else {
			want.Leave = append(want.Leave, r)
		}
	}
	start := time.Now()
	rep, err := a.dp.Reconcile(ctx, want)
	// Under the same lock: an ADD puts its pod into the SNAT set while it
	// holds the lock shared, and a Sync from records read before that ADD
	// would drop the pod from the set again.
	if fixed := a.syncSNAT(ctx, records); fixed != "" {
		rep.AddRepair(datapath.RepairNAT, "%s", fixed)
	}
	a.wiring.Unlock()
	a.metrics.Reconciles.WithLabelValues(trigger(why)).Inc()
	for _, r := range rep.Repaired {
		a.metrics.Repairs.WithLabelValues(string(r.Kind)).Inc()
		a.log.Warn("datapath repaired", "kind", r.Kind, "missing", r.What, "noticed", why)
	}
	for _, s := range rep.Removed {
		a.log.Info("removed stale datapath state", "what", s)
	}
	for _, s := range rep.Failed {
		a.log.Warn("could not repair or remove; the next reconcile tries again", "what", s)
	}
	a.log.Debug("node reconciled", "why", why, "allocations", len(want.Allocations), "idle", len(want.Idle), "ms", msBetween(start, time.Now()))
	if len(rep.Broken) > 0 {
		a.log.Info("allocations to re-wire from inside their pods", "count", len(rep.Broken))
	}
	return rep.Broken, err
}

// checkRestored checks, after the socket already serves, every pod
// recorded at start: its wiring inside the pod, re-wired if broken; its
// DEL done if its namespace is gone.
func (a *Agent) checkRestored(ctx context.Context) {
	defer close(a.restored)
	start := time.Now()
	for _, key := range a.restoredKeys {
		if ctx.Err() != nil {
			return
		}
		a.repairKey(ctx, key)
	}
	if len(a.restoredKeys) > 0 {
		a.log.Info("checked every pod recorded at start", "pods", len(a.restoredKeys), "ms", msBetween(start, time.Now()))
	}
}

// repairKey makes one recorded attachment whole again. A pod whose
// namespace is gone was deleted while the agent was away: its DEL is done
// now.
func (a *Agent) repairKey(ctx context.Context, key string) {
	cid, ifName, _ := strings.Cut(key, "/") // container IDs hold no '/'
	unlock := a.locks.Lock(key)
	defer unlock()
	r, err := a.store.Get(cid, ifName)
	if err != nil || r == nil || !a.owns(r) {
		return // gone meanwhile (a DEL), or a conflicting record: left alone
	}
	if _, err := os.Stat(r.Netns); errors.Is(err, os.ErrNotExist) {
		// An empty or missing namespace directory is more likely a mount
		// the agent does not see (a DaemonSet without the runtime's netns
		// dir) than every pod gone: keep the record and say so.
		if entries, derr := os.ReadDir(filepath.Dir(r.Netns)); derr != nil || len(entries) == 0 {
			a.log.Error("pod namespace not found, and its directory is empty or missing: is the runtime's netns directory mounted? keeping the pod", "container", r.ContainerID, "netns", r.Netns, "address", r.Address)
			return
		}
		a.log.Info("pod namespace gone while the agent was down; releasing", "container", r.ContainerID, "address", r.Address)
		if err := a.release(ctx, r); err != nil {
			a.log.Error("release of a gone pod failed", "container", r.ContainerID, "err", err)
			return
		}
		a.changed(r)
		return
	}
	if _, err := a.ensureWired(ctx, r); err != nil {
		a.log.Error("re-wiring pod failed", "container", r.ContainerID, "err", err)
	}
}

// ensureWired checks an attachment and re-wires it when it is broken; the
// record learns its wiring (records from before wirings were kept, or an
// ADD cut short before marking it ready). The caller holds the
// attachment's lock.
func (a *Agent) ensureWired(ctx context.Context, r *alloc.Allocation) (alloc.Wiring, error) {
	a.wiring.RLock()
	defer a.wiring.RUnlock()
	w, problem := a.dp.Check(ctx, r)
	if problem != nil {
		if terr := a.dp.Teardown(ctx, r); terr != nil {
			a.log.Warn("teardown before re-wiring failed", "container", r.ContainerID, "err", terr)
		}
		var err error
		if w, err = a.dp.Setup(ctx, r); err != nil {
			return w, err
		}
		a.metrics.Repairs.WithLabelValues(string(datapath.RepairRewired)).Inc()
		a.log.Warn("datapath repaired", "kind", datapath.RepairRewired, "missing", problem.Error(), "pod", r.PodNamespace+"/"+r.PodName, "container", r.ContainerID, "ifName", r.IfName, "address", r.Address)
	}
	if !r.Ready || r.Wiring == nil {
		r.Wiring, r.Ready = &w, true
		if err := a.store.MarkReady(r); err != nil {
			a.log.Warn("could not mark the record ready; the next start checks it again", "container", r.ContainerID, "err", err)
		}
		a.changed(r) // the cluster side can now publish its MAC and gateway
	}
	return w, nil
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

func msBetween(a, b time.Time) float64 { return float64(b.Sub(a).Microseconds()) / 1000 }

// clearOtherModes takes off the node what another mode, run here before,
// left acting on pods (datapath.Registration.Clear). A failure is logged:
// the configured mode still starts.
func clearOtherModes(node datapath.Node, mode string, log *slog.Logger) {
	for _, name := range datapath.Names() {
		r, err := datapath.Lookup(name)
		if err != nil || r.Clear == nil || name == mode {
			continue
		}
		if err := r.Clear(node); err != nil {
			log.Warn("could not clear what datapath mode "+name+" left on the node", "err", err)
		}
	}
}
