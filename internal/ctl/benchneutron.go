package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchNeutron measures what vpcni asks of a real Neutron: calls per pod
// through the agent (steady churn, and a burst of 50 ADDs), one batched
// update of K addresses against K single ones (alternating which goes
// first), the first Assign of a provider that sat idle (a cold node's
// first ADD), and where an update's time goes as the port grows: N
// addresses onto a port already holding H of vpcni's, request by request.
func benchNeutron(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench neutron", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "http://127.0.0.1:19696/", "noauth Neutron endpoint (scripts/neutron.sh up)")
	k := fs.Int("k", 8, "addresses in the batched update")
	rounds := fs.Int("rounds", 6, "rounds of batched vs single updates, alternating which goes first")
	churn := fs.Int("churn", 40, "pods added and deleted one after another through vpcnid (0: skip the agent: calls_per_pod=NaN burst50_calls=-1)")
	cold := fs.Int("cold", 5, "idle providers whose first Assign of one address is timed")
	sizesFlag := fs.String("sizes", "8,32,100", "addresses per update in the port-size matrix (empty: skip the matrix)")
	heldFlag := fs.String("held", "0,100,250", "addresses of vpcni's the port already holds in the port-size matrix")
	samples := fs.Int("samples", 3, "samples of each cell of the port-size matrix")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sizes, err := intList(*sizesFlag)
	if err != nil {
		return fmt.Errorf("--sizes: %w", err)
	}
	helds, err := intList(*heldFlag)
	if err != nil {
		return fmt.Errorf("--held: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	b, err := newNeutronBed(ctx, *endpoint, "vpcni-nbench", "10.81.0.0/22")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.close()) }()
	rec, err := newRecorder(*endpoint)
	if err != nil {
		return err
	}
	defer rec.close()

	// 1. One batched update of K addresses vs K single ones, alternating.
	prov, err := b.vmProviderVia(ctx, netip.MustParseAddr("10.81.3.250"), rec.URL)
	if err != nil {
		return err
	}
	bs, err := alternateBatchSingle(ctx, rec, prov, *k, *rounds)
	if err != nil {
		return err
	}
	// Each part prints as it ends: a later part that fails (a loaded
	// server's timeouts) leaves the earlier figures standing.
	fmt.Fprintf(out, "batched update of %d addresses: %s, each %v; %d single updates: %s, each %v\n",
		*k, msSpread(bs.batch.took()), roundAll(bs.batch.took()), *k, msSpread(bs.single.took()), roundAll(bs.single.took()))
	fmt.Fprintf(out, "requests per batched Assign: %s; per Release of it: %s\n", bs.batch.requests(), bs.release.requests())

	// 2. A cold node's first Assign: providers that read their port and
	// then sat idle past any cache of it, as an agent does between its
	// start and the node's first pod.
	coldOps, err := coldAssigns(ctx, b, rec, *cold)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cold first Assign of 1 address (%d providers idle 11 s): %s; requests %s\n", len(coldOps), msSpread(coldOps.took()), coldOps.requests())

	// 3. N addresses onto a port holding H.
	var cells []sizeCell
	if len(sizes) > 0 {
		big, err := b.vmProviderVia(ctx, netip.MustParseAddr("10.81.3.251"), rec.URL)
		if err != nil {
			return err
		}
		if cells, err = portSizes(ctx, rec, big, helds, sizes, *samples, out); err != nil {
			return err
		}
	}

	// 4. Calls per pod through the agent, default pool policy; room for the
	// churn's cooling addresses plus the burst. --churn 0 skips it.
	pool := config.Defaults().Pool
	perPod, burstCalls, burstTook := math.NaN(), int64(-1), time.Duration(0)
	if *churn > 0 {
		if perPod, burstCalls, burstTook, err = agentCalls(ctx, b, pool, *churn); err != nil {
			return err
		}
	}

	fmt.Fprintf(out, "neutron-bench: real neutron-server (Debian Zed, noauth, MariaDB) at %s; K=%d, %d rounds alternating which side goes first; churn of %d pods through vpcnid (pool warm %d, batch %d, maxFree %d, cooldown %s); burst of 50 ADDs took %s; calls are HTTP requests; times are median [p25–p75]\n",
		*endpoint, *k, *rounds, *churn, pool.WarmTarget, pool.BatchSize, pool.MaxFree, config.Defaults().Cooldown, burstTook.Round(time.Millisecond))
	fmt.Fprintf(out, "neutron-bench: calls_per_pod=%.3f burst50_calls=%d batch_put_ms=%.0f single_puts_ms=%.0f rounds=%d batch_put_p25_ms=%.0f batch_put_p75_ms=%.0f single_puts_p25_ms=%.0f single_puts_p75_ms=%.0f assign_requests=%.1f release_requests=%.1f cold_assign_ms=%.0f cold_assign_requests=%.1f",
		perPod, burstCalls, ms(medianDur(bs.batch.took())), ms(medianDur(bs.single.took())), *rounds,
		ms(pct(bs.batch.took(), 25)), ms(pct(bs.batch.took(), 75)), ms(pct(bs.single.took(), 25)), ms(pct(bs.single.took(), 75)),
		bs.batch.meanRequests(), bs.release.meanRequests(), ms(medianDur(coldOps.took())), coldOps.meanRequests())
	for _, c := range cells {
		fmt.Fprintf(out, " put%d_on%d_ms=%.0f", c.n, c.held, ms(medianDur(c.assign.took())))
	}
	fmt.Fprintln(out)
	return nil
}

// agentCalls counts the Neutron requests of vpcnid per pod under a churn
// of n pods, and for a burst of 50 ADDs.
func agentCalls(ctx context.Context, b *neutronBed, pool config.Pool, n int) (perPod float64, burstCalls int64, burstTook time.Duration, err error) {
	agent, cni, err := b.agent("nbench", pool, 200)
	if err != nil {
		return 0, 0, 0, err
	}
	if err := waitWarm(agent, pool.WarmTarget); err != nil {
		return 0, 0, 0, err
	}
	before := calls(agent)
	if _, err := churnPods(ctx, b.tb, cni, "churn", n); err != nil {
		return 0, 0, 0, err
	}
	perPod = float64(calls(agent)-before) / float64(n)
	before = calls(agent)
	if burstTook, err = burstPods(ctx, b.tb, cni, 50); err != nil {
		return 0, 0, 0, err
	}
	return perPod, calls(agent) - before, burstTook, nil
}

// op is one provider call: how long it took and the requests it made.
type op struct {
	took time.Duration
	reqs []request
}

type ops []op

// timed runs f and records its time and requests.
func timed(rec *recorder, f func() error) (op, error) {
	m := rec.mark()
	start := time.Now()
	err := f()
	return op{took: time.Since(start), reqs: rec.since(m)}, err
}

func (o ops) took() []time.Duration {
	out := make([]time.Duration, len(o))
	for i := range o {
		out[i] = o[i].took
	}
	return out
}

// put is the time of each call's PUT requests.
func (o ops) put() []time.Duration {
	out := make([]time.Duration, len(o))
	for i := range o {
		for _, r := range o[i].reqs {
			if r.method == "PUT" {
				out[i] += r.took
			}
		}
	}
	return out
}

func (o ops) meanRequests() float64 {
	if len(o) == 0 {
		return 0
	}
	n := 0
	for i := range o {
		n += len(o[i].reqs)
	}
	return float64(n) / float64(len(o))
}

// requests says how many requests a call made on average, by method and
// path, with their median time.
func (o ops) requests() string {
	if len(o) == 0 {
		return "none"
	}
	type key struct{ method, path string }
	count := map[key]int{}
	took := map[key][]time.Duration{}
	var order []key
	for i := range o {
		for _, r := range o[i].reqs {
			k := key{r.method, strings.TrimPrefix(r.path, "/v2.0")}
			if _, ok := count[k]; !ok {
				order = append(order, k)
			}
			count[k]++
			took[k] = append(took[k], r.took)
		}
	}
	parts := []string{fmt.Sprintf("%.1f", o.meanRequests())}
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s %s ×%.1f %.0f ms", k.method, k.path, float64(count[k])/float64(len(o)), ms(medianDur(took[k]))))
	}
	return parts[0] + " (" + strings.Join(parts[1:], ", ") + ")"
}

// msSpread is "median [p25–p75] ms" of durations.
func msSpread(d []time.Duration) string {
	v := make([]float64, len(d))
	for i, x := range d {
		v[i] = ms(x)
	}
	return spreadOf(v).format("%.0f") + " ms"
}

type batchSingle struct{ batch, single, release ops }

// alternateBatchSingle times one Assign of k addresses against k Assigns
// of one, request by request, for the given rounds; odd rounds run the single ones first, so neither
// side always meets the server just after the other's release.
func alternateBatchSingle(ctx context.Context, rec *recorder, prov provider.Provider, k, rounds int) (bs batchSingle, err error) {
	batch := func() error {
		var got []alloc.Lease
		o, err := timed(rec, func() (err error) {
			got, err = prov.Assign(ctx, provider.AssignRequest{Count: k})
			return err
		})
		if err != nil {
			return err
		}
		bs.batch = append(bs.batch, o)
		o, err = timed(rec, func() error { return prov.Release(ctx, provider.Addresses(got)) })
		bs.release = append(bs.release, o)
		return err
	}
	single := func() error {
		var all []netip.Addr
		o, err := timed(rec, func() error {
			for range k {
				got, err := prov.Assign(ctx, provider.AssignRequest{Count: 1})
				if err != nil {
					return err
				}
				all = append(all, provider.Addresses(got)...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		bs.single = append(bs.single, o)
		return prov.Release(ctx, all)
	}
	for r := range rounds {
		first, second := batch, single
		if r%2 == 1 {
			first, second = single, batch
		}
		if err := first(); err != nil {
			return bs, err
		}
		if err := second(); err != nil {
			return bs, err
		}
	}
	return bs, nil
}

// batchVsSingle times one Assign of k addresses against k Assigns of one,
// for the given rounds, odd rounds running the single ones first (bench
// pool's yardstick).
func batchVsSingle(ctx context.Context, prov provider.Provider, k, rounds int) (batch, single []time.Duration, err error) {
	doBatch := func() error {
		start := time.Now()
		got, err := prov.Assign(ctx, provider.AssignRequest{Count: k})
		if err != nil {
			return err
		}
		batch = append(batch, time.Since(start))
		return prov.Release(ctx, provider.Addresses(got))
	}
	doSingle := func() error {
		start := time.Now()
		var all []netip.Addr
		for range k {
			got, err := prov.Assign(ctx, provider.AssignRequest{Count: 1})
			if err != nil {
				return err
			}
			all = append(all, provider.Addresses(got)...)
		}
		single = append(single, time.Since(start))
		return prov.Release(ctx, all)
	}
	for r := range rounds {
		first, second := doBatch, doSingle
		if r%2 == 1 {
			first, second = doSingle, doBatch
		}
		if err := first(); err != nil {
			return nil, nil, err
		}
		if err := second(); err != nil {
			return nil, nil, err
		}
	}
	return batch, single, nil
}

// coldAssigns makes n VM ports with a provider each, lets them sit idle
// for 11 s (past the 10 s for which a provider may trust its copy of the
// port) and times the first Assign of one address on each in turn.
func coldAssigns(ctx context.Context, b *neutronBed, rec *recorder, n int) (ops, error) {
	provs := make([]*openstack.Provider, n)
	for i := range n {
		p, err := b.vmProviderVia(ctx, netip.MustParseAddr(fmt.Sprintf("10.81.3.%d", 230+i)), rec.URL)
		if err != nil {
			return nil, err
		}
		provs[i] = p
	}
	time.Sleep(11 * time.Second)
	var out ops
	for _, p := range provs {
		var got []alloc.Lease
		o, err := timed(rec, func() (err error) {
			got, err = p.Assign(ctx, provider.AssignRequest{Count: 1})
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, o)
		if err := p.Release(ctx, provider.Addresses(got)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sizeCell: n addresses assigned to and released from a port holding
// held of vpcni's.
type sizeCell struct {
	held, n         int
	assign, release ops
}

// portSizes fills the port to each of helds in turn and, samples times,
// assigns and releases each of sizes on it.
func portSizes(ctx context.Context, rec *recorder, prov provider.Provider, helds, sizes []int, samples int, out io.Writer) ([]sizeCell, error) {
	var cells []sizeCell
	var base []netip.Addr // the port's held addresses
	for _, h := range helds {
		if h > len(base) {
			got, err := prov.Assign(ctx, provider.AssignRequest{Count: h - len(base)})
			if err != nil {
				return nil, fmt.Errorf("fill the port to %d addresses: %w", h, err)
			}
			base = append(base, provider.Addresses(got)...)
		} else if h < len(base) {
			if err := prov.Release(ctx, base[h:]); err != nil {
				return nil, err
			}
			base = base[:h]
		}
		row := make([]sizeCell, len(sizes))
		for i, n := range sizes {
			row[i] = sizeCell{held: h, n: n}
		}
		for range samples {
			for i, n := range sizes {
				var got []alloc.Lease
				o, err := timed(rec, func() (err error) {
					got, err = prov.Assign(ctx, provider.AssignRequest{Count: n})
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("assign %d onto %d: %w", n, h, err)
				}
				row[i].assign = append(row[i].assign, o)
				o, err = timed(rec, func() error { return prov.Release(ctx, provider.Addresses(got)) })
				if err != nil {
					return nil, fmt.Errorf("release %d from %d: %w", n, h, err)
				}
				row[i].release = append(row[i].release, o)
			}
		}
		for _, c := range row {
			fmt.Fprintf(out, "port holding %3d, %3d more: Assign %s (its PUT %s), requests %s; Release %s (its PUT %s), requests %s\n",
				c.held, c.n, msSpread(c.assign.took()), msSpread(c.assign.put()), c.assign.requests(),
				msSpread(c.release.took()), msSpread(c.release.put()), c.release.requests())
		}
		cells = append(cells, row...)
	}
	return cells, prov.Release(ctx, base)
}

// intList parses "8,32,100".
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, n)
	}
	return out, nil
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
