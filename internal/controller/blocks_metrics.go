package controller

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// BlockMetrics exports the leading replica's BlockAssigner as Prometheus
// metrics; a replica that does not lead exports none of them (Set(nil)).
type BlockMetrics struct {
	cur atomic.Pointer[BlockAssigner]
}

// Set makes a the assigner whose figures are exported (nil: none).
func (m *BlockMetrics) Set(a *BlockAssigner) { m.cur.Store(a) }

var (
	descBlocks = prometheus.NewDesc("vpcni_controller_blocks", "Blocks of -block-ranges by state (assigned: a NodeBlock holds it).",
		[]string{"state"}, nil)
	descWaiting = prometheus.NewDesc("vpcni_controller_block_nodes_waiting",
		"Nodes asking for more blocks than they have (a value that stays above 0: the ranges are full, see the VpcniNoFreeBlock events).", nil, nil)
	descCreated   = prometheus.NewDesc("vpcni_controller_blocks_assigned_total", "NodeBlocks created by this replica.", nil, nil)
	descReclaimed = prometheus.NewDesc("vpcni_controller_blocks_reclaimed_total", "NodeBlocks of gone nodes deleted by this replica.", nil, nil)
	descConflicts = prometheus.NewDesc("vpcni_controller_block_conflicts_total",
		"Writes the API server refused because another writer got there first (AlreadyExists, Conflict).", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *BlockMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBlocks, descWaiting, descCreated, descReclaimed, descConflicts} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *BlockMetrics) Collect(ch chan<- prometheus.Metric) {
	a := m.cur.Load()
	if a == nil {
		return
	}
	f := a.Figures()
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(f.Assigned), "assigned")
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(f.Free), "free")
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(f.NodesWaiting))
	ch <- prometheus.MustNewConstMetric(descCreated, prometheus.CounterValue, float64(f.Created))
	ch <- prometheus.MustNewConstMetric(descReclaimed, prometheus.CounterValue, float64(f.Reclaimed))
	ch <- prometheus.MustNewConstMetric(descConflicts, prometheus.CounterValue, float64(f.Conflicts))
}
