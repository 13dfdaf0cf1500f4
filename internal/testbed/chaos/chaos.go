// Package chaos is the runtime's side of the chaos tests (test/neutron
// against a real neutron-server, test/aws against the lab's EC2
// endpoint): a set of pods whose containers a storm of concurrent ADDs and
// DELs flips while the test kills the agent and faults its cloud, driven
// as kubelet drives them — a container whose ADD or DEL failed is dying,
// DELed until that succeeds before its pod gets a new one — then settled
// and ADDed back once the faults are off; and the checks on the node that
// both tests make after every round.
package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// Rounds is $VPCNI_CHAOS_ROUNDS, or def (make chaos sets it; make test
// runs def).
func Rounds(def int) int {
	if v, err := strconv.Atoi(os.Getenv("VPCNI_CHAOS_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return def
}

// Seed is $VPCNI_CHAOS_SEED, which replays a run's random choices (the
// storm's timing still varies), or a new one.
func Seed() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("VPCNI_CHAOS_SEED"), 10, 64); err == nil {
		return v
	}
	return uint64(time.Now().UnixNano())
}

// AddBackWait bounds how long the runtime retries one pod's ADD with the
// faults off before the agent counts as not serving. Generous: on a
// shared 2-core VM under load, Neutron's port updates were seen to take
// 4-10 s and the ADDs back 43 s in all, and an agent may still be backing
// off its reconnect to the cloud (up to 30 s) after the storm.
const AddBackWait = 90 * time.Second

// Pods is the runtime's view of each pod's current container: live (its
// ADD succeeded, no DEL since), dying (its ADD or its DEL failed), or
// neither (none yet, or DELeted). Each container has an ID of its own.
type Pods struct {
	cni *testbed.CNI
	rt  func(i int, id string) *libcni.RuntimeConf
	// OnAdd, if set, sees the result of every ADD that succeeded (pod i,
	// its container id), under the pods' lock.
	OnAdd func(i int, id string, res types.Result)

	mu          sync.Mutex
	live, dying []bool
	gen         []int // container generation: a new ID per container
}

// NewPods is n pods with no container yet; rt is how the runtime calls
// the plugin for pod i's container id.
func NewPods(n int, cni *testbed.CNI, rt func(i int, id string) *libcni.RuntimeConf) *Pods {
	return &Pods{cni: cni, rt: rt, live: make([]bool, n), dying: make([]bool, n), gen: make([]int, n)}
}

// ID is pod i's current container.
func (p *Pods) ID(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id(i)
}

func (p *Pods) id(i int) string { return fmt.Sprintf("c%d-g%d", i, p.gen[i]) }

// RT is the runtime config of pod i's current container.
func (p *Pods) RT(i int) *libcni.RuntimeConf { return p.rt(i, p.ID(i)) }

// Live lists which pods have a live container.
func (p *Pods) Live() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.live)
}

// Count is how many pods have a live container.
func (p *Pods) Count() int {
	n := 0
	for _, l := range p.Live() {
		if l {
			n++
		}
	}
	return n
}

// Storm starts workers that flip pods between added and deleted until
// stop: each picks a pod no other worker has, DELs its container if it is
// live or dying, ADDs one otherwise. skip, if set, passes a pod by
// (given whether its container is live, or dying). The returned func
// waits for the workers.
func (p *Pods) Storm(ctx context.Context, workers int, seed uint64, stop time.Time, skip func(i int, live, dying bool) bool) (wait func()) {
	busy := make([]bool, len(p.live))
	var wg sync.WaitGroup
	for wk := range workers {
		rng := rand.New(rand.NewPCG(seed+uint64(wk), uint64(wk)))
		wg.Go(func() {
			for time.Now().Before(stop) {
				p.mu.Lock()
				i := rng.IntN(len(p.live))
				del := p.live[i] || p.dying[i]
				if busy[i] || skip != nil && skip(i, p.live[i], p.dying[i]) {
					p.mu.Unlock()
					time.Sleep(time.Millisecond)
					continue
				}
				busy[i] = true
				r := p.rt(i, p.id(i))
				p.mu.Unlock()
				var err error
				var res types.Result
				if del {
					err = p.cni.Del(ctx, r)
				} else {
					res, err = p.cni.Add(ctx, r)
				}
				p.mu.Lock()
				switch {
				case del && err == nil:
					p.live[i], p.dying[i] = false, false
					p.gen[i]++
				case del:
					// A failed DEL: the pod is going, its container
					// DELed again until that succeeds.
					p.live[i], p.dying[i] = false, true
				case err == nil:
					p.live[i] = true
					if p.OnAdd != nil {
						p.OnAdd(i, r.ContainerID, res)
					}
				default:
					// A failed ADD: DELed before a new container.
					p.dying[i] = true
				}
				busy[i] = false
				p.mu.Unlock()
			}
		})
	}
	return wg.Wait
}

