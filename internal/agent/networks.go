package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/store"
)

// PodNetworks: a pod that vpcni-controller's webhook put on a PodNetwork
// (vpcni.io/network) takes its address from that network's pool, not the
// node's default one. The agent keeps one address manager per PodNetwork
// it serves, made at the first ADD that needs it (or at start, for the
// networks of recorded pods), each over the provider's Network: its own
// warm pool, cooldown and refill, so one network's burst or full subnet
// never starves another. A record names its network (Lease.PodNetwork):
// its address goes back to that network's pool, and so do its cooling and
// leaving entries (the store names their network). The networks whose
// pools may hold addresses are also kept in a file of the state
// directory, so a restarted agent makes their pools again — and finds
// their free addresses and NICs — even when no pod of the network is
// left. A pool, once made, lives as long as the agent: it keeps its warm
// addresses (and so its NIC) with no pod of the network on the node.

// ReasonPodNetworkExhausted is the Node's Warning when a pod's PodNetwork
// has no address for it on this node: the network's subnets are full, or
// the VM has no NIC slot left for another network.
const ReasonPodNetworkExhausted = "VpcniPodNetworkExhausted"

// PodNetworks tells the agent which PodNetwork a pod is on and what that
// network says (Kubernetes, see internal/k8s/nodeside). Without it every
// pod is on the node's default network.
type PodNetworks interface {
	// NetworkOf is the PodNetwork recorded on pod namespace/name whose UID
	// is uid (the runtime's K8S_POD_UID; "" when it gave none); "" for none
	// (the node's default network).
	NetworkOf(ctx context.Context, namespace, name, uid string) (string, error)
	// Spec is PodNetwork name's section for provider type typ (the JSON
	// of spec.<typ>). An error says why there is none: no such
	// PodNetwork, or it takes its addresses from another provider.
	Spec(ctx context.Context, name, typ string) (json.RawMessage, error)
	// Names lists the PodNetworks with a section for provider type typ.
	Names(typ string) []string
}

// SetPodNetworks connects the agent to the cluster's PodNetworks; call it
// before Run.
func (a *Agent) SetPodNetworks(p PodNetworks) { a.podNets = p }

// netPools are the address managers of the PodNetworks the node serves.
type netPools struct {
	mu     sync.Mutex
	byName map[string]*addresses.Manager
	// run is Run's context once Run started (nil before): a manager made
	// before then is started by Run.
	run context.Context
	wg  sync.WaitGroup
	// stopped: Run is waiting for the managers to end; no new one starts
	// (an ADD during shutdown finds its manager not running).
	stopped bool
	// saveMu: one write of networksFile at a time.
	saveMu sync.Mutex
	// restored: the networks whose pools were made at start (from records
	// or networksFile), which may hold addresses before they connect.
	restored map[string]bool
}

// pool is the address manager of a record's network.
func (a *Agent) pool(rec *alloc.Allocation) *addresses.Manager {
	if rec.PodNetwork == "" {
		return a.addrs
	}
	a.nets.mu.Lock()
	defer a.nets.mu.Unlock()
	if m := a.nets.byName[rec.PodNetwork]; m != nil {
		return m
	}
	// Every recorded network got a manager at start, and new records are
	// made from one: only a record written by hand gets here.
	return a.netPoolLocked(rec.PodNetwork)
}

// podNetwork is the PodNetwork an ADD's pod is on ("" the default) and its
// manager. A pod whose PodNetwork cannot be served is refused with why: it
// must not come up on another network than the one that filters it.
func (a *Agent) podNetwork(ctx context.Context, podNS, podName, podUID string) (string, *addresses.Manager, *api.Error) {
	if a.podNets == nil || podName == "" {
		return "", a.addrs, nil
	}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	name, err := a.podNets.NetworkOf(c, podNS, podName, podUID)
	if err != nil {
		return "", nil, api.Errorf(api.CodeTryAgainLater, fmt.Sprintf("could not read pod %s/%s's PodNetwork", podNS, podName), err.Error())
	}
	if name == "" {
		return "", a.addrs, nil
	}
	reg, err := provider.Lookup(a.cfg.Provider.Type)
	if err != nil {
		return "", nil, api.Errorf(api.CodeInternal, err.Error(), "")
	}
	if reg.Network == nil {
		return "", nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("pod %s/%s is on PodNetwork %s, but provider %s serves no PodNetworks", podNS, podName, name, a.cfg.Provider.Type),
			"give the pod's namespace no PodNetwork on this node's provider, or run the pod where one is served")
	}
	if dp := a.dp.Info(); reg.NetworkNICs && !dp.NICRoutes {
		return "", nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("pod %s/%s is on PodNetwork %s, whose addresses live on NICs of their own, which datapath %s cannot route pods by", podNS, podName, name, dp.Mode),
			"run the PodNetwork's pods on nodes with datapath veth or ebpf")
	}
	if _, err := a.podNets.Spec(c, name, a.cfg.Provider.Type); err != nil {
		return "", nil, api.Errorf(api.CodeTryAgainLater, fmt.Sprintf("pod %s/%s is on PodNetwork %s, which this node cannot serve", podNS, podName, name), err.Error())
	}
	a.nets.mu.Lock()
	defer a.nets.mu.Unlock()
	return name, a.netPoolLocked(name), nil
}

