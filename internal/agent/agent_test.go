package agent

// The agent's core without root: the real store in a temp dir, the real
// static provider, the address manager, and the stateful fake datapath in
// place of the kernel. Pod namespaces are plain files (the agent only
// checks that they exist; the fake refuses to wire a missing one).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/fake"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/store"
)

// node is one agent's world that outlives the agent: its state dir, its
// "kernel", its pod namespaces.
type node struct {
	t     *testing.T
	dir   string
	netns string
	dp    *fake.Datapath
	cfg   config.Config
	// podNets, if set, is the cluster's PodNetworks the agent reads.
	podNets PodNetworks
}

func newNode(t *testing.T, cidr string, mutate ...func(*config.Config)) *node {
	t.Helper()
	dir := t.TempDir()
	n := &node{t: t, dir: dir, netns: filepath.Join(dir, "netns"), dp: fake.New()}
	if err := os.Mkdir(n.netns, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.NodeName = "node-t"
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Kubernetes.Mode = "off"
	cfg.Datapath = config.Datapath{Mode: "fake"}
	// The fake has no kernel to watch; the timer repairs it.
	noWatch := false
	cfg.SelfHeal.Watch = &noWatch
	cfg.Cooldown.Duration = 0
	cfg.Pool.WarmTarget, cfg.Pool.BatchSize, cfg.Pool.MaxFree = 2, 4, 8
	cfg.Pool.AddWait.Duration = 300 * time.Millisecond
	cfg.Provider = config.Provider{Type: "static", Settings: &static.Config{Ranges: []static.Range{{CIDR: cidr}}}}
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	n.cfg = cfg
	return n
}

// pod makes a pod namespace (a file that exists).
func (n *node) pod(name string) string {
	p := filepath.Join(n.netns, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		n.t.Fatal(err)
	}
	return p
}

// running is an agent started on the node, with Run going.
type running struct {
	*Agent
	cancel context.CancelFunc
	done   chan struct{}
}

// start opens the agent as vpcnid would and runs it until the test ends
// (or stop).
func (n *node) start() *running {
	n.t.Helper()
	return n.startWith(nil)
}

// startWith is start with the agent reporting to c (nil: no cluster).
func (n *node) startWith(c func(*Agent) Cluster) *running {
	n.t.Helper()
	st, err := store.Open(n.cfg.StateDir)
	if err != nil {
		n.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	a, err := newAgent(context.Background(), n.cfg, log, st, n.dp)
	if err != nil {
		st.Close()
		n.t.Fatal(err)
	}
	if c != nil {
		a.SetCluster(c(a))
	}
	if n.podNets != nil {
		a.SetPodNetworks(n.podNets)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() { a.Run(ctx); close(r.done) }()
	n.t.Cleanup(r.stop)
	return r
}

// stop ends Run and closes the agent, as a graceful vpcnid stop does.
func (r *running) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	r.cancel()
	<-r.done
	_ = r.Close()
}

func req(id, netns string) *api.CNIRequest {
	return &api.CNIRequest{ContainerID: id, IfName: "eth0", Netns: netns, Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + id,
		Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni"}`)}
}

func (r *running) add(t *testing.T, id, netns string) netip.Addr {
	t.Helper()
	res, aerr := r.Add(context.Background(), req(id, netns))
	if aerr != nil {
		t.Fatalf("ADD %s: %v", id, aerr)
	}
	if len(res.IPs) != 1 {
		t.Fatalf("ADD %s: %d IPs", id, len(res.IPs))
	}
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	return ip
}

// The invariant every test checks: the store, the pool and the "kernel"
// agree, and no address is given twice.
func (r *running) checkInvariant(t *testing.T, n *node) {
	t.Helper()
	recs, err := r.store.List()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]string{}
	var keys []string
	for _, rec := range recs {
		if other, dup := seen[rec.Address]; dup {
			t.Fatalf("%s recorded for %s and %s", rec.Address, other, rec.Key())
		}
		seen[rec.Address] = rec.Key()
		keys = append(keys, rec.Key())
		if !r.owns(rec) {
			t.Errorf("the pool of its network does not give %s to %s", rec.Address, rec.Key())
		}
		if !n.dp.Wired(rec.Key(), rec.Address) {
			t.Errorf("%s (%s) is recorded but not wired", rec.Key(), rec.Address)
		}
	}
	slices.Sort(keys)
	if links := n.dp.Links(); !slices.Equal(links, keys) {
		t.Errorf("wired %v, recorded %v", links, keys)
	}
	allocated := r.addrs.Status(time.Now()).Allocated
	for _, m := range r.netPools() {
		allocated += m.Status(time.Now()).Allocated
	}
	if allocated != len(recs) {
		t.Errorf("the pools allocate %d, the store records %d", allocated, len(recs))
	}
}

func TestAddDelAndRepeat(t *testing.T) {
	n := newNode(t, "10.9.0.0/24")
	a := n.start()
	ns := n.pod("p1")
	res, aerr := a.Add(context.Background(), req("c1", ns))
	if aerr != nil {
		t.Fatal(aerr)
	}
	if len(res.Interfaces) != 2 || res.Interfaces[1].Sandbox != ns || len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.9.0.2/32" {
		t.Fatalf("result = %+v", res)
	}
	if res.IPs[0].Gateway.String() != "10.9.0.1" {
		t.Errorf("gateway %s: the fake wires via the lease's gateway, want the range's 10.9.0.1", res.IPs[0].Gateway)
	}
	// A repeated ADD answers the same, without wiring again.
	setups := n.dp.Calls("Setup")
	again, aerr := a.Add(context.Background(), req("c1", ns))
	if aerr != nil || again.IPs[0].Address.String() != "10.9.0.2/32" || n.dp.Calls("Setup") != setups {
		t.Fatalf("repeated ADD = %+v, %v (setups %d -> %d)", again, aerr, setups, n.dp.Calls("Setup"))
	}
	// The record becomes ready with its wiring (written after the answer).
	waitUntil(t, "the record marked ready", func() bool {
		r, _ := a.store.Get("c1", "eth0")
		return r != nil && r.Ready && r.PodMAC() != "" && r.Prefix == netip.MustParsePrefix("10.9.0.0/24") && r.Gateway == netip.MustParseAddr("10.9.0.1")
	})
	a.checkInvariant(t, n)
	if aerr := a.Check(context.Background(), req("c1", ns)); aerr != nil {
		t.Fatalf("CHECK: %v", aerr)
	}
	if aerr := a.Del(context.Background(), req("c1", ns)); aerr != nil {
		t.Fatal(aerr)
	}
	a.checkInvariant(t, n)
	if r, _ := a.store.Get("c1", "eth0"); r != nil {
		t.Fatalf("record after DEL: %+v", r)
	}
	// DEL of what the agent never saw succeeds.
	if aerr := a.Del(context.Background(), req("never", ns)); aerr != nil {
		t.Fatalf("DEL of an unknown container: %v", aerr)
	}
	if aerr := a.Check(context.Background(), req("c1", ns)); aerr == nil || aerr.Code != api.CodeUnknownContainer {
		t.Fatalf("CHECK after DEL = %v, want code %d", aerr, api.CodeUnknownContainer)
	}
}

func TestFailedSetupReturnsTheAddress(t *testing.T) {
	n := newNode(t, "10.9.1.0/24")
	a := n.start()
	ns := n.pod("p1")
	n.dp.FailNextSetup("c1/eth0", errors.New("no more links"))
	if _, aerr := a.Add(context.Background(), req("c1", ns)); aerr == nil || aerr.Code != api.CodeInternal {
		t.Fatalf("ADD with a failing datapath = %v, want code 999", aerr)
	}
	if r, _ := a.store.Get("c1", "eth0"); r != nil {
		t.Fatalf("a failed ADD left a record: %+v", r)
	}
	// The address goes back to the pool, last in line (its wiring may
	// fail again): the next ADD gets another one, and it is not lost.
	if ip := a.add(t, "c2", ns); ip == netip.MustParseAddr("10.9.1.2") {
		t.Fatalf("next ADD got %s, whose wiring just failed, first", ip)
	}
	if free := a.addrs.Status(time.Now()).Addresses["free"]; !slices.Contains(free, netip.MustParseAddr("10.9.1.2")) {
		t.Fatalf("the address of the failed ADD is not free again: %v", free)
	}
	// A pod namespace that does not exist is the request's fault (code 4).
	if _, aerr := a.Add(context.Background(), req("c3", filepath.Join(n.netns, "gone"))); aerr == nil || aerr.Code != api.CodeInvalidEnv {
		t.Fatalf("ADD into a missing netns = %v, want code 4", aerr)
	}
	a.checkInvariant(t, n)
}

func TestBadRequests(t *testing.T) {
	n := newNode(t, "10.9.2.0/24")
	a := n.start()
	ns := n.pod("p1")
	long := req(strings.Repeat("c", alloc.MaxContainerID+1), ns)
	_, aerr := a.Add(context.Background(), long)
	if aerr == nil || aerr.Code != api.CodeInvalidEnv || !strings.Contains(aerr.Msg, "at most 233") {
		t.Fatalf("ADD with a %d-byte container ID = %v, want code 4 naming the limit", len(long.ContainerID), aerr)
	}
	if ip := a.add(t, strings.Repeat("c", alloc.MaxContainerID), ns); !ip.IsValid() {
		t.Fatal("a container ID of exactly the limit was refused")
	}
	bad := req("c2", ns)
	bad.Config = json.RawMessage(`{"cniVersion":"1.1.0"}`)
	if _, aerr := a.Add(context.Background(), bad); aerr == nil || aerr.Code != api.CodeInvalidConfig {
		t.Fatalf("ADD without a network name = %v, want code 7", aerr)
	}
	a.checkInvariant(t, n)
}

// A bandwidth limit asked of a mode whose pod interface is no veth is
// refused before any address is taken, saying why and what to do; the same
// mode wires pods that ask for none, and a veth mode takes the limit.
func TestBandwidthNeedsAPodVeth(t *testing.T) {
	n := newNode(t, "10.9.3.0/24")
	n.dp.NoPodVeth.Store(true)
	a := n.start()
	ns := n.pod("p1")
	limited := req("c1", ns)
	limited.Config = json.RawMessage(`{"cniVersion":"1.0.0","name":"vpcni","runtimeConfig":{"bandwidth":{"ingressRate":50000000,"ingressBurst":4294967295}}}`)
	_, aerr := a.Add(context.Background(), limited)
	if aerr == nil || aerr.Code != api.CodeInvalidConfig || !strings.Contains(aerr.Msg, "datapath fake cannot limit a pod's bandwidth") ||
		!strings.Contains(aerr.Details, "ingress 50000000 bit/s") || !strings.Contains(aerr.Details, "datapath veth or bridge") {
		t.Fatalf("ADD with a bandwidth limit in a mode without a pod veth = %v, want code 7 saying why and what to do", aerr)
	}
	if s := a.addrs.Status(time.Now()); s.Allocated != 0 || n.dp.Calls("Setup") != 0 {
		t.Fatalf("the refused ADD took an address (%d allocated) or wired (%d setups)", s.Allocated, n.dp.Calls("Setup"))
	}
	// No limit (zero rates, as a runtime may pass them): wired as usual.
	unlimited := req("c2", ns)
	unlimited.Config = json.RawMessage(`{"cniVersion":"1.0.0","name":"vpcni","runtimeConfig":{"bandwidth":{"ingressRate":0,"egressRate":0}}}`)
	if _, aerr := a.Add(context.Background(), unlimited); aerr != nil {
		t.Fatalf("ADD without a limit: %v", aerr)
	}
	n.dp.NoPodVeth.Store(false)
	if _, aerr := a.Add(context.Background(), limited); aerr != nil {
		t.Fatalf("ADD with a limit in a veth mode: %v", aerr)
	}
	a.checkInvariant(t, n)
}

// Restart: every recorded pod keeps its address; a pod deleted while the
// agent was away is released; a broken pod is re-wired; an orphan link
// and a stale piece of an idle address go; an ADD while the restore runs
// never gets an address a recorded pod holds.
func TestRestartRestores(t *testing.T) {
	n := newNode(t, "10.9.3.0/24")
	a := n.start()
	ips := map[string]netip.Addr{}
	for _, id := range []string{"keep", "gone", "broken", "noroute"} {
		ips[id] = a.add(t, id, n.pod(id))
	}
	waitUntil(t, "every record ready", func() bool {
		recs, _ := a.store.List()
		for _, r := range recs {
			if !r.Ready {
				return false
			}
		}
		return len(recs) == 4
	})
	a.stop()

	// While the agent is away: a pod goes, a link and a route vanish, a
	// crash leaves an orphan and a stale piece of a free address.
	if err := os.Remove(filepath.Join(n.netns, "gone")); err != nil {
		t.Fatal(err)
	}
	n.dp.DropLink("broken/eth0")
	if err := n.dp.DropRoute("noroute/eth0"); err != nil {
		t.Fatal(err)
	}
	n.dp.Orphan("crashed/eth0", n.pod("crashed"), netip.MustParseAddr("10.9.3.200"))
	free := netip.MustParseAddr("10.9.3.7") // held by the provider, free in the pool (.6 goes to "fresh")
	n.dp.Stale(free)

	b := n.start()
	// Before any pod is checked, the pool knows every recorded address:
	// a new ADD gets none of them.
	fresh := b.add(t, "fresh", n.pod("fresh"))
	for id, ip := range ips {
		if id != "gone" && ip == fresh {
			t.Fatalf("ADD during restore got %s, which %s holds", fresh, id)
		}
	}
	b.waitRestored(t)
	waitUntil(t, "the stale piece of a free address removed", func() bool { return !n.dp.HasStale(free) })
	if slices.Contains(b.addrs.Idle(), free) == false {
		t.Fatalf("%s is not idle: the test would not show the sweep", free)
	}
	if r, _ := b.store.Get("gone", "eth0"); r != nil {
		t.Errorf("the pod whose namespace is gone is still recorded: %+v", r)
	}
	for _, id := range []string{"keep", "broken", "noroute"} {
		if !n.dp.Wired(id+"/eth0", ips[id]) {
			t.Errorf("%s is not wired with %s after the restart", id, ips[id])
		}
	}
	if slices.Contains(n.dp.Links(), "crashed/eth0") {
		t.Error("the orphan link is still there")
	}
	b.checkInvariant(t, n)
}

// Two records for one address (a person copied a store): the second is
// neither wired, nor released, nor its address given to anyone else.
func TestConflictingRecordLeftAlone(t *testing.T) {
	n := newNode(t, "10.9.4.0/24")
	st, err := store.Open(n.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.9.4.20")
	for _, id := range []string{"first", "second"} {
		if err := st.Put(&alloc.Allocation{ContainerID: id, IfName: "eth0", Network: "vpcni", Netns: n.pod(id), Lease: alloc.Lease{Address: ip}, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	a := n.start()
	a.waitRestored(t)
	if r, _ := a.store.Get("second", "eth0"); r == nil {
		t.Fatal("the conflicting record was dropped")
	}
	owner := ""
	for _, k := range []string{"first/eth0", "second/eth0"} {
		if a.addrs.Owns(k, ip) {
			owner = k
		}
	}
	if owner == "" || !n.dp.Wired(owner, ip) || len(n.dp.Links()) != 1 {
		t.Fatalf("owner %q, links %v: want exactly the pool's owner wired", owner, n.dp.Links())
	}
	for i := range 5 {
		id := fmt.Sprintf("x%d", i)
		if got := a.add(t, id, n.pod(id)); got == ip {
			t.Fatalf("%s handed out while two records hold it", ip)
		}
		if aerr := a.Del(context.Background(), req(id, n.pod(id))); aerr != nil {
			t.Fatal(aerr)
		}
	}
}

func TestGCReleasesWhatTheRuntimeNoLongerHas(t *testing.T) {
	n := newNode(t, "10.9.5.0/24")
	a := n.start()
	for _, id := range []string{"a", "b", "c"} {
		a.add(t, id, n.pod(id))
	}
	gc := &api.CNIRequest{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni","cni.dev/valid-attachments":[{"containerID":"b","ifname":"eth0"}]}`)}
	if aerr := a.GC(context.Background(), gc); aerr != nil {
		t.Fatal(aerr)
	}
	recs, _ := a.store.List()
	if len(recs) != 1 || recs[0].ContainerID != "b" {
		t.Fatalf("after GC: %+v", recs)
	}
	a.checkInvariant(t, n)
}

// Concurrent ADDs and DELs of many pods: no address twice, everything
// released at the end.
func TestConcurrentVerbs(t *testing.T) {
	n := newNode(t, "10.9.6.0/24", func(c *config.Config) { c.Pool.BatchSize, c.Pool.WarmTarget, c.Pool.MaxFree = 8, 8, 16 })
	a := n.start()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 10 {
				id := string(rune('a'+w)) + string(rune('0'+i))
				ns := n.pod(id)
				if _, aerr := a.Add(context.Background(), req(id, ns)); aerr != nil {
					t.Errorf("ADD %s: %v", id, aerr)
					continue
				}
				if i%2 == 0 {
					if aerr := a.Del(context.Background(), req(id, ns)); aerr != nil {
						t.Errorf("DEL %s: %v", id, aerr)
					}
				}
			}
		})
	}
	wg.Wait()
	a.checkInvariant(t, n)
	if s := a.addrs.Status(time.Now()); s.Allocated != 40 {
		t.Fatalf("allocated %d, want 40", s.Allocated)
	}
}

// STATUS and the state read the pool without changing it; the store's
// cooling rows are forgotten by the manager's loop once the rest is over.
func TestStatusReadsWithoutChanging(t *testing.T) {
	n := newNode(t, "10.9.7.0/29", func(c *config.Config) {
		c.Cooldown.Duration = 200 * time.Millisecond
		c.Pool.WarmTarget, c.Pool.BatchSize, c.Pool.MaxFree = 0, 5, 5
	})
	a := n.start()
	var ips []netip.Addr
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		ips = append(ips, a.add(t, id, n.pod(id)))
	}
	if aerr := a.Status(context.Background(), nil); aerr == nil || aerr.Code != api.CodeNotAvailable || !strings.Contains(aerr.Msg, "none obtainable") {
		t.Fatalf("STATUS with all 5 allocated = %v, want not available and why", aerr)
	}
	if aerr := a.Del(context.Background(), req("a", n.pod("a"))); aerr != nil {
		t.Fatal(aerr)
	}
	cooling, _ := a.store.Cooling()
	if len(cooling) != 1 {
		t.Fatalf("cooling rows %v, want the released address", cooling)
	}
	if aerr := a.Status(context.Background(), nil); aerr == nil {
		t.Fatal("STATUS ready while the only spare address cools down")
	}
	time.Sleep(250 * time.Millisecond)
	// Over its rest: STATUS and the state count it free, and change nothing.
	if aerr := a.Status(context.Background(), nil); aerr != nil {
		t.Fatalf("STATUS after the cooldown: %v", aerr)
	}
	st, err := a.State()
	if err != nil || st.Pool.Free != 1 || st.Pool.Cooling != 0 || !st.Ready {
		t.Fatalf("state after the cooldown: %+v, %v", st.Pool, err)
	}
	if c := a.addrs.Status(time.Now()); len(c.Addresses["cooling"]) != 1 {
		t.Fatalf("reading the state promoted the address: %v", c.Addresses)
	}
	// The manager's loop promotes it and forgets the store's row.
	a.addrs.Kick()
	waitUntil(t, "the cooling row forgotten", func() bool { c, _ := a.store.Cooling(); return len(c) == 0 })
	if got := a.add(t, "f", n.pod("f")); got != ips[0] {
		t.Fatalf("ADD after the cooldown got %s, want the rested %s", got, ips[0])
	}
}

// clusterLog is a Cluster that records what it hears, and what the agent
// said of the allocation at that moment.
type clusterLog struct {
	a       *Agent
	mu      sync.Mutex
	changed []string
	macs    []string
}

func (c *clusterLog) Changed(containerID, ifName string) {
	r, _ := c.a.Allocation(containerID, ifName)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changed = append(c.changed, containerID)
	if r != nil {
		c.macs = append(c.macs, r.PodMAC())
	} else {
		c.macs = append(c.macs, "")
	}
}
func (c *clusterLog) Failed(string, string, string, *api.Error) {}
func (c *clusterLog) Unhealthy(string, string, string)          {}
func (c *clusterLog) NodeWarning(string, string)                {}
func (c *clusterLog) Ready() error                              { return nil }

// The cluster hears of a new pod once its record holds the wiring (the
// pod's MAC goes into its annotations), and of its release after the DEL.
func TestClusterHearsAfterTheWiringIsRecorded(t *testing.T) {
	n := newNode(t, "10.9.8.0/24")
	a := n.start()
	c := &clusterLog{a: a.Agent}
	a.SetCluster(c)
	ns := n.pod("p1")
	a.add(t, "c1", ns)
	waitUntil(t, "the cluster told", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.changed) == 1 })
	c.mu.Lock()
	mac := c.macs[0]
	c.mu.Unlock()
	if mac == "" {
		t.Fatal("the cluster was told before the record held the pod's MAC")
	}
	if aerr := a.Del(context.Background(), req("c1", ns)); aerr != nil {
		t.Fatal(aerr)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.changed) != 2 || c.macs[1] != "" {
		t.Fatalf("after DEL the cluster heard %v (records %v), want the release with no record left", c.changed, c.macs)
	}
}

