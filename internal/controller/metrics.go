package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcni/vpcni/internal/leaks"
)

// Collectors is what vpcni-controller serves on /metrics: the
// webhook's timing (every replica's), the leader's blocks and routes and,
// when it runs (non-nil), the leak collector. One list, so the dashboard's test checks its queries against
// what the binary registers.
func Collectors(blocks *BlockMetrics, routes *RouteMetrics, leakGC *leaks.Collector) []prometheus.Collector {
	cs := []prometheus.Collector{webhookSeconds, blocks, routes}
	if leakGC != nil {
		cs = append(cs, leakGC)
	}
	return cs
}
