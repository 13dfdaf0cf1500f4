package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchPool measures the pool policy against a real Neutron: cloud calls
// per pod under churn, and ADD p99 when the pool starts empty and when it
// is warm, against the time of one batched Neutron update.
func benchPool(args []string, out io.Writer) (err error) {
	if providerArg(args) == "aws" {
		return benchPoolAWS(args, out)
	}
	fs := flag.NewFlagSet("bench pool", flag.ContinueOnError)
	fs.String("provider", "openstack", "openstack (a real neutron-server at --endpoint) or aws (the lab's EC2 endpoint in process: see bench pool --provider aws -h)")
	endpoint := fs.String("endpoint", "http://127.0.0.1:19696/", "noauth Neutron endpoint (scripts/neutron.sh up)")
	ramp := fs.Duration("ramp", 35*time.Second, "churn before counting: the pool grows to the churn rate times the cooldown")
	churnFor := fs.Duration("churn", 60*time.Second, "how long churn is counted after the ramp")
	n := fs.Int("n", 40, "sequential ADDs for the cold and warm latency")
	burst := fs.Int("burst", 100, "concurrent ADDs on an agent with an empty pool (the cold burst)")
	rounds := fs.Int("rounds", 3, "cold bursts, each against one batched update of as many addresses")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// A /22: the port marks hold every address of it, so the node may hold
	// the 400 addresses the churn asks for (a /20's marks cap it at 61).
	b, err := newNeutronBed(ctx, *endpoint, "vpcni-pbench", "10.82.0.0/22")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.close()) }()

	// The yardstick: one batched update of the burst's worth of addresses,
	// on a VM port of its own with no agent, taken in turns with the cold
	// bursts (so both see the same neutron-server in the same state).
	prov, err := b.vmProvider(ctx, netip.MustParseAddr("10.82.3.250"))
	if err != nil {
		return err
	}
	pool := config.Defaults().Pool
	// Cold: an agent that starts with nothing and keeps nothing warm, so
	// every ADD of the burst waits for the cloud.
	cold := pool
	cold.WarmTarget = 0
	var batch, burstAdds []time.Duration
	var burstCalls []int64
	for r := range *rounds {
		one, err := timeBatch(ctx, prov, *burst)
		if err != nil {
			return err
		}
		batch = append(batch, one)
		agent, cni, err := b.agent(fmt.Sprintf("burst%d", r), cold, 400)
		if err != nil {
			return err
		}
		before := assignCalls(agent)
		adds, del, err := burstEach(ctx, b.tb, cni, fmt.Sprintf("k%d-", r), *burst)
		burstCalls = append(burstCalls, assignCalls(agent)-before)
		if err = errors.Join(err, del()); err != nil {
			return errors.Join(err, agent.Stop())
		}
		burstAdds = append(burstAdds, adds...)
		fmt.Fprintf(out, "cold burst %d: %d concurrent ADDs, p50 %.1f ms p99 %.1f ms, %d Neutron port updates; one batched update of %d addresses %.0f ms\n",
			r+1, *burst, ms(pct(adds, 50)), ms(pct(adds, 99)), burstCalls[r], *burst, ms(one))
		if err := agent.Stop(); err != nil {
			return err
		}
		// The next agent starts on an empty port, not on this one's
		// addresses (it would adopt them as free).
		if err := emptyNodePort(ctx, b); err != nil {
			return err
		}
	}
	batchMs := ms(medianDur(batch))

	agent, cni, err := b.agent("cold", cold, 400)
	if err != nil {
		return err
	}
	coldAdds, err := churnPods(ctx, b.tb, cni, "cold", *n)
	if err != nil {
		return err
	}
	if err := agent.Stop(); err != nil {
		return err
	}
	if err := emptyNodePort(ctx, b); err != nil {
		return err
	}

	// Warm, then churn: the default policy.
	agent, cni, err = b.agent("warm", pool, 400)
	if err != nil {
		return err
	}
	if err := waitWarm(agent, pool.WarmTarget); err != nil {
		return err
	}
	// Warm: each ADD once the pool is back at its warm target (the path a
	// pod takes when the pool does its job).
	var warmAdds []time.Duration
	for i := range *n {
		if err := waitWarm(agent, pool.WarmTarget); err != nil {
			return err
		}
		d, err := churnPods(ctx, b.tb, cni, fmt.Sprintf("w%d-", i), 1)
		if err != nil {
			return err
		}
		warmAdds = append(warmAdds, d...)
	}
	churnUntil := func(end time.Time, tag string) (int, error) {
		n := 0
		for ; time.Now().Before(end); n++ {
			if _, err := churnPods(ctx, b.tb, cni, fmt.Sprintf("%s%d-", tag, n), 1); err != nil {
				return n, err
			}
		}
		return n, nil
	}
	rampStart := calls(agent)
	rampPods, err := churnUntil(time.Now().Add(*ramp), "r")
	if err != nil {
		return err
	}
	before := calls(agent)
	rampPerPod := float64(before-rampStart) / float64(max(rampPods, 1))
	pods, err := churnUntil(time.Now().Add(*churnFor), "c")
	if err != nil {
		return err
	}
	perPod := float64(calls(agent)-before) / float64(max(pods, 1))

	coldP99, warmP99 := ms(pct(burstAdds, 99)), ms(pct(warmAdds, 99))
	slowest := slices.Clone(coldAdds)
	slices.Sort(slowest)
	slowest = slowest[max(len(slowest)-5, 0):]
	fmt.Fprintf(out, "sequential cold ADDs (warmTarget 0) in order: %v; the five slowest: %v; p50 %.1f ms p99 %.1f ms\n",
		roundAll(coldAdds), roundAll(slowest), ms(pct(coldAdds, 50)), ms(pct(coldAdds, 99)))
	fmt.Fprintf(out, "pool-bench: real neutron-server; default pool (warm %d, batch %d, maxFree %d, surplusGrace %s, cooldown %s); steady churn: %d pods over %s counted after a %s ramp (%d pods, %.3f calls per pod); cold = an agent with warmTarget 0; calls are HTTP requests\n",
		pool.WarmTarget, pool.BatchSize, pool.MaxFree, pool.SurplusGrace, config.Defaults().Cooldown, pods, *churnFor, *ramp, rampPods, rampPerPod)
	fmt.Fprintf(out, "one batched update of %d addresses: median %.0f ms of %v; cold burst (%d rounds of %d concurrent ADDs, port updates per burst %v) ADD p50 %.1f ms p99 %.1f ms (target <= %.0f ms: %s); warm ADD p50 %.1f ms p99 %.1f ms; calls per pod %.3f (target <= 0.125: %s)\n",
		*burst, batchMs, roundAll(batch), *rounds, *burst, burstCalls, ms(pct(burstAdds, 50)), coldP99, batchMs+100, met(coldP99 <= batchMs+100),
		ms(pct(warmAdds, 50)), warmP99, perPod, met(perPod <= 0.125))
	fmt.Fprintf(out, "pool-bench: calls_per_pod=%.3f cold_add_p99_ms=%.1f warm_add_p99_ms=%.1f batch_call_ms=%.0f\n", perPod, coldP99, warmP99, batchMs)
	return nil
}