// Settle DELs the containers whose ADD or DEL failed, as kubelet would,
// retrying each for up to a minute.
func (p *Pods) Settle(ctx context.Context) error {
	for i := range p.live {
		p.mu.Lock()
		dying, r := p.dying[i], p.rt(i, p.id(i))
		p.mu.Unlock()
		if !dying {
			continue
		}
		if err := retry(func() error { return p.cni.Del(ctx, r) }); err != nil {
			return fmt.Errorf("DEL %s: %w", r.ContainerID, err)
		}
		p.mu.Lock()
		p.dying[i] = false
		p.gen[i]++
		p.mu.Unlock()
	}
	return nil
}

// AddBack ADDs every pod without a live container, all at once as kubelet
// starts them, each as kubelet does — after a failed ADD, DEL, then ADD
// again — until it succeeds or AddBackWait passes. It lists the pods not
// served.
func (p *Pods) AddBack(ctx context.Context) (unserved []string) {
	var wg sync.WaitGroup
	for i, l := range p.Live() {
		if l {
			continue
		}
		r := p.RT(i)
		wg.Go(func() {
			res, err := addBack(ctx, p.cni, r)
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				unserved = append(unserved, fmt.Sprintf("pod %d (%s): %v", i, r.ContainerID, err))
				return
			}
			p.live[i] = true
			if p.OnAdd != nil {
				p.OnAdd(i, r.ContainerID, res)
			}
		})
	}
	wg.Wait()
	return unserved
}

func addBack(c context.Context, cni *testbed.CNI, r *libcni.RuntimeConf) (types.Result, error) {
	for end := time.Now().Add(AddBackWait); ; time.Sleep(500 * time.Millisecond) {
		res, err := cni.Add(c, r)
		if err == nil {
			return res, nil
		}
		_ = cni.Del(c, r)
		if time.Now().After(end) {
			return nil, err
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

// Links compares vpcni's host links in the node namespace (named vpc…)
// with the live containers' and says what is wrong: a live container's
// link missing, a link without a live container. The listing failing is
// an error: without it the check would pass vacuously.
func (p *Pods) Links(nodeNS string) (problems []string, err error) {
	out, err := netnsutil.Output(nodeNS, "ip", "-o", "link", "show")
	if err != nil {
		return nil, fmt.Errorf("list the node's links: %w\n%s", err, out)
	}
	want := map[string]bool{}
	for i, l := range p.Live() {
		if l {
			want[veth.HostIfName(p.ID(i), "eth0")] = true
		}
	}
	var have []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@"); strings.HasPrefix(name, "vpc") {
			have = append(have, name)
		}
	}
	for name := range want {
		if !slices.Contains(have, name) {
			problems = append(problems, fmt.Sprintf("live container's link %s is missing", name))
		}
	}
	for _, name := range have {
		if !want[name] {
			problems = append(problems, fmt.Sprintf("link %s has no live container", name))
		}
	}
	return problems, nil
}

// Reach probes addr from the namespace at nsPath until it answers or 10 s
// pass (a neighbour's ARP entry for a pod whose address moved may take a
// moment to turn).
func Reach(nsPath, addr string) error {
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pc, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := netnsutil.Probe(pc, nsPath, addr)
		cancel()
		if err == nil || time.Now().After(end) {
			return err
		}
	}
}

// ReachLive probes port 7777 of every live pod, at the address st records
// for it, from the namespace at nsPath (who says who the prober is, for
// the error). A live pod without an allocation, one that does not answer,
// or no live pod at all (the floor would prove nothing) is an error.
func (p *Pods) ReachLive(st *api.State, nsPath, who string) error {
	addr := map[string]netip.Addr{}
	for _, al := range st.Allocations {
		addr[al.ContainerID] = al.Address
	}
	reached := 0
	for i, isLive := range p.Live() {
		if !isLive {
			continue
		}
		id := p.ID(i)
		a, ok := addr[id]
		if !ok {
			return fmt.Errorf("live pod %d (%s) has no allocation", i, id)
		}
		if err := Reach(nsPath, testbed.HostPort(a, 7777)); err != nil {
			return fmt.Errorf("%s cannot reach pod %d (%s) at %s: %w", who, i, id, a, err)
		}
		reached++
	}
	if reached == 0 {
		return fmt.Errorf("no live pod to reach: the floor proves nothing")
	}
	return nil
}
