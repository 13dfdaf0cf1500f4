// Package metrics is vpcnid's Prometheus instrumentation: pool sizes by
// state, allocations, CNI request latency, cloud calls by operation, and
// whether the agent runs degraded.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/provider"
)

// Metrics holds the agent's instruments.
type Metrics struct {
	Registry *prometheus.Registry
	Pool     *prometheus.GaugeVec
	// Capacity is the provider's bound on the addresses the node may hold,
	// so that a pool near exhaustion can be told as a ratio.
	Capacity    prometheus.Gauge
	Allocations prometheus.Gauge
	Degraded    prometheus.Gauge
	CNIDuration *prometheus.HistogramVec
	// AddPhase is a new ADD's time by part (address, wire, record).
	AddPhase     *prometheus.HistogramVec
	CloudCalls   *prometheus.CounterVec
	CloudLatency *prometheus.HistogramVec
	// Repairs counts pieces of the datapath put back, by kind (route,
	// neighbour, link, rule, nat, node, rewired).
	Repairs *prometheus.CounterVec
	// Reconciles counts node reconciles by what started them (start,
	// watch, timer, sync, snat: a pod's address not added to the SNAT set).
	Reconciles *prometheus.CounterVec
	// PodHealth is the pods' datapath health at the last probe, by
	// result (healthy, unhealthy).
	PodHealth *prometheus.GaugeVec
	// CloudWriteRaces counts the provider's writes that raced another
	// writer's on the cloud port, by kind (provider.ReasonWriteRace).
	CloudWriteRaces *prometheus.CounterVec
	// AddressesInUse counts addresses another host answered the probe
	// for (provider.ReasonAddressInUse).
	AddressesInUse prometheus.Counter

	// registered is everything on Registry, for Describe.
	registered []prometheus.Collector
}

// New registers every instrument.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Pool: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vpcni_pool_addresses", Help: "Addresses the node holds, by state (free, cooling, allocated; aside: their wiring kept failing; leaving: requested addresses on their way back to the cloud).",
		}, []string{"state"}),
		Capacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcni_pool_capacity", Help: "The most addresses the node may hold, as the provider bounds it (the cloud port's or the instance type's limit, or the node's blocks); 0 while unknown (the provider has not connected yet).",
		}),
		Allocations: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcni_allocations", Help: "Pod interfaces with an address.",
		}),
		Degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcni_degraded", Help: "1 while the cloud API fails and the agent serves from its pool only.",
		}),
		CNIDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vpcni_cni_request_duration_seconds", Help: "Time vpcnid spent on a CNI verb.",
			Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"verb", "result"}),
		// An ADD's parts, so its tail can be told apart: waiting for an
		// address (the pool, or the cloud call that refills it), wiring
		// the pod's datapath, writing the record (in parallel with the
		// wiring).
		AddPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vpcni_cni_add_phase_duration_seconds", Help: "Time of each part of a new ADD: address (taken from the pool, including any wait for a refill), wire (the datapath's setup), record (the store's write, in parallel with wire).",
			Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"phase"}),
		CloudCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcni_cloud_calls_total", Help: "Provider operations, by operation and result.",
		}, []string{"op", "result"}),
		CloudLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vpcni_cloud_call_duration_seconds", Help: "Provider operation latency.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"op"}),
	}
	m.Repairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpcni_datapath_repairs_total", Help: "Pieces of the node's datapath found missing and put back, by kind.",
	}, []string{"kind"})
	m.Reconciles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpcni_datapath_reconciles_total", Help: "Node datapath reconciles, by trigger (start, watch, timer, sync, snat, conflict).",
	}, []string{"trigger"})
	m.PodHealth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vpcni_pod_datapath", Help: "Pod interfaces by the result of their last datapath probe (healthy, unhealthy).",
	}, []string{"result"})
	m.CloudWriteRaces = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpcni_cloud_write_races_total", Help: "Writes of the provider that raced another writer's on the cloud port, by kind (overlapped: landed over another write; dropped: the answer lacked someone else's address; knocked_out: vpcni's addresses taken off, put back).",
	}, []string{"kind"})
	m.AddressesInUse = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vpcni_addresses_in_use_elsewhere_total", Help: "Addresses the provider was about to hand out that another host on the segment answered a probe for (the static provider's ARP or neighbour solicitation probe): set aside, never given to a pod.",
	})
	m.register(m.CloudWriteRaces, m.AddressesInUse, m.Repairs, m.Reconciles, m.PodHealth, m.CNIDuration, m.AddPhase, m.CloudCalls, m.CloudLatency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) register(cs ...prometheus.Collector) {
	m.Registry.MustRegister(cs...)
	m.registered = append(m.registered, cs...)
}