// netPoolLocked returns PodNetwork name's manager, making it (and starting
// it, once Run runs) the first time. The caller holds a.nets.mu.
func (a *Agent) netPoolLocked(name string) *addresses.Manager {
	if m := a.nets.byName[name]; m != nil {
		return m
	}
	reg, _ := provider.Lookup(a.cfg.Provider.Type)
	connect := func(ctx context.Context) (provider.Provider, error) {
		if reg.Network == nil {
			return nil, fmt.Errorf("provider %s serves no PodNetworks", a.cfg.Provider.Type)
		}
		if a.podNets == nil {
			return nil, errors.New("the agent runs without Kubernetes: no PodNetwork can be read")
		}
		spec, err := a.podNets.Spec(ctx, name, a.cfg.Provider.Type)
		if err != nil {
			return nil, err
		}
		p, err := reg.Network(ctx, a.providerNode(), a.cfg.Provider.Settings, name, spec)
		if err != nil {
			return nil, fmt.Errorf("provider %s, PodNetwork %s: %w", a.cfg.Provider.Type, name, err)
		}
		// A PodNetwork serves the node's first family alone (add
		// refuses its pods on a node of two).
		return a.metrics.Instrument(onNetwork{onFamily{p, a.cfg.Families()[0]}, name}), nil
	}
	m := addresses.New(a.policy(), a.cfg.NodeName, connect, netStore{a.store, name}, a.log.With("podNetwork", name))
	m.Synced = func() {
		a.kick("sync")
		a.saveNetworks()
	}
	m.Report = a.addrs.Report
	if a.nets.byName == nil {
		a.nets.byName = map[string]*addresses.Manager{}
	}
	a.nets.byName[name] = m
	if ctx := a.nets.run; ctx != nil && !a.nets.stopped {
		a.nets.wg.Go(func() { m.Run(ctx) })
	}
	go a.saveNetworks()
	return m
}

// networksFile lists, in the state directory, the PodNetworks whose pools
// hold (or may hold) addresses on this node.
const networksFile = "podnetworks.json"

// saveNetworks writes the PodNetworks whose pools may hold addresses: every
// one that connected (written at its first sync, before its first
// assignment; its warm pool keeps addresses as long as the agent runs) and
// every one restored at start. A network that never connected in this run
// and was not restored holds nothing (its PodNetwork is missing or
// refused). One writer at a time.
func (a *Agent) saveNetworks() {
	a.nets.saveMu.Lock()
	defer a.nets.saveMu.Unlock()
	a.nets.mu.Lock()
	restored := maps.Clone(a.nets.restored)
	a.nets.mu.Unlock()
	var names []string
	for name, m := range a.netPools() {
		s := m.Status(time.Now())
		if s.Provider.Name != "" || restored[name] || s.Free+s.Cooling+s.Allocated+s.Aside+s.Leaving > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	data, _ := json.Marshal(names)
	path := filepath.Join(a.cfg.StateDir, networksFile)
	err := writeFileSynced(path, data)
	if err != nil {
		a.log.Warn("could not record the PodNetworks served; after a restart their pools are made again only by their pods", "file", path, "err", err)
	}
}

// writeFileSynced replaces path with data: a temporary file written and
// synced, renamed over it, the directory synced — a crash leaves the old
// file or the new one.
func writeFileSynced(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// savedNetworks reads the PodNetworks recorded by saveNetworks (none when
// the file is missing or unreadable: the records still name theirs).
func (a *Agent) savedNetworks() []string {
	data, err := os.ReadFile(filepath.Join(a.cfg.StateDir, networksFile))
	if err != nil {
		return nil
	}
	var names []string
	if err := json.Unmarshal(data, &names); err != nil {
		a.log.Warn("unreadable list of PodNetworks served; ignored", "file", networksFile, "err", err)
		return nil
	}
	return names
}

// netStore is the store as a PodNetwork's pool writes to it: an address
// it claims names the network, so a restart gives it back to that pool.
type netStore struct {
	*store.Store
	name string
}

func (s netStore) Claim(a netip.Addr) error { return s.ClaimOn(a, s.name) }

// runNetworks starts the managers made before Run and those made after,
// and waits for them all once ctx ends.
func (a *Agent) runNetworks(ctx context.Context) {
	a.nets.mu.Lock()
	a.nets.run = ctx
	for _, m := range a.nets.byName {
		a.nets.wg.Go(func() { m.Run(ctx) })
	}
	a.nets.mu.Unlock()
	<-ctx.Done()
	a.nets.mu.Lock()
	a.nets.stopped = true
	a.nets.mu.Unlock()
	a.nets.wg.Wait()
}

// netPools lists the PodNetworks served and their managers, by name.
func (a *Agent) netPools() map[string]*addresses.Manager {
	a.nets.mu.Lock()
	defer a.nets.mu.Unlock()
	out := make(map[string]*addresses.Manager, len(a.nets.byName))
	for n, m := range a.nets.byName {
		out[n] = m
	}
	return out
}

// idle lists the addresses no pod uses, of every network's pool.
func (a *Agent) idle() []netip.Addr {
	var out []netip.Addr
	for _, m := range a.fams {
		out = append(out, m.Idle()...)
	}
	for _, m := range a.netPools() {
		out = append(out, m.Idle()...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// owns says whether the record's network pool gives its address to it.
func (a *Agent) owns(rec *alloc.Allocation) bool { return a.pool(rec).Owns(rec.Key(), rec.Address) }

// onNetwork stamps a PodNetwork's leases with its name, so the record of
// an address taken from it says where the address goes back to.
type onNetwork struct {
	provider.Provider
	name string
}

func (o onNetwork) stamp(ls []alloc.Lease) []alloc.Lease {
	for i := range ls {
		ls[i].PodNetwork = o.name
	}
	return ls
}

func (o onNetwork) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	ls, err := o.Provider.Assign(ctx, req)
	return o.stamp(ls), err
}

func (o onNetwork) Held(ctx context.Context) ([]alloc.Lease, error) {
	ls, err := o.Provider.Held(ctx)
	return o.stamp(ls), err
}