// timeBatch times one Assign of k addresses (then gives them back).
func timeBatch(ctx context.Context, prov provider.Provider, k int) (time.Duration, error) {
	start := time.Now()
	got, err := prov.Assign(ctx, provider.AssignRequest{Count: k})
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if len(got) != k {
		return 0, fmt.Errorf("one batched update asked for %d addresses and got %d", k, len(got))
	}
	return took, prov.Release(ctx, provider.Addresses(got))
}

// assignCalls counts the agent's Neutron port updates (the PUTs that
// assign or release addresses).
func assignCalls(a *testbed.Agent) int64 {
	st, err := a.State()
	if err != nil {
		return -1
	}
	return st.Pool.ProviderCalls["PUT"]
}

// burstEach adds n pods at once, each in a fresh namespace, and returns
// each ADD's latency; del deletes the pods and their namespaces.
func burstEach(ctx context.Context, tb *testbed.Topology, cni *testbed.CNI, tag string, n int) (adds []time.Duration, del func() error, err error) {
	rts := make([]*libcni.RuntimeConf, 0, n)
	var names []string
	del = func() error {
		var errs []error
		for _, rt := range rts {
			errs = append(errs, cni.Del(ctx, rt))
		}
		deleteAll(names)
		return errors.Join(errs...)
	}
	for i := range n {
		name := fmt.Sprintf("%s-%s%d", tb.Prefix, tag, i)
		if err := netnsutil.Add(name); err != nil {
			return nil, del, err
		}
		names = append(names, name)
		rts = append(rts, testbed.Runtime(fmt.Sprintf("%s%d", tag, i), netnsutil.Path(name), "eth0", nil))
	}
	adds = make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			_, errs[i] = cni.Add(ctx, rts[i])
			adds[i] = time.Since(start)
		})
	}
	wg.Wait()
	return adds, del, errors.Join(errs...)
}

// emptyNodePort gives back every address vpcni holds on the bed's node
// port, with no agent running.
func emptyNodePort(ctx context.Context, b *neutronBed) error {
	p, err := openstack.New(ctx, b.osCfg, b.tb.NodeIP)
	if err != nil {
		return err
	}
	held, err := p.Held(ctx)
	if err != nil {
		return err
	}
	return p.Release(ctx, provider.Addresses(held))
}

// providerArg is the value of a -provider flag among args ("" if none).
func providerArg(args []string) string {
	for i, a := range args {
		name, v, hasV := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-") || name != "provider":
		case hasV:
			return v
		case i+1 < len(args):
			return args[i+1]
		}
	}
	return ""
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func roundAll(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond)
	}
	return out
}
