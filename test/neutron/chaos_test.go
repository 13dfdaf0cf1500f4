package neutron

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/faultproxy"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// TestChaos: an ADD/DEL storm against the real neutron-server while the
// agent is killed (kill -9) at a random point of every round and Neutron's
// answers are faulted through a proxy — 5xx, timeouts, replies lost after
// Neutron acted, 409 and 412. After every round, with the faults off and the
// runtime's retries done, the invariant must hold: the addresses Neutron
// holds for the node = the agent's free ∪ cooling ∪ allocated; no address
// on two live containers; every live container wired, and nothing vpcni
// made in the kernel without a live container.
// VPCNI_CHAOS_ROUNDS sets the rounds (make chaos: 20; make test: 3).
func TestChaos(t *testing.T) {
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("VPCNI_CHAOS_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("VPCNI_CHAOS_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("vpcni-test: chaos seed %d (VPCNI_CHAOS_SEED to replay)", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	binDir := bin(t)

	sn := realNeutron{}.NewSubnet(t, "10.78.0.0/24", 150)
	nodeIP := netip.MustParseAddr("10.78.0.10")
	realNeutron{}.NewNode(t, sn, nodeIP)
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

	const pods = 10
	paths := make([]string, pods)
	for i := range pods {
		paths[i], _ = tb.AddPod(i)
	}
	live := make([]bool, pods) // the runtime's view: ADD succeeded, no DEL since
	gen := make([]int, pods)   // container generation: a new ID per ADD after a DEL
	id := func(i int) string { return fmt.Sprintf("c%d-g%d", i, gen[i]) }
	c, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var leaked, doubled, orphans int

	for round := 1; round <= rounds; round++ {
		f := faultproxy.Faults{
			ServerError: 0.08 * rng.Float64(), Timeout: 0.04 * rng.Float64(), LostReply: 0.15 * rng.Float64(),
			Conflict409: 0.15 * rng.Float64(), Precondition412: 0.2 * rng.Float64(), HoldFor: 4 * time.Second,
		}
		proxy.SetFaults(f)
		killAt := time.Duration(300+rng.IntN(2500)) * time.Millisecond
		storm := time.Duration(3000+rng.IntN(2000)) * time.Millisecond

		// The storm: workers flip pods between added and deleted.
		var mu sync.Mutex
		busy := make([]bool, pods)
		stop := time.Now().Add(storm)
		var wg sync.WaitGroup
		for w := range 4 {
			wrng := rand.New(rand.NewPCG(seed+uint64(round*10+w), uint64(w)))
			wg.Go(func() {
				for time.Now().Before(stop) {
					mu.Lock()
					i := wrng.IntN(pods)
					if busy[i] {
						mu.Unlock()
						continue
					}
					busy[i] = true
					wasLive, name := live[i], id(i)
					mu.Unlock()
					rt := testbed.Runtime(name, paths[i], "eth0", nil)
					var err error
					if wasLive {
						err = cni.Del(c, rt)
					} else {
						_, err = cni.Add(c, rt)
					}
					mu.Lock()
					switch {
					case wasLive && err == nil:
						live[i] = false
						gen[i]++
					case !wasLive && err == nil:
						live[i] = true
					case !wasLive:
						// A failed ADD: the runtime DELs it before trying
						// again (below, once the agent answers).
						live[i] = false
					}
					busy[i] = false
					mu.Unlock()
				}
			})
		}
		time.Sleep(killAt)
		if err := agent.Kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		if agent, err = tb.Restart(binDir, agent); err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
		wg.Wait()

		// Settle: faults off; the runtime DELs what it does not consider
		// live (failed ADDs included), as kubelet would.
		proxy.SetFaults(faultproxy.Faults{})
		for i := range pods {
			if live[i] {
				continue
			}
			if err := retry(c, func() error { return cni.Del(c, testbed.Runtime(id(i), paths[i], "eth0", nil)) }); err != nil {
				t.Fatalf("round %d: DEL %s: %v", round, id(i), err)
			}
		}
		l, d, o := checkChaosInvariant(t, round, tb.NodeNS(), agent, truth, cni, live, id, paths)
		leaked, doubled, orphans = leaked+l, doubled+d, orphans+o
		t.Logf("vpcni-test: chaos round %d: faults %+v, killed after %s; live pods %d; proxy %v", round, f, killAt, count(live), proxy.Counts())
	}
	fmt.Printf("chaos: rounds=%d leaked=%d doubled=%d orphans=%d\n", rounds, leaked, doubled, orphans)
	if leaked+doubled+orphans > 0 {
		t.Fatalf("chaos: rounds=%d leaked=%d doubled=%d orphans=%d", rounds, leaked, doubled, orphans)
	}
}

func count(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

// retry runs f until it succeeds or a minute passes (the runtime retrying
// a CNI call).
func retry(c context.Context, f func() error) error {
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err = f(); err == nil {
			return nil
		}
	}
	return err
}

// checkChaosInvariant compares Neutron, the agent and the kernel once the
// pool has had time to settle, and returns what it found wrong.
func checkChaosInvariant(t *testing.T, round int, nodeNS string, agent *testbed.Agent, truth *openstack.Provider, cni *testbed.CNI,
	live []bool, id func(int) string, paths []string) (leaked, doubled, orphans int) {
	t.Helper()
	var lastErr string
	deadline := time.Now().Add(45 * time.Second)
	for {
		leaked, doubled, orphans, lastErr = 0, 0, 0, ""
		st, err := agent.State()
		heldLeases, herr := truth.Held(ctx(t))
		held := provider.Addresses(heldLeases)
		if err != nil || herr != nil {
			lastErr = fmt.Sprintf("state %v, neutron %v", err, herr)
		} else {
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
					lastErr += fmt.Sprintf(" the agent counts %s, Neutron does not hold it;", a)
				}
			}
			byIP := map[string]string{}
			records := map[string]bool{}
			for _, al := range st.Allocations {
				if other, dup := byIP[al.Address.String()]; dup {
					doubled++
					lastErr += fmt.Sprintf(" %s on %s and %s;", al.Address, other, al.ContainerID)
				}
				byIP[al.Address.String()] = al.ContainerID
				records[al.ContainerID] = true
			}
			for i, isLive := range live {
				if isLive != records[id(i)] {
					leaked++
					lastErr += fmt.Sprintf(" container %s live=%v but recorded=%v;", id(i), isLive, records[id(i)])
				}
			}
			// The kernel: exactly the live containers' links.
			// Without the list the orphan check would pass vacuously.
			links, lerr := netnsutil.Output(nodeNS, "ip", "-o", "link", "show")
			if lerr != nil {
				t.Fatalf("round %d: list the node's links: %v\n%s", round, lerr, links)
			}
			want := map[string]bool{}
			for i, isLive := range live {
				if isLive {
					want[veth.HostIfName(id(i), "eth0")] = true
				}
			}
			have := vpcLinks(links)
			for name := range want {
				if !slices.Contains(have, name) {
					orphans++
					lastErr += fmt.Sprintf(" live container's link %s is missing;", name)
				}
			}
			for _, name := range have {
				if !want[name] {
					orphans++
					lastErr += fmt.Sprintf(" link %s has no live container;", name)
				}
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
	for i, isLive := range live {
		if isLive {
			if err := cni.Check(ctx(t), testbed.Runtime(id(i), paths[i], "eth0", nil)); err != nil {
				orphans++
				t.Errorf("round %d: CHECK %s: %v", round, id(i), err)
			}
		}
	}
	return leaked, doubled, orphans
}

// vpcLinks picks the names of vpcni's host links out of `ip -o link show`.
func vpcLinks(out string) []string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, "vpc") {
			names = append(names, name)
		}
	}
	return names
}
