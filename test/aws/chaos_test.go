package aws

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	awsprovider "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/testbed"
)

// flakyPort is where the agent reaches EC2 in its node: flakyEC2 in front
// of the lab's endpoint.
const flakyPort = 9697

// The EC2 actions whose replies may be lost (all that change something),
// and those that are throttled with small buckets.
var (
	writeActions = []string{"AssignPrivateIpAddresses", "UnassignPrivateIpAddresses", "CreateNetworkInterface",
		"AttachNetworkInterface", "DetachNetworkInterface", "DeleteNetworkInterface", "ModifyNetworkInterfaceAttribute"}
	throttledActions = append([]string{"DescribeNetworkInterfaces", "DescribeInstances"}, writeActions...)
)

// Provider settings that let the chaos see ENIs come and go within a
// round: an emptied ENI is removed after eniMinLifetime, an ENI left
// detached by a crash is deleted after leakedENIGrace.
const (
	eniMinLifetime = 3 * time.Second
	leakedENIGrace = 4 * time.Second
)

// TestChaos: an ADD/DEL storm on one node of an AWS-style lab while vpcnid
// is killed (kill -9) at a random point of every round and EC2 misbehaves:
// throttling with small buckets (RequestLimitExceeded), replies lost after
// the call took effect (an assign, an attach, a delete that landed and
// whose answer never came), 5xx answers; and the instance metadata lags
// EC2 by seconds throughout. The node is a t3.medium: five pod addresses
// on its primary ENI, so ten pods spill onto ENIs the provider creates and
// attaches (hot-plugged into the node); every other round drains the node
// and fills it again, so that emptied ENIs are removed and new ones made
// under the faults. After every round, with the faults off and the runtime's retries
// done, the invariant must hold, read from EC2 itself and not through the
// agent: the addresses EC2 holds for the node on vpcni's behalf (every
// secondary address on the primary ENI — nothing else writes it here — and
// on the ENIs tagged as vpcni's) = the agent's pool in every state it
// lists; no vpcni ENI left detached ("available") or attached and empty
// past the provider's grace; no address on two live containers, and each
// container's address on the ENI its record names (EC2 drops a packet that
// leaves by another); every live container wired, and no vpcni link
// without a live container. Then the runtime ADDs back every pod it does
// not have: each must be served, reachable from the legacy VM, and the
// invariant must hold again.
// VPCNI_CHAOS_ROUNDS sets the rounds (make chaos: CHAOS_ROUNDS; make test:
// 3); VPCNI_CHAOS_SEED replays a run's random choices (the storm's timing
// still varies).
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
	lag := time.Duration(2000+rng.IntN(2001)) * time.Millisecond

	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnich%d", os.Getpid()%100000), Nodes: 1,
		Subnet: netip.MustParsePrefix("10.99.0.0/24"), Cloud: "aws", IMDSLag: lag})
	cancel()
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	node := l.Nodes[0]
	flaky := newFlakyEC2(l.EC2.Handler(), seed)
	serveIn(t, node.NS, fmt.Sprintf("127.0.0.1:%d", flakyPort), flaky)

	runDir := t.TempDir()
	cfg := config.Defaults()
	cfg.NodeName = node.Name
	cfg.SocketPath = filepath.Join(runDir, "vpcnid.sock")
	cfg.StateDir = filepath.Join(runDir, "state")
	cfg.MetricsAddr = ""
	cfg.Cooldown.Duration = 2 * time.Second
	cfg.Resync.Duration = 2 * time.Second
	// A small pool: a drained node keeps two addresses, so ENIs empty;
	// and any free address above two goes back to EC2 at once (under the
	// faults, too).
	cfg.Pool = config.Pool{WarmTarget: 2, BatchSize: 2, MaxFree: 2, AddWait: config.Duration{Duration: 4 * time.Second}}
	cfg.Provider = config.Provider{Type: "aws", Settings: &awsprovider.Config{
		Endpoint:       fmt.Sprintf("http://127.0.0.1:%d/", flakyPort),
		IMDSEndpoint:   fmt.Sprintf("http://127.0.0.1:%d", lab.IMDSPort),
		ENIMinLifetime: config.Duration{Duration: eniMinLifetime}, LeakedENIGrace: config.Duration{Duration: leakedENIGrace},
		CleanupInterval: config.Duration{Duration: time.Second},
		Timeout:         config.Duration{Duration: 3 * time.Second}, Retries: 3, RetryMaxBackoff: config.Duration{Duration: time.Second},
	}}
	w := &world{t: t, l: l, node: node, cfg: cfg, runDir: runDir, seed: seed}
	w.start()
	defer w.keepLog()
	if w.cni, err = testbed.NewCNIIn(node.NS, []string{binDir}, filepath.Join(runDir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-chaos", cfg.SocketPath)); err != nil {
		t.Fatal(err)
	}

	const pods = 10
	paths := make([]string, pods)
	for i := range pods {
		name := fmt.Sprintf("%s-p%d", l.Prefix, i)
		if err := netnsutil.Add(name); err != nil {
			t.Fatal(err)
		}
		paths[i] = netnsutil.Path(name)
		// Listening on every address of the pod's namespace, it answers
		// the probes of each container the pod gets.
		srv, err := netnsutil.ServeEcho(paths[i], "0.0.0.0:7777")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
	}
	// The runtime's view of each pod's current container: live (its ADD
	// succeeded, no DEL since), dying (its ADD or its DEL failed: the
	// runtime DELs it until that succeeds, and only then makes a new one),
	// or neither (none yet, or DELeted).
	w.live = make([]bool, pods)
	dying := make([]bool, pods)
	gen := make([]int, pods) // container generation: a new ID per container
	w.id = func(i int) string { return fmt.Sprintf("c%d-g%d", i, gen[i]) }
	w.rt = func(i int) *libcni.RuntimeConf { return testbed.Runtime(w.id(i), paths[i], "eth0", nil) }
	live := w.live

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	var leaked, doubled, orphans, misplaced int

	for round := 1; round <= rounds; round++ {
		began := time.Now()
		// Odd rounds flip pods at random under every fault, throttling
		// included. Even rounds drain the node and fill it again: the
		// runtime DELs every pod (the pool gives its surplus back once it
		// has cooled, and an ENI of vpcni's that empties is detached and
		// deleted), then ADDs them all (new ENIs are made for them). A
		// node whose EC2 calls keep failing gives nothing back (it is
		// degraded), so these rounds are not throttled: their faults are
		// the kill, lost replies and 5xx. Strengths are drawn anew each
		// round.
		drainFill := round%2 == 0
		serverErrors := 0.02 + 0.1*rng.Float64()
		flaky.setServerErrors(serverErrors)
		var buckets []string
		if !drainFill {
			l.EC2.Throttle(true)
			for _, a := range throttledActions {
				size, refill := 1+rng.IntN(4), 0.5+2.5*rng.Float64()
				l.EC2.SetBucket(a, size, refill)
				buckets = append(buckets, fmt.Sprintf("%s:%d@%.1f/s", strings.TrimSuffix(a, "NetworkInterface"), size, refill))
			}
		}
		var lose []string
		for _, a := range writeActions {
			if rng.IntN(2) == 0 {
				n := 1 + rng.IntN(2)
				l.EC2.LoseReplies(n, a)
				lose = append(lose, fmt.Sprintf("%s×%d", a, n))
			}
		}
		storm, drain := time.Duration(4000+rng.IntN(3000))*time.Millisecond, time.Duration(0)
		if drainFill {
			drain = cfg.Cooldown.Duration + eniMinLifetime + 2*time.Second
			storm = drain + time.Duration(2000+rng.IntN(2000))*time.Millisecond
		}
		killAt := time.Duration(300+rng.IntN(int(storm/time.Millisecond)-300)) * time.Millisecond

		// The storm: workers flip pods between added and deleted.
		var mu sync.Mutex
		busy := make([]bool, pods)
		stop := time.Now().Add(storm)
		mid := time.Now().Add(drain)
		var wg sync.WaitGroup
		for wk := range 4 {
			wrng := rand.New(rand.NewPCG(seed+uint64(round*10+wk), uint64(wk)))
			wg.Go(func() {
				for time.Now().Before(stop) {
					draining := time.Now().Before(mid)
					mu.Lock()
					i := wrng.IntN(pods)
					// Draining, the runtime only DELs; filling, it only
					// ADDs (and DELs a failed container).
					skip := drainFill && (draining && !live[i] && !dying[i] || !draining && live[i])
					if busy[i] || skip {
						mu.Unlock()
						time.Sleep(time.Millisecond)
						continue
					}
					busy[i] = true
					del, r := live[i] || dying[i], w.rt(i)
					mu.Unlock()
					var err error
					if del {
						err = w.cni.Del(ctx, r)
					} else {
						_, err = w.cni.Add(ctx, r)
					}
					mu.Lock()
					switch {
					case del && err == nil:
						live[i], dying[i] = false, false
						gen[i]++
					case del:
						live[i], dying[i] = false, true
					case err == nil:
						live[i] = true
					default:
						dying[i] = true
					}
					busy[i] = false
					mu.Unlock()
				}
			})
		}
		time.Sleep(killAt)
		if err := w.agent.Kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		w.start()
		wg.Wait()
		stormed := time.Now()

		// Settle: faults off; the runtime DELs the containers whose ADD or
		// DEL failed, as kubelet would.
		flaky.setServerErrors(0)
		l.EC2.Throttle(false)
		l.EC2.LoseReplies(0, writeActions...)
		for i := range pods {
			if !dying[i] {
				continue
			}
			if err := retry(func() error { return w.cni.Del(ctx, w.rt(i)) }); err != nil {
				t.Fatalf("round %d (seed %d): DEL %s: %v", round, seed, w.id(i), err)
			}
			dying[i] = false
			gen[i]++
		}
		f := w.check(round)
		stormLive := count(live)
		checked := time.Now()

		// The floor: the runtime ADDs back every pod it does not have, all
		// at once as kubelet starts them; each is served within a bound
		// and answers from its address.
		var unserved []string
		for i := range pods {
			if live[i] {
				continue
			}
			r := w.rt(i)
			wg.Go(func() {
				err := addBack(ctx, w.cni, r)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					unserved = append(unserved, fmt.Sprintf("pod %d (%s): %v", i, r.ContainerID, err))
					return
				}
				live[i] = true
			})
		}
		wg.Wait()
		if len(unserved) > 0 {
			t.Fatalf("round %d (seed %d): with the faults off the agent did not serve within %s:\n%s", round, seed, addBackWait, strings.Join(unserved, "\n"))
		}
		added := time.Now()
		w.reachable(round)
		reached := time.Now()
		f2 := w.check(round)
		leaked += f.leaked + f2.leaked
		doubled += f.doubled + f2.doubled
		orphans += f.orphans + f2.orphans
		misplaced += f.misplaced + f2.misplaced
		ms := func(a, b time.Time) time.Duration { return b.Sub(a).Round(100 * time.Millisecond) }
		t.Logf("vpcni-test: chaos round %d (%s: storm %s, settle and check %s, ADDs %s, probes %s, check %s): 5xx %.2f, buckets %s, lost replies %v, drain and fill %v, killed after %s; live pods after the storm %d, all %d after the ADDs on ENIs %v; requests %v",
			round, ms(began, time.Now()), ms(began, stormed), ms(stormed, checked), ms(checked, added), ms(added, reached), ms(reached, time.Now()),
			serverErrors, strings.Join(buckets, " "), lose, drainFill, killAt, stormLive, pods, f2.enis, flaky.Counts())
	}
	n := flaky.Counts()
	fmt.Printf("chaos: provider=aws rounds=%d leaked=%d doubled=%d orphans=%d partial_faults=%d misplaced=%d server_errors=%d throttled=%d enis=%d imds_lag=%s\n",
		rounds, leaked, doubled, orphans, n["lost_write"], misplaced, n["server_error"], n["throttled"], len(w.enisSeen), lag)
	if leaked+doubled+orphans+misplaced > 0 {
		t.Fatalf("chaos (seed %d): rounds=%d leaked=%d doubled=%d orphans=%d misplaced=%d", seed, rounds, leaked, doubled, orphans, misplaced)
	}
	// A run whose faults never struck tested nothing it claims to.
	if rounds >= 3 && (n["lost_write"] == 0 || n["server_error"] == 0 || n["throttled"] == 0) {
		t.Fatalf("chaos (seed %d): %d rounds and a fault never struck (requests %v)", seed, rounds, n)
	}
	if len(w.enisSeen) < 2 {
		t.Fatalf("chaos (seed %d): the pods never spilled onto an ENI of vpcni's (ENIs %v): the run tested the primary ENI only", seed, w.enisSeen)
	}
}

// addBackWait bounds how long the runtime retries one pod's ADD with the
// faults off before the agent counts as not serving: the agent may still
// be backing off its reconnect to EC2 (up to 30 s) after the storm.
const addBackWait = 90 * time.Second

// addBack ADDs a pod as kubelet does: after a failed ADD, DEL, then ADD
// again, until it succeeds or addBackWait passes.
func addBack(c context.Context, cni *testbed.CNI, r *libcni.RuntimeConf) error {
	for end := time.Now().Add(addBackWait); ; time.Sleep(500 * time.Millisecond) {
		_, err := cni.Add(c, r)
		if err == nil {
			return nil
		}
		_ = cni.Del(c, r)
		if time.Now().After(end) {
			return err
		}
	}
}

// retry runs f until it succeeds or a minute passes (the runtime retrying
// a CNI call).
func retry(f func() error) error {
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err = f(); err == nil {
			return nil
		}
	}
	return err
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
