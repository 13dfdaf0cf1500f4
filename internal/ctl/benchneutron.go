package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchNeutron measures what vpcni asks of a real Neutron: calls per pod
// through the agent (steady churn, and a burst of 50 ADDs), and one batched
// update of K addresses against K single ones.
func benchNeutron(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench neutron", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "http://127.0.0.1:19696/", "noauth Neutron endpoint (scripts/neutron.sh up)")
	k := fs.Int("k", 8, "addresses in the batched update")
	rounds := fs.Int("rounds", 3, "alternating rounds of batched vs single updates")
	churn := fs.Int("churn", 40, "pods added and deleted one after another")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	b, err := newNeutronBed(ctx, *endpoint, "vpcni-nbench", "10.81.0.0/22")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.close()) }()

	// 1. One batched update of K addresses vs K single ones, alternating.
	prov, err := b.vmProvider(ctx, netip.MustParseAddr("10.81.3.250"))
	if err != nil {
		return err
	}
	batch, single, err := batchVsSingle(ctx, prov, *k, *rounds)
	if err != nil {
		return err
	}

	// 2. Calls per pod through the agent, default pool policy; room for the
	// churn's cooling addresses plus the burst.
	pool := config.Defaults().Pool
	agent, cni, err := b.agent("nbench", pool, 200)
	if err != nil {
		return err
	}
	if err := waitWarm(agent, pool.WarmTarget); err != nil {
		return err
	}
	before := calls(agent)
	if _, err := churnPods(ctx, b.tb, cni, "churn", *churn); err != nil {
		return err
	}
	perPod := float64(calls(agent)-before) / float64(*churn)

	before = calls(agent)
	burstTook, err := burstPods(ctx, b.tb, cni, 50)
	if err != nil {
		return err
	}
	burstCalls := calls(agent) - before

	fmt.Fprintf(out, "neutron-bench: real neutron-server (Debian Zed, noauth, MariaDB) at %s; K=%d, %d rounds; churn of %d pods through vpcnid (pool warm %d, batch %d, maxFree %d, cooldown %s); burst of 50 ADDs took %s; calls are HTTP requests\n",
		*endpoint, *k, *rounds, *churn, pool.WarmTarget, pool.BatchSize, pool.MaxFree, config.Defaults().Cooldown, burstTook.Round(time.Millisecond))
	fmt.Fprintf(out, "batched update of %d addresses: %v; %d single updates: %v\n", *k, batch, *k, single)
	fmt.Fprintf(out, "neutron-bench: calls_per_pod=%.3f burst50_calls=%d batch_put_ms=%.0f single_puts_ms=%.0f\n",
		perPod, burstCalls, ms(medianDur(batch)), ms(medianDur(single)))
	return nil
}

// batchVsSingle times one Assign of k addresses against k Assigns of one,
// alternating for the given rounds.
func batchVsSingle(ctx context.Context, prov provider.Provider, k, rounds int) (batch, single []time.Duration, err error) {
	for range rounds {
		start := time.Now()
		got, err := prov.Assign(ctx, provider.AssignRequest{Count: k})
		if err != nil {
			return nil, nil, err
		}
		batch = append(batch, time.Since(start))
		if err := prov.Release(ctx, provider.Addresses(got)); err != nil {
			return nil, nil, err
		}
		start = time.Now()
		var all []netip.Addr
		for range k {
			got, err := prov.Assign(ctx, provider.AssignRequest{Count: 1})
			if err != nil {
				return nil, nil, err
			}
			all = append(all, provider.Addresses(got)...)
		}
		single = append(single, time.Since(start))
		if err := prov.Release(ctx, all); err != nil {
			return nil, nil, err
		}
	}
	return batch, single, nil
}

// churnPods adds and deletes n pods one after another, each in a fresh
// namespace, and returns the ADD latencies.
func churnPods(ctx context.Context, tb *testbed.Topology, cni *testbed.CNI, tag string, n int) ([]time.Duration, error) {
	var adds []time.Duration
	for i := range n {
		name := fmt.Sprintf("%s-%s%d", tb.Prefix, tag, i)
		if err := netnsutil.Add(name); err != nil {
			return nil, err
		}
		rt := testbed.Runtime(fmt.Sprintf("%s-%d", tag, i), netnsutil.Path(name), "eth0", nil)
		start := time.Now()
		if _, err := cni.Add(ctx, rt); err != nil {
			return nil, fmt.Errorf("%s ADD: %w", tag, err)
		}
		adds = append(adds, time.Since(start))
		if err := cni.Del(ctx, rt); err != nil {
			return nil, err
		}
		_ = netnsutil.Delete(name)
	}
	return adds, nil
}

// burstPods adds n pods at once and says how long it took.
func burstPods(ctx context.Context, tb *testbed.Topology, cni *testbed.CNI, n int) (time.Duration, error) {
	rts := make([]*libcni.RuntimeConf, n)
	for i := range n {
		name := fmt.Sprintf("%s-b%d", tb.Prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return 0, err
		}
		rts[i] = testbed.Runtime(fmt.Sprintf("burst-%d", i), netnsutil.Path(name), "eth0", nil)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = cni.Add(ctx, rts[i]) })
	}
	wg.Wait()
	took := time.Since(start)
	return took, errors.Join(errs...)
}

func medianDur(d []time.Duration) time.Duration { return pct(d, 50) }
