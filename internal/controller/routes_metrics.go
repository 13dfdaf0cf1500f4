package controller

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcni/vpcni/internal/routes"
)

// RouteMetrics exports the leading replica's RouteReconciler; a replica
// that does not lead exports none of it (Set(nil)).
type RouteMetrics struct {
	cur atomic.Pointer[RouteReconciler]
}

// Set makes r the reconciler whose figures are exported (nil: none).
func (m *RouteMetrics) Set(r *RouteReconciler) { m.cur.Store(r) }

var (
	descRouteBlocks = prometheus.NewDesc("vpcni_controller_route_blocks",
		"NodeBlocks by routing state: Routed, RouteBudgetExhausted, AddressPairsExhausted, NodeAddressUnknown, NodeGone.", []string{"state"}, nil)
	descRouterRoutes = prometheus.NewDesc("vpcni_controller_router_routes", "Extra routes on the router: vpcni's and others'.", []string{"owner"}, nil)
	descMaxRoutes    = prometheus.NewDesc("vpcni_controller_router_max_routes",
		"The router's max_routes as vpcni-controller knows it (configured, or learned from Neutron's RoutesExhausted); absent while unknown.", nil, nil)
	descShortfall = prometheus.NewDesc("vpcni_controller_route_shortfall",
		"Blocks waiting for room on the router (above 0: see the fix label and the VpcniRouteBudgetExhausted events).", []string{"fix"}, nil)
	descNeeded = prometheus.NewDesc("vpcni_controller_route_max_routes_needed",
		"The max_routes with which every block's route fits (0: they fit now).", nil, nil)
	descRouteSyncs = prometheus.NewDesc("vpcni_controller_route_syncs_total", "Passes over the router and the VM ports that got through.", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *RouteMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRouteBlocks, descRouterRoutes, descMaxRoutes, descShortfall, descNeeded, descRouteSyncs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *RouteMetrics) Collect(ch chan<- prometheus.Metric) {
	r := m.cur.Load()
	if r == nil {
		return
	}
	res, syncs := r.Last()
	ch <- prometheus.MustNewConstMetric(descRouteSyncs, prometheus.CounterValue, float64(syncs))
	if syncs == 0 {
		return
	}
	counts := map[routes.State]int{routes.Routed: 0, routes.NoRouteBudget: 0, routes.NoPairBudget: 0, routes.NoNodeAddress: 0, routes.NodeGone: 0}
	for _, st := range res.States {
		counts[st]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(descRouteBlocks, prometheus.GaugeValue, float64(n), string(st))
	}
	ch <- prometheus.MustNewConstMetric(descRouterRoutes, prometheus.GaugeValue, float64(res.Routes), "vpcni")
	ch <- prometheus.MustNewConstMetric(descRouterRoutes, prometheus.GaugeValue, float64(res.Others), "others")
	if res.Limit > 0 {
		ch <- prometheus.MustNewConstMetric(descMaxRoutes, prometheus.GaugeValue, float64(res.Limit))
	}
	ch <- prometheus.MustNewConstMetric(descShortfall, prometheus.GaugeValue, float64(res.Waiting), res.Fix)
	ch <- prometheus.MustNewConstMetric(descNeeded, prometheus.GaugeValue, float64(res.Needed))
}
