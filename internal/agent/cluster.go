package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/provider"
)

// Cluster is the orchestrator the agent reports to (Kubernetes, see
// internal/k8s/nodeside). The agent calls it after the fact and never
// waits on it: a slow or absent API server must not slow a pod's ADD.
// Without one the agent runs on its own.
type Cluster interface {
	// Changed: the attachment's allocation was made or released.
	Changed(containerID, ifName string)
	// Failed: a CNI verb (ADD or DEL) failed for a pod, for the reason
	// given.
	Failed(verb, podNamespace, podName string, err *api.Error)
	// Unhealthy: a pod's datapath check found it broken (told once each
	// time it turns unhealthy).
	Unhealthy(podNamespace, podName, problem string)
	// NodeWarning: something on the node needs a person's eye though no
	// request failed (the provider's write raced another writer's on the
	// cloud port, say); reason is a Vpcni… Event reason, message says
	// what to do. The implementation folds a storm of one reason.
	NodeWarning(reason, message string)
	// Ready is nil while the cluster side works, else why it does not.
	Ready() error
}

// SetCluster connects the agent to its orchestrator; call it before Run.
func (a *Agent) SetCluster(c Cluster) { a.cluster = c }

// Allocation returns the recorded allocation, nil if there is none.
func (a *Agent) Allocation(containerID, ifName string) (*alloc.Allocation, error) {
	return a.store.Get(containerID, ifName)
}

// Allocations lists every recorded allocation.
func (a *Agent) Allocations() ([]*alloc.Allocation, error) { return a.store.List() }

// Release frees an allocation the runtime will not delete any more (its
// pod is gone and vpcni-controller said so): the same as a DEL. created is
// the record the decision was made on: a newer record of the same
// attachment is left alone.
func (a *Agent) Release(containerID, ifName string, created time.Time, why string) error {
	unlock := a.locks.Lock(alloc.Key(containerID, ifName))
	defer unlock()
	rec, err := a.store.Get(containerID, ifName)
	if err != nil || rec == nil || !rec.Created.Equal(created) {
		return err
	}
	if err := a.release(context.Background(), rec); err != nil {
		return fmt.Errorf("release %s: %w", rec.Address, err)
	}
	a.log.Info("released the address of a pod that is gone", "container", containerID, "ifName", ifName, "address", rec.Address, "pod", rec.PodNamespace+"/"+rec.PodName, "why", why)
	a.changed(rec)
	return nil
}

// PoolFigures is the node's pool, for node annotations and the
// scheduler's view of the node.
type PoolFigures struct {
	Free, Cooling, Allocated, Capacity int
	// WarmTarget is the configured pool.warmTarget: until the pool first
	// reaches it the node is tainted not-ready.
	WarmTarget   int
	ProviderPort string
	// Connected: the provider is connected, so Capacity is its bound
	// (before, Capacity is 0: unknown).
	Connected bool
	// Ready, Degraded and Reason are the agent's state as vpcnictl status
	// shows it: not ready (why), or ready but degraded (the cloud fails).
	Ready, Degraded bool
	Reason          string
	// Networks is, per PodNetwork of the node's provider type, how many
	// addresses of it the node may hold (-1: unknown); nil when the agent
	// reads no PodNetworks.
	Networks map[string]int
}

// Pool returns the pool's figures now.
func (a *Agent) Pool() PoolFigures {
	now := time.Now()
	s := a.addrs.Status(now)
	f := PoolFigures{Free: s.Free, Cooling: s.Cooling, Allocated: s.Allocated, Capacity: s.Provider.Capacity,
		WarmTarget: a.cfg.Pool.WarmTarget, ProviderPort: s.Provider.Port, Connected: s.Provider.Name != "",
		Ready: s.Ready, Degraded: s.Degraded, Reason: s.Reason, Networks: a.networkCapacities(s.Provider)}
	// A pod takes an address of every family: the node has room for as
	// many as its tightest family, and is as ready as its least ready one.
	for _, m := range a.otherPools() {
		o := m.Status(now)
		f.Free = min(f.Free, o.Free)
		if c := o.Provider.Capacity; c > 0 && (f.Capacity == 0 || c < f.Capacity) {
			f.Capacity = c
		}
		f.Connected = f.Connected && o.Provider.Name != ""
		f.Degraded = f.Degraded || o.Degraded
	}
	f.Ready, f.Reason = a.poolsReady(now)
	return f
}

// networkCapacities is how many addresses of each PodNetwork of the
// node's provider type the node may hold (-1: unknown): a served network's
// own bound (its provider's capacity); before that what the provider says
// the network could get here (Registration.NetworkRoom, from the default
// provider's def, whose free NIC slots are the smallest count of any
// pool's provider); 0 where the datapath cannot wire the network's pods.
// nil without PodNetworks.
func (a *Agent) networkCapacities(def provider.Info) map[string]int {
	if a.podNets == nil {
		return nil
	}
	reg, err := provider.Lookup(a.cfg.Provider.Type)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	pools := a.netPools()
	if reg.NetworkNICs {
		// Each provider counts the VM's free NIC slots at its own reads,
		// and a network's just after it took one: the smallest count is
		// the latest (a slot given back shows at the next resync).
		for _, m := range pools {
			if i := m.Provider(); i.Name != "" && i.FreeNICs >= 0 && (def.FreeNICs < 0 || i.FreeNICs < def.FreeNICs) {
				def.FreeNICs = i.FreeNICs
			}
		}
	}
	for _, name := range a.podNets.Names(a.cfg.Provider.Type) {
		out[name] = a.networkRoom(reg, def, name, pools[name])
	}
	return out
}

// networkRoom is one PodNetwork's figure for networkCapacities; m is its
// pool, nil when the node does not serve it yet.
func (a *Agent) networkRoom(reg provider.Registration, def provider.Info, name string, m *addresses.Manager) int {
	switch {
	case reg.Network == nil:
		return 0
	case reg.NetworkNICs && !a.dp.Info().NICRoutes:
		return 0
	}
	if m != nil {
		if info := m.Provider(); info.Name != "" {
			return info.Capacity
		}
	}
	if reg.NetworkRoom == nil {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	spec, err := a.podNets.Spec(ctx, name, a.cfg.Provider.Type)
	if err != nil {
		return -1
	}
	if room, ok := reg.NetworkRoom(a.cfg.Provider.Settings, spec, def); ok {
		return room
	}
	return -1
}

// ProviderPort is the cloud port the node's pod addresses live on ("" for
// providers without one, or before the provider connected).
func (a *Agent) ProviderPort() string { return a.addrs.Provider().Port }

func (a *Agent) changed(rec *alloc.Allocation) {
	if a.cluster != nil && rec.PodName != "" {
		a.cluster.Changed(rec.ContainerID, rec.IfName)
	}
}

// providerNotice reports what the provider found that needs a person's
// eye (provider.Node.Notify): a log line with its figures, a metric, and
// a Warning Event on the node.
func (a *Agent) providerNotice(n provider.Notice) {
	a.metrics.Notice(n)
	a.log.Warn(n.Message, append([]any{"reason", n.Reason, "kind", n.Kind}, n.Attrs...)...)
	if a.cluster != nil {
		a.cluster.NodeWarning(n.Reason, n.Message)
	}
}

func (a *Agent) failed(verb string, req *api.CNIRequest, aerr *api.Error) {
	if a.cluster == nil || aerr == nil || req == nil {
		return
	}
	if ns, name, _ := k8sPod(req.Args); name != "" {
		a.cluster.Failed(verb, ns, name, aerr)
	}
}
