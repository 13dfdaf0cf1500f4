package leaks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector is vpcni-controller's (the leader's) leak collector. Every
// Period a pass audits the cloud and the cluster:
//
//   - what is held here and not yet claimed is claimed (tagged as this
//     cluster's), so it can be released should it be orphaned later;
//   - a claimed orphan is marked when first seen, and released only when
//     it is still orphaned Grace after its mark, in a second audit read
//     afresh (the cloud, then the cluster from etcd) right before the
//     releases: what was claimed by then — a slow agent's PodAddress, a
//     re-registered Node — is kept, and its mark dropped.
//
// Marks live in memory: a new leader starts its graces afresh, which only
// ever delays a release.
type Collector struct {
	Cloud   Cloud
	Cluster func(context.Context) (*Cluster, error)
	Grace   time.Duration
	Period  time.Duration
	Log     *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Tell, if set, hears what an operator must act on, as an Event's
	// reason and message: unclaimed holdings found (more than last told),
	// and passes that fail (the first of a run of failures).
	Tell func(reason, message string)

	mu       sync.Mutex
	since    map[string]time.Time // orphan key -> when first seen orphaned
	last     []Finding
	released map[Kind]int64
	claimed  int64
	failed   int64 // passes that could not read the cloud or the cluster
	passes   int64
	// lastPass is how long the last pass that got through took.
	lastPass time.Duration
	// toldUnclaimed: the unclaimed count last told; failing: the last
	// pass failed (told once).
	toldUnclaimed int
	failing       bool
}

// Event reasons the collector tells.
const (
	EventUnclaimed  = "VpcniLeaksUnclaimed"
	EventPassFailed = "VpcniLeakPassFailed"
)

func (c *Collector) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Pass runs one round: audit, claim, mark, and release what is due. It
// returns the findings as they stand after it; an error only when the
// cloud or the cluster could not be read (a failed release is in its
// finding's Error, logged, and tried again next pass).
func (c *Collector) Pass(ctx context.Context) ([]Finding, error) {
	fs, err := c.pass(ctx)
	c.tell(fs, err)
	return fs, err
}

func (c *Collector) pass(ctx context.Context) ([]Finding, error) {
	start := time.Now()
	fs, err := Audit(ctx, c.Cloud, c.Cluster)
	if err != nil {
		c.count(false)
		return nil, err
	}
	c.claim(ctx, fs)
	due := c.mark(fs)
	if len(due) > 0 {
		// The second look: releases act on what is true now, not on
		// what was true when the pass began.
		fresh, err := Audit(ctx, c.Cloud, c.Cluster)
		if err != nil {
			c.count(false)
			return nil, err
		}
		c.mark(fresh) // drops the marks of what was claimed meanwhile
		fs = fresh
		c.release(ctx, fs, due)
	}
	c.mu.Lock()
	c.last = fs
	c.lastPass = time.Since(start)
	c.mu.Unlock()
	c.count(true)
	return fs, nil
}

func (c *Collector) count(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.passes++
	if !ok {
		c.failed++
	}
}

// tell says what changed for an operator: a run of failing passes
// starting, or more unclaimed holdings than last told.
func (c *Collector) tell(fs []Finding, err error) {
	if c.Tell == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if !c.failing {
			c.Tell(EventPassFailed, "the leak collector cannot compare the cloud with the cluster (nothing is judged or released until it can): "+err.Error())
		}
		c.failing = true
		return
	}
	c.failing = false
	unclaimed := 0
	for _, f := range fs {
		if f.Verdict == Unclaimed {
			unclaimed++
		}
	}
	if unclaimed > c.toldUnclaimed {
		c.Tell(EventUnclaimed, fmt.Sprintf("%d holdings in the cloud look like vpcni's but were never seen held by this cluster, so they are never released (another cluster's, or leaks older than the collector): vpcnictl audit lists them; tag those that are this cluster's %s", unclaimed, claimHint))
	}
	c.toldUnclaimed = unclaimed
}

// claim tags what is held here and not yet tagged.
func (c *Collector) claim(ctx context.Context, fs []Finding) {
	for i := range fs {
		f := &fs[i]
		if f.Verdict != Held || f.Claimed || !f.Kind.Collected() || f.Unreadable != "" {
			continue
		}
		if err := c.Cloud.Claim(ctx, f.Holding); err != nil {
			c.Log.Warn("claiming a holding as this cluster's failed: tried again next pass", "kind", f.Kind, "resource", f.Resource, "err", err)
			continue
		}
		f.Claimed = true
		c.mu.Lock()
		c.claimed++
		c.mu.Unlock()
	}
}

