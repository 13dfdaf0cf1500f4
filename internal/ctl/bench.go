package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benches are vpcnictl's benchmarks: bench runs them by name and the help
// lists them, so a new one cannot be missing from either.
var benches = []struct {
	name, what string
	run        func(args []string, out io.Writer) error
}{
	{"cni", "CNI ADD/DEL latency and bursts of concurrent ADDs on a one-node testbed, vpcni vs Debian's ptp+host-local", benchCNI},
	{"datapath", "on a two-node lab brought up in modes veth and ebpf by turns, pod to pod vs node to node, across the nodes and on one: iperf3 throughput, sockperf latency, TCP connect/request/response rate, medians and interquartile ranges", benchDatapath},
	{"neutron", "Neutron calls per pod through vpcnid, one batched update vs single ones (a real neutron-server at --endpoint)", benchNeutron},
	{"pool", "the pool policy on a real neutron-server (or --provider aws: the lab's EC2 endpoint in process, secondary IPs and prefixes): calls per pod under churn, cold ADD p99", benchPool},
	{"modes", "every datapath mode on a fresh two-node lab: ADD p50/p99, pod/node throughput ratio, TCP request/response latency", benchModes},
	{"garp", "a pod's address moves from n1 to n2 on a two-node lab: the legacy VM's outage with vpcni's gratuitous ARP and without", benchGARP},
	{"selfheal", "each piece of the datapath taken away under pod churn: time until the agent puts it back, with the kernel watch and with the timer alone", benchSelfHeal},
	{"route-budget", "one block per node on a router with fewer routes (the lab's Neutron endpoint): blocks routed, blocks reported with the fix, refused writes, then the limit raised", benchRouteBudget},
	{"restart", "vpcnid restarted with N pods (default 200): time until it serves, the first ADD, the background restore", benchRestart},
	{"node-scale", "one node at 250 pods (and at 0 and 100 for the ratios), vpcnid in Kubernetes mode against a kube-apiserver of its own: restart to serving, a node reconcile pass, RSS and CPU at rest, the kernel watch's cost", benchNodeScale},
}

func bench(args []string, out io.Writer) error {
	names := make([]string, len(benches))
	for i, b := range benches {
		if len(args) > 0 && args[0] == b.name {
			return b.run(args[1:], out)
		}
		names[i] = b.name
	}
	return usageError{"bench: name one of " + strings.Join(names, "|")}
}

// plugin is one CNI plugin under benchmark.
type plugin struct {
	name   string
	cni    *testbed.CNI
	add    []time.Duration
	del    []time.Duration
	bursts []float64 // pods per second
	netns  int       // next pod namespace index
	prefix string
	source string // where its addresses come from
}

