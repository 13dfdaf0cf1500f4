package neutron

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/faultproxy"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/chaos"
)

// TestChaos: an ADD/DEL storm against the real neutron-server while the
// agent is killed (kill -9) at a random point of every round and Neutron's
// answers are faulted through a proxy — 5xx, timeouts, replies lost after
// Neutron acted, 409 and 412, and the partial failures: a batched port
// update that lands in part, a read-back that fails after a write landed,
// a 409/412/500 placed on exactly the Nth port call. A few pods ask for
// their address by name (CNI_ARGS IP=), so their DELs give addresses back
// to Neutron, several in one batch, under those faults. After every round,
// with the faults off and the runtime's retries done, the invariant must
// hold: the addresses Neutron holds for the node = the agent's pool in
// every state it lists (free, cooling, allocated and whatever else it
// names, e.g. addresses it is giving back), and the VM port holds no pod
// address without vpcni's mark; no address on two live containers, and
// a requested address never on a pod that did not ask for it (seen at
// every ADD, too: the agent never picks those addresses itself); every
// live container wired, and nothing vpcni made in the kernel without a
// live container. Then the runtime ADDs back every pod it does not have
// (retrying, as kubelet does): each must be served within a bound and
// reachable from the neighbour host, and the invariant must hold again —
// an agent that comes back refusing pods fails here.
// VPCNI_CHAOS_ROUNDS sets the rounds (make chaos: 100; make test: 3);
// VPCNI_CHAOS_SEED replays a run's random choices (the storm's timing
// still varies).
func TestChaos(t *testing.T) {
	rounds, seed := chaos.Rounds(3), chaos.Seed()
	t.Logf("vpcni-test: chaos seed %d (VPCNI_CHAOS_SEED to replay)", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	binDir := bin(t)

	sn := realNeutron{}.NewSubnet(t, "10.78.0.0/24", 150) // pool .2-.151
	nodeIP := netip.MustParseAddr("10.78.0.10")
	node := realNeutron{}.NewNode(t, sn, nodeIP)
	// The testbed's neighbour host (.20) probes the pods: its address must
	// not become a pod's.
	realNeutron{}.NewNode(t, sn, netip.MustParseAddr("10.78.0.20"))
	proxy, err := faultproxy.New("http://127.0.0.1:19696", seed)
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr, err := proxy.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	tb := testbed.New(fmt.Sprintf("vpcnic%d", os.Getpid()%100000), netip.MustParsePrefix("10.78.0.0/24"))
	if err := tb.Up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Down() })
	fwd, err := testbed.Forward(tb.NodeNS(), "127.0.0.1:19696", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })

	dir := t.TempDir()
	cfg := tb.AgentConfig(dir, "10.78.0.0/24")
	cfg.Cooldown.Duration = 2 * time.Second
	cfg.Resync.Duration = 2 * time.Second
	cfg.Pool = config.Pool{WarmTarget: 3, BatchSize: 3, MaxFree: 6, AddWait: config.Duration{Duration: 4 * time.Second}}
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
		Endpoint: "http://127.0.0.1:19696/", SubnetID: sn.ID, MaxAddresses: 40,
		Timeout: config.Duration{Duration: 3 * time.Second}, Retries: 4,
	}}
	agent, err := tb.StartAgent(binDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { keepLog(t, agent, seed) }()
	cni, err := tb.NewCNI([]string{binDir}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-chaos", cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	// The truth from Neutron, read directly (not through the proxy).
	truthCfg := openstack.Config{Endpoint: endpoint, SubnetID: sn.ID}
	truthCfg.Defaults()
	truth, err := openstack.New(ctx(t), truthCfg, nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	onPort := func() []netip.Addr {
		return slices.DeleteFunc(node.PortIPs(t), func(a netip.Addr) bool { return a == nodeIP })
	}

	const pods = 10
	paths := make([]string, pods)
	for i := range pods {
		paths[i], _ = tb.AddPod(i)
		// Listening on every address of the pod's namespace, it answers
		// the probes of each container the pod gets.
		srv, err := netnsutil.ServeEcho(paths[i], "0.0.0.0:7777")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
	}
	// The last `sticky` pods ask for an address by name, at the top of the
	// allocation pool: the agent picks lowest first and holds at most
	// maxAddresses (40), so it never takes these for other pods (.2-.50).
	const sticky = 4
	requested := func(i int) string {
		if i < pods-sticky {
			return ""
		}
		return fmt.Sprintf("10.78.0.%d", 140+i)
	}
	// stolen: a requested address the runtime saw given to a pod that did
	// not ask for it (the agent handed out an address it should have given
	// back, or kept for its pod).
	var stolen []string
	p := chaos.NewPods(pods, cni, func(i int, id string) *libcni.RuntimeConf {
		r := testbed.Runtime(id, paths[i], "eth0", nil)
		if a := requested(i); a != "" {
			r.Args = append(r.Args, [2]string{"IP", a})
		}
		return r
	})
	p.OnAdd = func(i int, id string, res types.Result) {
		r, err := types100.GetResult(res)
		if err != nil || len(r.IPs) != 1 {
			stolen = append(stolen, fmt.Sprintf("ADD %s answered %v (%v)", id, res, err))
			return
		}
		a := r.IPs[0].Address.IP.String()
		if want := requested(i); want != "" && a != want || want == "" && ownerOf(requested, pods, a) >= 0 {
			stolen = append(stolen, fmt.Sprintf("ADD %s got %s (requested %q; %s is pod %d's)", id, a, want, a, ownerOf(requested, pods, a)))
		}
	}
	w := chaosWorld{nodeNS: tb.NodeNS(), nbrNS: tb.NbrNS(), truth: truth, onPort: onPort, cni: cni, pods: p, requested: requested}
	c, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	var leaked, doubled, orphans int
	nthStatus := []int{http.StatusConflict, http.StatusPreconditionFailed, http.StatusInternalServerError}

	for round := 1; round <= rounds; round++ {
		began := time.Now()
		f := faultproxy.Faults{
			ServerError: 0.08 * rng.Float64(), Timeout: 0.04 * rng.Float64(), LostReply: 0.15 * rng.Float64(),
			Conflict409: 0.15 * rng.Float64(), Precondition412: 0.2 * rng.Float64(),
			PartialPut: 0.3 * rng.Float64(), FailedReadBack: 0.3 * rng.Float64(), HoldFor: 4 * time.Second,
			Nth: []faultproxy.NthCall{
				{Method: http.MethodPut, Path: "/v2.0/ports/*", N: 1 + rng.IntN(4), Status: nthStatus[rng.IntN(len(nthStatus))]},
				{Method: http.MethodGet, Path: "/v2.0/ports/*", N: 1 + rng.IntN(4), Status: http.StatusInternalServerError},
			},
		}
		proxy.SetFaults(f)
		killAt := time.Duration(300+rng.IntN(2500)) * time.Millisecond
		storm := time.Duration(3000+rng.IntN(2000)) * time.Millisecond

		// The storm: workers flip pods between added and deleted.
		wait := p.Storm(c, 4, seed+uint64(round*10), time.Now().Add(storm), nil)
		time.Sleep(killAt)
		if err := agent.Kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		if agent, err = tb.Restart(binDir, agent); err != nil {
			t.Fatalf("round %d (seed %d): restart: %v", round, seed, err)
		}
		wait()
		w.agent = agent
		stormed := time.Now()

		// Settle: faults off; the runtime DELs the containers whose ADD or
		// DEL failed, as kubelet would.
		proxy.SetFaults(faultproxy.Faults{})
		if err := p.Settle(c); err != nil {
			t.Fatalf("round %d (seed %d): %v", round, seed, err)
		}
		l, d, o := w.check(t, round)
		leaked, doubled, orphans = leaked+l, doubled+d+reportStolen(t, round, seed, &stolen), orphans+o
		stormLive := p.Count()
		checked := time.Now()

		// The floor: the runtime ADDs back every pod it does not have,
		// all at once as kubelet starts them; each is served within a
		// bound and answers from its address.
		unserved := p.AddBack(c)
		doubled += reportStolen(t, round, seed, &stolen)
		if len(unserved) > 0 {
			t.Fatalf("round %d (seed %d): with the faults off the agent did not serve within %s:\n%s", round, seed, chaos.AddBackWait, strings.Join(unserved, "\n"))
		}
		added := time.Now()
		w.reachable(t, round, seed)
		reached := time.Now()
		l, d, o = w.check(t, round)
		leaked, doubled, orphans = leaked+l, doubled+d, orphans+o
		ms := func(a, b time.Time) time.Duration { return b.Sub(a).Round(100 * time.Millisecond) }
		t.Logf("vpcni-test: chaos round %d (%s: storm %s, settle and check %s, ADDs %s, probes %s, check %s): faults %+v, killed after %s; live pods after the storm %d, all %d after the ADDs; proxy %v, partial faults so far %d",
			round, ms(began, time.Now()), ms(began, stormed), ms(stormed, checked), ms(checked, added), ms(added, reached), ms(reached, time.Now()),
			f, killAt, stormLive, pods, proxy.Counts(), proxy.Partial())
	}
	partial := proxy.Partial()
	fmt.Printf("chaos: rounds=%d leaked=%d doubled=%d orphans=%d partial_faults=%d\n", rounds, leaked, doubled, orphans, partial)
	if leaked+doubled+orphans > 0 {
		t.Fatalf("chaos (seed %d): rounds=%d leaked=%d doubled=%d orphans=%d partial_faults=%d", seed, rounds, leaked, doubled, orphans, partial)
	}
	if rounds >= minPartialRounds && partial == 0 {
		t.Fatalf("chaos (seed %d): %d rounds and no partial fault injected (proxy %v): the run tested nothing it claims to", seed, rounds, proxy.Counts())
	}
}

// minPartialRounds: from this many rounds on, a run without a partial
// fault fails (each round places two by count, on the port's Nth PUT and
// GET; a round with fewer such calls places none).
const minPartialRounds = 3

// reportStolen fails the test for each requested address seen on the
// wrong pod since the last report, and counts them.
func reportStolen(t *testing.T, round int, seed uint64, stolen *[]string) int {
	t.Helper()
	for _, s := range *stolen {
		t.Errorf("round %d (seed %d): a requested address went to the wrong pod: %s", round, seed, s)
	}
	n := len(*stolen)
	*stolen = nil
	return n
}

// ownerOf is the pod that asks for address a by name, or -1.
func ownerOf(requested func(int) string, pods int, a string) int {
	for i := range pods {
		if requested(i) == a {
			return i
		}
	}
	return -1
}

// keepLog saves a failed run's agent log where it outlives the test.
func keepLog(t *testing.T, a *testbed.Agent, seed uint64) {
	if !t.Failed() {
		return
	}
	data, err := os.ReadFile(a.LogPath)
	if err != nil {
		t.Logf("vpcnid log: %v", err)
		return
	}
	p := filepath.Join(os.TempDir(), fmt.Sprintf("vpcni-chaos-%d.log", seed))
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Logf("keep the vpcnid log: %v", err)
		return
	}
	t.Logf("vpcni-test: vpcnid log kept in %s", p)
}

// chaosWorld is what TestChaos checks after each round: the agent, the
// truth from Neutron, the node's kernel and the runtime's view of its pods.
type chaosWorld struct {
	nodeNS, nbrNS string
	agent         *testbed.Agent
	truth         *openstack.Provider
	onPort        func() []netip.Addr // every pod address on the VM port, marked or not
	cni           *testbed.CNI
	pods          *chaos.Pods
	requested     func(int) string
}

// check compares Neutron, the agent and the kernel once the pool has had
// time to settle, and returns what it found wrong.
func (w *chaosWorld) check(t *testing.T, round int) (leaked, doubled, orphans int) {
	t.Helper()
	var lastErr string
	deadline := time.Now().Add(45 * time.Second)
	live := w.pods.Live()
	for {
		leaked, doubled, orphans, lastErr = 0, 0, 0, ""
		st, err := w.agent.State()
		heldLeases, herr := w.truth.Held(ctx(t))
		held := provider.Addresses(heldLeases)
		if err != nil || herr != nil {
			lastErr = fmt.Sprintf("state %v, neutron %v", err, herr)
		} else {
			// Every state the agent lists: free, cooling, allocated and
			// any other (addresses it is giving back, set aside).
			var pool []netip.Addr
			for _, list := range st.Pool.Addresses {
				for _, s := range list {
					pool = append(pool, netip.MustParseAddr(s))
				}
			}
			slices.SortFunc(pool, netip.Addr.Compare)
			for _, a := range held {
				if !slices.Contains(pool, a) {
					leaked++
					lastErr += fmt.Sprintf(" Neutron holds %s, the agent does not know it;", a)
				}
			}
			for _, a := range pool {
				if !slices.Contains(held, a) {
					leaked++
					lastErr += fmt.Sprintf(" the agent counts %s (pool %v), Neutron does not hold it;", a, st.Pool.Addresses)
				}
			}
			// An address on the port without vpcni's mark is held by
			// Neutron for the node but counted by nobody: nothing else
			// writes this port.
			for _, a := range w.onPort() {
				if !slices.Contains(held, a) {
					leaked++
					lastErr += fmt.Sprintf(" %s is on the VM port without vpcni's mark;", a)
				}
			}
			byIP := map[string]string{}
			records := map[string]netip.Addr{}
			for _, al := range st.Allocations {
				if other, dup := byIP[al.Address.String()]; dup {
					doubled++
					lastErr += fmt.Sprintf(" %s on %s and %s;", al.Address, other, al.ContainerID)
				}
				byIP[al.Address.String()] = al.ContainerID
				records[al.ContainerID] = al.Address
				var i int
				if o := ownerOf(w.requested, len(live), al.Address.String()); o >= 0 {
					if _, err := fmt.Sscanf(al.ContainerID, "c%d-", &i); err != nil || i != o {
						doubled++
						lastErr += fmt.Sprintf(" %s, pod %d's requested address, is on %s;", al.Address, o, al.ContainerID)
					}
				}
			}
			for i, isLive := range live {
				id := w.pods.ID(i)
				a, recorded := records[id]
				if isLive != recorded {
					leaked++
					lastErr += fmt.Sprintf(" container %s live=%v but recorded=%v;", id, isLive, recorded)
				}
				if want := w.requested(i); recorded && want != "" && a.String() != want {
					leaked++
					lastErr += fmt.Sprintf(" container %s asked for %s, has %s;", id, want, a)
				}
			}
			// The kernel: exactly the live containers' links.
			problems, err := w.pods.Links(w.nodeNS)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			orphans += len(problems)
			for _, p := range problems {
				lastErr += " " + p + ";"
			}
		}
		if leaked+doubled+orphans == 0 && lastErr == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("round %d:%s", round, lastErr)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Every live container is wired as vpcni left it.
	for i, isLive := range w.pods.Live() {
		if isLive {
			if err := w.cni.Check(ctx(t), w.pods.RT(i)); err != nil {
				orphans++
				t.Errorf("round %d: CHECK %s: %v", round, w.pods.ID(i), err)
			}
		}
	}
	return leaked, doubled, orphans
}

// reachable probes every live pod from the neighbour host, at the address
// the agent records for it: a pod the runtime has but nobody can reach
// fails the run.
func (w *chaosWorld) reachable(t *testing.T, round int, seed uint64) {
	t.Helper()
	st, err := w.agent.State()
	if err != nil {
		t.Fatalf("round %d (seed %d): agent state: %v", round, seed, err)
	}
	if err := w.pods.ReachLive(st, netnsutil.Path(w.nbrNS), "the neighbour"); err != nil {
		t.Fatalf("round %d (seed %d): %v", round, seed, err)
	}
}