// The periodic reconcile alone (no kernel watch) puts back a node-side
// piece someone removed and re-wires a pod whose link was deleted; each
// repair is counted by kind, each pass by its trigger.
func TestSelfHealOnTheTimer(t *testing.T) {
	n := newNode(t, "10.9.0.0/24", func(c *config.Config) { c.SelfHeal.Period.Duration = 100 * time.Millisecond })
	r := n.start()
	r.add(t, "c1", n.pod("p1"))
	r.add(t, "c2", n.pod("p2"))
	if err := n.dp.DropRoute("c1/eth0"); err != nil {
		t.Fatal(err)
	}
	n.dp.DropLink("c2/eth0")
	repairs := func(kind string) float64 { return counterValue(t, r.metrics.Repairs.WithLabelValues(kind)) }
	deadline := time.Now().Add(3 * time.Second)
	for repairs("route") < 1 || repairs("rewired") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not repaired within 3s (period 100ms): route %v, rewired %v", repairs("route"), repairs("rewired"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.checkInvariant(t, n)
	if got := counterValue(t, r.metrics.Reconciles.WithLabelValues("timer")); got < 1 {
		t.Errorf("reconciles by the timer: %v", got)
	}
	// Nothing missing: nothing repaired, however often it runs.
	time.Sleep(300 * time.Millisecond)
	if repairs("route") != 1 || repairs("rewired") != 1 {
		t.Errorf("repairs counted again with nothing missing: route %v, rewired %v", repairs("route"), repairs("rewired"))
	}
}