// Describe sends the descriptor of every metric the registry serves
// (deploy/grafana's dashboard is checked against them).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.registered {
		c.Describe(ch)
	}
}

// Snapshot is the agent's state as the gauges show it.
type Snapshot struct {
	Free, Cooling, Allocated, Aside, Leaving int
	// Capacity is the provider's bound (0: unknown).
	Capacity int
	Degraded bool
	// Mode is the datapath mode.
	Mode string
	// FastPath is the datapath's fast path (nil: the mode has none).
	FastPath *datapath.FastPath
	// PodNetworks are the pools of the PodNetworks the node serves, by
	// name (the figures above are the default network's).
	PodNetworks map[string]NetworkPool
	// Families are the default network's pools by address family
	// ("ipv4", "ipv6"); the figures above are the first family's.
	Families map[string]NetworkPool
}

// NetworkPool is one PodNetwork's pool as the gauges show it.
type NetworkPool struct {
	Free, Cooling, Allocated int
	// Capacity is the network's bound on the node (0: unknown).
	Capacity int
}

// A PodNetwork's pool, one series per network the node serves.
var (
	networkAddresses = prometheus.NewDesc("vpcni_pod_network_addresses",
		"Addresses the node holds for a PodNetwork's pods, by network and state (free, cooling, allocated).", []string{"network", "state"}, nil)
	networkCapacity = prometheus.NewDesc("vpcni_pod_network_capacity",
		"The most addresses the node may hold for a PodNetwork (its provider's bound, e.g. maxAddresses on each NIC the VM may still take; 0: unknown).", []string{"network"}, nil)
)

// The default network's pool of each address family the node's pods get
// (one series on a single-family node, two on a dual-stack one).
var (
	familyAddresses = prometheus.NewDesc("vpcni_pool_family_addresses",
		"Addresses the node holds on its default network, by address family (ipv4, ipv6) and state (free, cooling, allocated).", []string{"family", "state"}, nil)
	familyCapacity = prometheus.NewDesc("vpcni_pool_family_capacity",
		"The most addresses of one family the node may hold on its default network (0: unknown); a dual-stack pod takes one of each family, so the node's room is its tightest family's.", []string{"family"}, nil)
)

// The fast path's instruments, reported only by a mode that has one.
var (
	fastPathActive = prometheus.NewDesc("vpcni_datapath_fastpath_active",
		"1 while the datapath's eBPF fast path runs; 0 when it could not load and pods take the plain routed path (the agent's log says why).", []string{"mode"}, nil)
	fastPathPackets = prometheus.NewDesc("vpcni_datapath_fastpath_packets_total",
		"Packets the eBPF fast path handled, by action: peer_from_uplink, peer_local, neigh_out (past the node's stack), pass_nat, pass_service, pass_other (to the stack).", []string{"mode", "action"}, nil)
)

// Watch makes every scrape read the gauges from f.
func (m *Metrics) Watch(f func() Snapshot) { m.register(&watcher{f: f, m: m}) }

type watcher struct {
	f func() Snapshot
	m *Metrics
}

func (w *watcher) Describe(ch chan<- *prometheus.Desc) {
	ch <- fastPathActive
	ch <- fastPathPackets
	ch <- networkAddresses
	ch <- networkCapacity
	ch <- familyAddresses
	ch <- familyCapacity
	w.m.Pool.Describe(ch)
	w.m.Capacity.Describe(ch)
	w.m.Allocations.Describe(ch)
	w.m.Degraded.Describe(ch)
}

