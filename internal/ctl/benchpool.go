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
	"time"

	"github.com/vpcni/vpcni/internal/config"
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

	// The yardstick: one batched update of a batch's worth of addresses.
	prov, err := b.vmProvider(ctx, netip.MustParseAddr("10.82.3.250"))
	if err != nil {
		return err
	}
	pool := config.Defaults().Pool
	batch, _, err := batchVsSingle(ctx, prov, pool.BatchSize, 3)
	if err != nil {
		return err
	}
	batchMs := ms(medianDur(batch))

	// Cold: an agent that starts with nothing and keeps nothing warm.
	cold := pool
	cold.WarmTarget = 0
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

	coldP99, warmP99 := ms(pct(coldAdds, 99)), ms(pct(warmAdds, 99))
	slowest := slices.Clone(coldAdds)
	slices.Sort(slowest)
	slowest = slowest[max(len(slowest)-5, 0):]
	fmt.Fprintf(out, "cold ADDs in order: %v; the five slowest: %v\n", roundAll(coldAdds), roundAll(slowest))
	fmt.Fprintf(out, "pool-bench: real neutron-server; default pool (warm %d, batch %d, maxFree %d, surplusGrace %s, cooldown %s); steady churn: %d pods over %s counted after a %s ramp (%d pods, %.3f calls per pod); cold = an agent with warmTarget 0; calls are HTTP requests\n",
		pool.WarmTarget, pool.BatchSize, pool.MaxFree, pool.SurplusGrace, config.Defaults().Cooldown, pods, *churnFor, *ramp, rampPods, rampPerPod)
	fmt.Fprintf(out, "one batched update of %d addresses: %.0f ms; cold ADD p50 %.1f ms p99 %.1f ms (target <= %.0f ms: %s); warm ADD p50 %.1f ms p99 %.1f ms; calls per pod %.3f (target <= 0.125: %s)\n",
		pool.BatchSize, batchMs, ms(pct(coldAdds, 50)), coldP99, batchMs+100, met(coldP99 <= batchMs+100),
		ms(pct(warmAdds, 50)), warmP99, perPod, met(perPod <= 0.125))
	fmt.Fprintf(out, "pool-bench: calls_per_pod=%.3f cold_add_p99_ms=%.1f warm_add_p99_ms=%.1f\n", perPod, coldP99, warmP99)
	return nil
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