// benchCNI measures vpcni against Debian's ptp+host-local in the same run,
// alternating between them: sequential ADD+DEL latency and a burst of
// concurrent ADDs. Both are driven through libcni from inside the node's
// namespace, each pod in a fresh namespace, as a runtime does. vpcni
// answers from a warm pool, ptp+host-local from files on local disk: no
// cloud call on either side, and the output says so.
func benchCNI(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench cni", flag.ContinueOnError)
	n := fs.Int("n", 100, "sequential ADD+DEL per plugin (split over the rounds)")
	p := fs.Int("burst", 50, "concurrent ADDs in one burst")
	rounds := fs.Int("rounds", 5, "alternating rounds")
	burstRounds := fs.Int("burst-rounds", 3, "rounds that include a burst")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	tb := testbed.New("vpcni-bench", netip.MustParsePrefix("10.79.0.0/24"))
	if err := tb.Up(); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tb.Down()) }()

	// A warm pool, production defaults otherwise (30 s cooldown, so the
	// range must outlast the run).
	cfg := tb.AgentConfig(tb.RunDir, "10.79.0.0/16", "10.79.0.0/24")
	agent, err := tb.StartAgent(bin, cfg)
	if err != nil {
		return err
	}
	if err := waitWarm(agent, cfg.Pool.WarmTarget); err != nil {
		return err
	}
	vpcni, err := tb.NewCNI([]string{bin}, filepath.Join(tb.RunDir, "cache-vpcni"), testbed.VpcniConfList("1.0.0", "vpcni-bench", cfg.SocketPath))
	if err != nil {
		return err
	}
	ptpConf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "ptp-bench",
		"plugins": []map[string]any{{
			"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.80.0.0/16"}}}, "dataDir": filepath.Join(tb.RunDir, "host-local")},
		}},
	})
	ptp, err := tb.NewCNI([]string{testbed.DebianCNIDir}, filepath.Join(tb.RunDir, "cache-ptp"), ptpConf)
	if err != nil {
		return err
	}
	plugins := []*plugin{{name: "vpcni", cni: vpcni, prefix: "v", source: "warm pool"}, {name: "ptp+host-local", cni: ptp, prefix: "p", source: "host-local files"}}

	fmt.Fprintf(out, "cni-bench: %d sequential ADD+DEL and bursts of %d concurrent ADDs per plugin, %d alternating rounds, vpcni pool warm (target %d), CNI 1.0.0, each pod in a fresh netns\n",
		*n, *p, *rounds, cfg.Pool.WarmTarget)
	// Neither side asks a cloud for an address here: the ratios compare
	// the plugins' own work on the node, not where addresses come from (a
	// cold pool's cloud call is bench pool's figure).
	fmt.Fprintf(out, "cni-bench: address sources: vpcni from the agent's warm pool (addresses it already holds from the cloud; no cloud call on these ADDs), ptp+host-local from files on local disk (host-local's dataDir); a pool that has run dry waits on the cloud instead: vpcnictl bench pool measures that\n")
	ctx := context.Background()
	perRound := max(*n / *rounds, 1)
	for r := range *rounds {
		order := plugins
		if r%2 == 1 {
			order = []*plugin{plugins[1], plugins[0]}
		}
		for _, pl := range order {
			if err := seq(ctx, tb, pl, perRound); err != nil {
				return fmt.Errorf("%s: %w", pl.name, err)
			}
		}
		if r < *burstRounds {
			for _, pl := range order {
				if err := burst(ctx, tb, pl, *p); err != nil {
					return fmt.Errorf("%s burst: %w", pl.name, err)
				}
			}
		}
	}

	fmt.Fprintf(out, "%-16s %9s %9s %9s %9s %12s  %s\n", "plugin", "ADD p50", "ADD p99", "DEL p50", "DEL p99", "burst pods/s", "addresses from")
	for _, pl := range plugins {
		fmt.Fprintf(out, "%-16s %7.2fms %7.2fms %7.2fms %7.2fms %12.1f  %s\n", pl.name,
			ms(pct(pl.add, 50)), ms(pct(pl.add, 99)), ms(pct(pl.del, 50)), ms(pct(pl.del, 99)), median(pl.bursts), pl.source)
	}
	v, q := plugins[0], plugins[1]
	addRatio := ms(pct(v.add, 50)) / ms(pct(q.add, 50))
	delRatio := ms(pct(v.del, 50)) / ms(pct(q.del, 50))
	burstRatio := median(v.bursts) / median(q.bursts)
	addP99 := ms(pct(v.add, 99))
	check := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(out, "targets: ADD p50 %.2fx ptp (<= 0.4: %s), ADD p99 %.1f ms (<= 25: %s), DEL p50 %.2fx ptp (<= 0.3: %s), burst %.1fx ptp (>= 2.5: %s)\n",
		addRatio, check(addRatio <= 0.4), addP99, check(addP99 <= 25), delRatio, check(delRatio <= 0.3), burstRatio, check(burstRatio >= 2.5))
	fmt.Fprintf(out, "cni-bench: add_p50_ratio=%.2f del_p50_ratio=%.2f burst_ratio=%.2f add_p99_ms=%.1f vpcni_addresses=warm_pool ptp_addresses=host_local_files\n", addRatio, delRatio, burstRatio, addP99)
	return nil
}

// seq runs k ADD+DEL pairs one after another, each in a fresh namespace.
func seq(ctx context.Context, tb *testbed.Topology, pl *plugin, k int) error {
	paths, names, err := namespaces(tb, pl, k)
	if err != nil {
		return err
	}
	defer deleteAll(names)
	for i, path := range paths {
		rt := testbed.Runtime(fmt.Sprintf("%s-seq-%d", pl.prefix, pl.netns+i), path, "eth0", nil)
		start := time.Now()
		if _, err := pl.cni.Add(ctx, rt); err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		pl.add = append(pl.add, time.Since(start))
		start = time.Now()
		if err := pl.cni.Del(ctx, rt); err != nil {
			return fmt.Errorf("DEL: %w", err)
		}
		pl.del = append(pl.del, time.Since(start))
	}
	pl.netns += k
	return nil
}

// burst runs k ADDs at once and records pods per second; then DELs them.
func burst(ctx context.Context, tb *testbed.Topology, pl *plugin, k int) error {
	paths, names, err := namespaces(tb, pl, k)
	if err != nil {
		return err
	}
	defer deleteAll(names)
	rts := make([]*libcni.RuntimeConf, k)
	for i, path := range paths {
		rts[i] = testbed.Runtime(fmt.Sprintf("%s-burst-%d", pl.prefix, pl.netns+i), path, "eth0", nil)
	}
	errs := make([]error, k)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range k {
		wg.Go(func() { _, errs[i] = pl.cni.Add(ctx, rts[i]) })
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	pl.bursts = append(pl.bursts, float64(k)/took.Seconds())
	for i := range k {
		wg.Go(func() { errs[i] = pl.cni.Del(ctx, rts[i]) })
	}
	wg.Wait()
	pl.netns += k
	return errors.Join(errs...)
}

// namespaces creates k fresh pod namespaces (not timed).
func namespaces(tb *testbed.Topology, pl *plugin, k int) (paths, names []string, err error) {
	for i := range k {
		name := fmt.Sprintf("%s-%s%d", tb.Prefix, pl.prefix, pl.netns+i)
		if err := netnsutil.Add(name); err != nil {
			deleteAll(names)
			return nil, nil, err
		}
		names = append(names, name)
		paths = append(paths, netnsutil.Path(name))
	}
	return paths, names, nil
}

func deleteAll(names []string) {
	for _, n := range names {
		_ = netnsutil.Delete(n)
	}
}

func waitWarm(a *testbed.Agent, target int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := a.State()
		if err == nil && st.Pool.Free >= target {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool did not warm up to %d free addresses: %v %+v", target, err, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