// mark records when each orphan was first seen, drops the marks of what
// is no longer orphaned (its grace starts again if it is orphaned again),
// annotates the findings and returns the keys due for release.
func (c *Collector) mark(fs []Finding) map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since == nil {
		c.since = map[string]time.Time{}
		c.released = map[Kind]int64{}
	}
	now := c.now()
	orphans := map[string]bool{}
	due := map[string]bool{}
	for i := range fs {
		f := &fs[i]
		if f.Verdict != Orphan || !f.Kind.Collected() {
			continue
		}
		k := f.Key()
		orphans[k] = true
		since, ok := c.since[k]
		if !ok {
			since = now
			c.since[k] = since
			c.Log.Info("orphan marked: released if still orphaned after the grace", "kind", f.Kind, "address", f.Address,
				"resource", f.Resource, "reason", f.Reason, "grace", c.Grace)
		}
		at := since.Add(c.Grace)
		f.OrphanSince, f.ReleaseAt = &since, &at
		if !now.Before(at) {
			due[k] = true
		}
	}
	for k := range c.since {
		if !orphans[k] {
			delete(c.since, k)
		}
	}
	return due
}

// release gives back the due orphans of fs. Floating IPs go first: one
// pointing at an orphaned address is detached before the address leaves
// its port (the provider refuses the other order), so both go in one pass.
func (c *Collector) release(ctx context.Context, fs []Finding, due map[string]bool) {
	var order []int
	for i, f := range fs {
		if f.Verdict == Orphan && due[f.Key()] {
			order = append(order, i)
		}
	}
	rank := func(i int) int {
		if fs[i].Kind == FloatingIP {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rank(a), rank(b)) })
	for _, i := range order {
		f := &fs[i]
		if err := c.Cloud.Release(ctx, f.Holding); err != nil {
			f.Error = err.Error()
			c.Log.Warn("releasing an orphan failed: tried again next pass", "kind", f.Kind, "address", f.Address, "resource", f.Resource, "err", err)
			continue
		}
		f.Released = true
		c.mu.Lock()
		delete(c.since, f.Key())
		c.released[f.Kind]++
		c.mu.Unlock()
		c.Log.Info("orphan released", "kind", f.Kind, "address", f.Address, "resource", f.Resource,
			"reason", f.Reason, "orphan_for", c.now().Sub(*f.OrphanSince).Round(time.Second))
	}
}

// Run passes every Period until ctx ends. A pass that cannot read the
// cloud or the cluster is logged and counted, never fatal: the cloud may
// be down for a while.
func (c *Collector) Run(ctx context.Context) error {
	if c.Period <= 0 || c.Grace <= 0 {
		return errors.New("leak collector: period and grace must be positive (a grace of zero would release on first sight)")
	}
	c.Log.Info("collecting leaks", "period", c.Period, "grace", c.Grace)
	t := time.NewTicker(c.Period)
	defer t.Stop()
	for {
		if _, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.Log.Warn("leak pass: nothing judged, tried again next period", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Last is the last pass's findings.
func (c *Collector) Last() []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

var (
	heldDesc     = prometheus.NewDesc("vpcni_leak_holdings", "What the cloud holds for vpcni at the last leak pass, by kind and verdict (held|orphan|unclaimed).", []string{"kind", "verdict"}, nil)
	releasedDesc = prometheus.NewDesc("vpcni_leak_released_total", "Orphans the leak collector released, by kind.", []string{"kind"}, nil)
	claimedDesc  = prometheus.NewDesc("vpcni_leak_claimed_total", "Held resources the leak collector tagged as this cluster's.", nil, nil)
	passesDesc   = prometheus.NewDesc("vpcni_leak_passes_total", "Leak passes, by result (ok|failed: the cloud or the cluster could not be read).", []string{"result"}, nil)
	passDesc     = prometheus.NewDesc("vpcni_leak_pass_seconds", "How long the last leak pass that got through took: the cloud and the cluster read (twice when orphans were due), judged, claims and releases written.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- heldDesc
	ch <- releasedDesc
	ch <- claimedDesc
	ch <- passesDesc
	ch <- passDesc
}

// Collect implements prometheus.Collector: every kind is reported, zero
// included, so a dashboard sees the series before the first leak.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	verdicts := []Verdict{Held, Orphan, Unclaimed}
	count := map[Kind]map[Verdict]int{}
	for _, k := range Kinds {
		count[k] = map[Verdict]int{}
	}
	for _, f := range c.last {
		if !f.Released && count[f.Kind] != nil {
			count[f.Kind][f.Verdict]++
		}
	}
	for _, k := range Kinds {
		for _, v := range verdicts {
			ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(count[k][v]), string(k), string(v))
		}
		ch <- prometheus.MustNewConstMetric(releasedDesc, prometheus.CounterValue, float64(c.released[k]), string(k))
	}
	ch <- prometheus.MustNewConstMetric(claimedDesc, prometheus.CounterValue, float64(c.claimed))
	ch <- prometheus.MustNewConstMetric(passesDesc, prometheus.CounterValue, float64(c.passes-c.failed), "ok")
	ch <- prometheus.MustNewConstMetric(passesDesc, prometheus.CounterValue, float64(c.failed), "failed")
	ch <- prometheus.MustNewConstMetric(passDesc, prometheus.GaugeValue, c.lastPass.Seconds())
}