func (w *watcher) Collect(ch chan<- prometheus.Metric) {
	s := w.f()
	w.m.Pool.WithLabelValues("free").Set(float64(s.Free))
	w.m.Pool.WithLabelValues("cooling").Set(float64(s.Cooling))
	w.m.Pool.WithLabelValues("allocated").Set(float64(s.Allocated))
	w.m.Pool.WithLabelValues("aside").Set(float64(s.Aside))
	w.m.Pool.WithLabelValues("leaving").Set(float64(s.Leaving))
	w.m.Capacity.Set(float64(s.Capacity))
	w.m.Allocations.Set(float64(s.Allocated))
	degraded := 0.0
	if s.Degraded {
		degraded = 1
	}
	w.m.Degraded.Set(degraded)
	w.m.Pool.Collect(ch)
	w.m.Capacity.Collect(ch)
	w.m.Allocations.Collect(ch)
	w.m.Degraded.Collect(ch)
	for name, p := range s.PodNetworks {
		for state, n := range map[string]int{"free": p.Free, "cooling": p.Cooling, "allocated": p.Allocated} {
			ch <- prometheus.MustNewConstMetric(networkAddresses, prometheus.GaugeValue, float64(n), name, state)
		}
		ch <- prometheus.MustNewConstMetric(networkCapacity, prometheus.GaugeValue, float64(p.Capacity), name)
	}
	for fam, p := range s.Families {
		for state, n := range map[string]int{"free": p.Free, "cooling": p.Cooling, "allocated": p.Allocated} {
			ch <- prometheus.MustNewConstMetric(familyAddresses, prometheus.GaugeValue, float64(n), fam, state)
		}
		ch <- prometheus.MustNewConstMetric(familyCapacity, prometheus.GaugeValue, float64(p.Capacity), fam)
	}
	if fp := s.FastPath; fp != nil {
		active := 0.0
		if fp.Active {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(fastPathActive, prometheus.GaugeValue, active, s.Mode)
		for action, n := range fp.Packets {
			ch <- prometheus.MustNewConstMetric(fastPathPackets, prometheus.CounterValue, float64(n), s.Mode, action)
		}
	}
}

// Serve exposes /metrics on addr until ctx ends.
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return l.Addr(), nil
}

// Notice counts what a provider reported (provider.Node.Notify).
func (m *Metrics) Notice(n provider.Notice) {
	switch n.Reason {
	case provider.ReasonWriteRace:
		m.CloudWriteRaces.WithLabelValues(n.Kind).Inc()
	case provider.ReasonAddressInUse:
		m.AddressesInUse.Inc()
	}
}

// Instrument wraps a provider so every operation is counted and timed;
// Info passes through as it is.
func (m *Metrics) Instrument(p provider.Provider) provider.Provider { return &instrumented{p, m} }

type instrumented struct {
	provider.Provider
	m *Metrics
}

func (i *instrumented) observe(op string, start time.Time, err error) {
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, provider.ErrExhausted):
		result = "exhausted"
	case errors.Is(err, provider.ErrTaken):
		result = "taken"
	case errors.Is(err, provider.ErrUnavailable):
		result = "unavailable"
	default:
		result = "error"
	}
	i.m.CloudCalls.WithLabelValues(op, result).Inc()
	i.m.CloudLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (i *instrumented) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	start := time.Now()
	got, err := i.Provider.Assign(ctx, req)
	i.observe("assign", start, err)
	return got, err
}

func (i *instrumented) Release(ctx context.Context, addrs []netip.Addr) error {
	start := time.Now()
	err := i.Provider.Release(ctx, addrs)
	i.observe("release", start, err)
	return err
}

func (i *instrumented) Held(ctx context.Context) ([]alloc.Lease, error) {
	start := time.Now()
	got, err := i.Provider.Held(ctx)
	i.observe("held", start, err)
	return got, err
}
