package leaks

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector is vpcni-controller's (the leader's) leak collector: every
// Period a pass audits the cloud and the cluster; an orphan is marked
// when first seen and released by the first pass that finds it still
// orphaned Grace after its mark. Marks live in memory: a new leader
// starts its graces afresh, which only ever delays a release.
type Collector struct {
	Cloud   Cloud
	Cluster func(context.Context) (*Cluster, error)
	Grace   time.Duration
	Period  time.Duration
	Log     *slog.Logger

	mu       sync.Mutex
	since    map[string]time.Time // orphan key -> when first seen orphaned
	last     []Finding
	released map[Kind]int64
	failed   int64 // passes that could not read the cloud or the cluster
	passes   int64
}

// Pass runs one round: audit, mark, release what is due. It returns the
// findings as they stand after it.
func (c *Collector) Pass(ctx context.Context) ([]Finding, error) {
	fs, err := Audit(ctx, c.Cloud, c.Cluster)
	c.mu.Lock()
	c.passes++
	if err != nil {
		c.failed++
		c.mu.Unlock()
		return nil, err
	}
	if c.since == nil {
		c.since = map[string]time.Time{}
		c.released = map[Kind]int64{}
	}
	now := time.Now()
	orphans := map[string]bool{}
	var due []int
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
			due = append(due, i)
		}
	}
	// A holding that is no longer an orphan (or no longer held) loses its
	// mark: if it is orphaned again, its grace starts again.
	for k := range c.since {
		if !orphans[k] {
			delete(c.since, k)
		}
	}
	c.mu.Unlock()
	// Floating IPs first: one pointing at an orphaned address is detached
	// before the address leaves its port (the provider refuses the other
	// order), so both go in one pass.
	slices.SortStableFunc(due, func(a, b int) int {
		return cmp.Compare(rankRelease(fs[a].Kind), rankRelease(fs[b].Kind))
	})
	var errs []error
	for _, i := range due {
		f := &fs[i]
		if err := c.Cloud.Release(ctx, f.Holding); err != nil {
			f.Error = err.Error()
			errs = append(errs, err)
			c.Log.Warn("releasing an orphan failed: tried again next pass", "kind", f.Kind, "address", f.Address, "resource", f.Resource, "err", err)
			continue
		}
		f.Released = true
		c.mu.Lock()
		delete(c.since, f.Key())
		c.released[f.Kind]++
		c.mu.Unlock()
		c.Log.Info("orphan released", "kind", f.Kind, "address", f.Address, "resource", f.Resource,
			"reason", f.Reason, "orphan_for", time.Since(*f.OrphanSince).Round(time.Second))
	}
	c.mu.Lock()
	c.last = fs
	c.mu.Unlock()
	return fs, errors.Join(errs...)
}

func rankRelease(k Kind) int {
	if k == FloatingIP {
		return 0
	}
	return 1
}

// Run passes every Period until ctx ends. A failed pass is logged and
// counted, never fatal: the cloud may be down for a while.
func (c *Collector) Run(ctx context.Context) error {
	if c.Period <= 0 || c.Grace < 0 {
		return errors.New("leak collector: period must be positive and grace not negative")
	}
	c.Log.Info("collecting leaks", "period", c.Period, "grace", c.Grace)
	t := time.NewTicker(c.Period)
	defer t.Stop()
	for {
		if _, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.Log.Warn("leak pass", "err", err)
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
	heldDesc     = prometheus.NewDesc("vpcni_leak_holdings", "What the cloud holds for vpcni at the last leak pass, by kind and verdict (held|orphan).", []string{"kind", "verdict"}, nil)
	releasedDesc = prometheus.NewDesc("vpcni_leak_released_total", "Orphans the leak collector released, by kind.", []string{"kind"}, nil)
	passesDesc   = prometheus.NewDesc("vpcni_leak_passes_total", "Leak passes, by result (ok|failed: the cloud or the cluster could not be read).", []string{"result"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- heldDesc
	ch <- releasedDesc
	ch <- passesDesc
}

// Collect implements prometheus.Collector: every kind is reported, zero
// included, so a dashboard sees the series before the first leak.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	count := map[Kind]map[Verdict]int{}
	for _, k := range Kinds {
		count[k] = map[Verdict]int{Held: 0, Orphan: 0}
	}
	for _, f := range c.last {
		if f.Released {
			continue
		}
		if count[f.Kind] != nil {
			count[f.Kind][f.Verdict]++
		}
	}
	for _, k := range Kinds {
		for _, v := range []Verdict{Held, Orphan} {
			ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(count[k][v]), string(k), string(v))
		}
		ch <- prometheus.MustNewConstMetric(releasedDesc, prometheus.CounterValue, float64(c.released[k]), string(k))
	}
	ch <- prometheus.MustNewConstMetric(passesDesc, prometheus.CounterValue, float64(c.passes-c.failed), "ok")
	ch <- prometheus.MustNewConstMetric(passesDesc, prometheus.CounterValue, float64(c.failed), "failed")
}