// A kick (what the kernel watch sends) is answered at once, not at the
// next period; kicks that come while a pass waits share that pass.
func TestSelfHealOnAKick(t *testing.T) {
	n := newNode(t, "10.9.0.0/24", func(c *config.Config) { c.SelfHeal.Period.Duration = time.Hour })
	r := n.start()
	r.add(t, "c1", n.pod("p1"))
	r.waitSynced(t)
	before := counterValue(t, r.metrics.Reconciles.WithLabelValues("watch"))
	if err := n.dp.DropRoute("c1/eth0"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.kick("route deleted")
	r.kick("route deleted again")
	for counterValue(t, r.metrics.Repairs.WithLabelValues("route")) < 1 {
		if time.Since(start) > 2*time.Second {
			t.Fatal("a kick was not answered within 2s (the period is an hour)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // minInterval 50ms: at most one more pass
	if got := counterValue(t, r.metrics.Reconciles.WithLabelValues("watch")) - before; got < 1 || got > 2 {
		t.Errorf("%v reconciles for two kicks, want 1 or 2", got)
	}
	r.checkInvariant(t, n)
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A probe reports each pod's datapath as the mode's check finds it and
// sets the gauges; a repaired pod reads healthy at the next probe.
func TestHealthProbe(t *testing.T) {
	n := newNode(t, "10.9.0.0/24", func(c *config.Config) { c.SelfHeal.Period.Duration = time.Hour })
	r := n.start()
	r.add(t, "c1", n.pod("p1"))
	r.add(t, "c2", n.pod("p2"))
	r.waitSynced(t)
	if err := n.dp.DropRoute("c1/eth0"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Records are marked ready just after the ADD answers: only ready ones
	// are probed.
	var h map[string]api.PodHealth
	for deadline := time.Now().Add(2 * time.Second); len(h) < 2 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r.probeAll(ctx)
		h = r.Health()
	}
	if h["c1/eth0"].Healthy || h["c1/eth0"].Problem == "" || !h["c2/eth0"].Healthy || len(h) != 2 {
		t.Fatalf("health after a dropped route: %+v", h)
	}
	gauge := func(result string) float64 {
		var m dto.Metric
		if err := r.metrics.PodHealth.WithLabelValues(result).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	if gauge("healthy") != 1 || gauge("unhealthy") != 1 {
		t.Errorf("gauges healthy %v unhealthy %v, want 1 and 1", gauge("healthy"), gauge("unhealthy"))
	}
	r.kick("test")
	for deadline := time.Now().Add(2 * time.Second); counterValue(t, r.metrics.Repairs.WithLabelValues("route")) < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not repaired")
		}
	}
	r.probeAll(ctx)
	if h := r.Health(); !h["c1/eth0"].Healthy || gauge("unhealthy") != 0 {
		t.Errorf("after the repair: %+v, unhealthy gauge %v", h["c1/eth0"], gauge("unhealthy"))
	}
}

// waitSynced waits for the reconcile the first sync with the provider
// asks for: a test that damages the node afterwards sees only the repairs
// it caused.
func (r *running) waitSynced(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); counterValue(t, r.metrics.Reconciles.WithLabelValues("sync")) < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reconcile after the first provider sync within 3s")
		}
	}
}

// waitRestored waits until Run has checked every pod recorded at start.
func (r *running) waitRestored(t *testing.T) {
	t.Helper()
	waitUntil(t, "the restore", func() bool {
		select {
		case <-r.restored:
			return true
		default:
			return false
		}
	})
}
