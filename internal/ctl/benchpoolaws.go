package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/lab/imds"
	"github.com/vpcni/vpcni/internal/provider"
	awsprovider "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/store"
)

// awsPoolBench is what `bench pool --provider aws` runs: the pool policy
// over the real aws provider and address manager, against the lab's EC2
// endpoint in process (no namespaces, no root). Durations are the
// agent's (its defaults unless set), so a run can be made short by
// shortening them together.
type awsPoolBench struct {
	Type   string        // instance type of the node
	Pods   int           // pods alive during the churn
	Rate   float64       // churn: pods replaced per second
	Ramp   time.Duration // churn before counting: the pool grows to rate × cooldown
	Ops    int           // pods replaced while counting
	Cold   int           // sequential ADDs on a node that keeps nothing warm
	Pool   config.Pool
	Cool   time.Duration // cooldown
	Resync time.Duration
	Seed   uint64
}

// awsChurn is one churn's count.
type awsChurn struct {
	rampOps, rampCalls int
	calls              map[string]int // during the counted ops, by action
}

func (c awsChurn) perPod(ops int) float64 { return float64(sum(c.calls)) / float64(max(ops, 1)) }

// awsCold is the cold ADDs of a node that keeps nothing warm.
type awsCold struct {
	adds    int
	cold    []time.Duration // ADDs that made an assign or an ENI
	withENI []time.Duration // of those, ADDs that made an ENI
}

func benchPoolAWS(args []string, out io.Writer) error {
	def := config.Defaults()
	b := awsPoolBench{Pool: def.Pool, Cool: def.Cooldown.Duration, Resync: def.Resync.Duration}
	fs := flag.NewFlagSet("bench pool --provider aws", flag.ContinueOnError)
	fs.String("provider", "aws", "aws (the lab's EC2 endpoint in process) or openstack (a real neutron-server)")
	fs.StringVar(&b.Type, "type", "c5n.18xlarge", "the node's instance type (its ENIs must hold pods + rate × cooldown + maxFree addresses)")
	fs.IntVar(&b.Pods, "pods", 20, "pods alive during the churn")
	fs.Float64Var(&b.Rate, "rate", 5, "churn: pods replaced per second")
	fs.DurationVar(&b.Ramp, "ramp", 45*time.Second, "churn before counting (at least the cooldown: the pool grows to rate × cooldown)")
	fs.IntVar(&b.Ops, "ops", 300, "pods replaced while counting")
	fs.IntVar(&b.Cold, "cold", 64, "sequential ADDs on a node with warmTarget 0, for the cold ADD latency")
	fs.IntVar(&b.Pool.WarmTarget, "warm", b.Pool.WarmTarget, "pool.warmTarget")
	fs.IntVar(&b.Pool.BatchSize, "batch", b.Pool.BatchSize, "pool.batchSize")
	fs.IntVar(&b.Pool.MaxFree, "max-free", b.Pool.MaxFree, "pool.maxFree")
	fs.DurationVar(&b.Pool.SurplusGrace.Duration, "surplus-grace", b.Pool.SurplusGrace.Duration, "pool.surplusGrace")
	fs.DurationVar(&b.Cool, "cooldown", b.Cool, "cooldown")
	fs.DurationVar(&b.Resync, "resync", b.Resync, "resync")
	fs.Uint64Var(&b.Seed, "seed", 1, "which pods the churn replaces")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	_, err := b.run(context.Background(), out)
	return err
}

// awsBenchFigures are a run's results, secondary-IP mode first, then
// prefix mode.
type awsBenchFigures struct {
	perPod [2]float64
	cold   [2]awsCold
}

// run measures secondary-IP and prefix mode, prints a few lines of figures
// and the summary line.
func (b awsPoolBench) run(ctx context.Context, out io.Writer) (f awsBenchFigures, err error) {
	lab, err := newEC2Lab()
	if err != nil {
		return f, err
	}
	defer lab.close()
	fmt.Fprintf(out, "aws pool bench: the lab's EC2 endpoint in process, instance type %s; pool warm %d, batch %d, maxFree %d, surplusGrace %s, cooldown %s, resync %s; calls are EC2 requests as the endpoint counts them\n",
		b.Type, b.Pool.WarmTarget, b.Pool.BatchSize, b.Pool.MaxFree, b.Pool.SurplusGrace, b.Cool, b.Resync)
	perPod, cold := &f.perPod, &f.cold
	for i, prefix := range []bool{false, true} {
		mode, target := "secondary IPs", 1.0/8
		if prefix {
			mode, target = "prefixes", 1.0/16
		}
		c, err := b.churn(ctx, lab, prefix)
		if err != nil {
			return f, fmt.Errorf("%s: churn: %w", mode, err)
		}
		perPod[i] = c.perPod(b.Ops)
		fmt.Fprintf(out, "%s: %d pods alive, one replaced %.1f times a second: ramp %d pods (%.3f calls per pod while the pool grows), then %d pods counted: %.3f calls per pod %v (target <= %.4f: %s)\n",
			mode, b.Pods, b.Rate, c.rampOps, float64(c.rampCalls)/float64(max(c.rampOps, 1)), b.Ops, perPod[i], byAction(c.calls), target, met(perPod[i] <= target))
		if cold[i], err = b.cold(ctx, lab, prefix); err != nil {
			return f, fmt.Errorf("%s: cold ADDs: %w", mode, err)
		}
		fmt.Fprintf(out, "%s: cold ADDs (warmTarget 0, batch %d): %d of %d ADDs called EC2, %d of them made an ENI: p50 %.1f ms p99 %.1f ms; with a new ENI: %v\n",
			mode, b.Pool.BatchSize, len(cold[i].cold), cold[i].adds, len(cold[i].withENI), ms(pct(cold[i].cold, 50)), ms(pct(cold[i].cold, 99)), roundAll(cold[i].withENI))
	}
	fmt.Fprintf(out, "aws-bench: calls_per_pod=%.3f prefix_calls_per_pod=%.3f cold_add_p99_ms=%.1f\n", perPod[0], perPod[1], ms(pct(cold[0].cold, 99)))
	return f, nil
}

// churn starts a node with the bench's pool, brings Pods pods up, then
// replaces one at random Rate times a second: for Ramp, then Ops times,
// counting the EC2 calls of the latter.
func (b awsPoolBench) churn(ctx context.Context, lab *ec2Lab, prefix bool) (c awsChurn, err error) {
	n, err := lab.node(ctx, b.Type, prefix, b.policy(b.Pool.WarmTarget))
	if err != nil {
		return c, err
	}
	defer func() { err = errors.Join(err, n.close()) }()
	rng := rand.New(rand.NewPCG(b.Seed, b.Seed))
	live := make([]netip.Addr, b.Pods)
	owner := func(i int) string { return fmt.Sprintf("pod-%d/eth0", i) }
	next := b.Pods
	owners := make([]string, b.Pods)
	for i := range live {
		owners[i] = owner(i)
		l, err := n.m.Take(ctx, owners[i])
		if err != nil {
			return c, err
		}
		live[i] = l.Address
	}
	// replace takes one pod down and a new one up, as a DEL and an ADD.
	replace := func() error {
		j := rng.IntN(len(live))
		if err := n.m.Release(owners[j], live[j], time.Now()); err != nil {
			return err
		}
		owners[j] = owner(next)
		next++
		l, err := n.m.Take(ctx, owners[j])
		live[j] = l.Address
		return err
	}
	every := time.Duration(float64(time.Second) / b.Rate)
	start, before := time.Now(), lab.calls()
	for i := 0; time.Since(start) < b.Ramp; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		if err := replace(); err != nil {
			return c, fmt.Errorf("ramp: %w", err)
		}
		c.rampOps++
	}
	counted := lab.calls()
	c.rampCalls = sum(counted) - sum(before)
	start = time.Now()
	for i := range b.Ops {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		if err := replace(); err != nil {
			return c, err
		}
	}
	c.calls = diff(lab.calls(), counted)
	return c, nil
}

// cold starts a node that keeps nothing warm (warmTarget 0) and ADDs Cold
// pods one after another: an ADD that finds the pool empty asks EC2 for a
// batch, and the one that fills the primary ENI makes an ENI.
func (b awsPoolBench) cold(ctx context.Context, lab *ec2Lab, prefix bool) (c awsCold, err error) {
	n, err := lab.node(ctx, b.Type, prefix, b.policy(0))
	if err != nil {
		return c, err
	}
	defer func() { err = errors.Join(err, n.close()) }()
	for i := range b.Cold {
		before := lab.calls()
		start := time.Now()
		if _, err := n.m.Take(ctx, fmt.Sprintf("cold-%d/eth0", i)); err != nil {
			return c, err
		}
		took := time.Since(start)
		d := diff(lab.calls(), before)
		c.adds++
		if d["AssignPrivateIpAddresses"]+d["CreateNetworkInterface"] > 0 {
			c.cold = append(c.cold, took)
		}
		if d["CreateNetworkInterface"] > 0 {
			c.withENI = append(c.withENI, took)
		}
	}
	return c, nil
}

func (b awsPoolBench) policy(warm int) addresses.Policy {
	p := b.Pool
	return addresses.Policy{WarmTarget: warm, BatchSize: p.BatchSize, MaxFree: max(p.MaxFree, warm), MinHeld: p.MinHeld,
		SurplusGrace: p.SurplusGrace.Duration, AddWait: p.AddWait.Duration, Cooldown: b.Cool, Resync: b.Resync}
}

// ec2Lab is the lab's EC2 endpoint served on loopback: a VPC with one
// subnet, where each node is an instance of its own with its instance
// metadata.
type ec2Lab struct {
	s        *ec2api.Server
	url      string
	subnetID string
	group    string
	srvs     []*http.Server
	next     byte // the next node's address in the subnet
}

func newEC2Lab() (*ec2Lab, error) {
	l := &ec2Lab{s: ec2api.New(ec2api.Options{}), next: 10}
	var err error
	if l.url, err = l.serve(l.s.Handler()); err != nil {
		return nil, err
	}
	cidr := netip.MustParsePrefix("10.84.0.0/16")
	vpc := l.s.AddVPC(cidr)
	if l.subnetID, err = l.s.AddSubnet(vpc, cidr, "us-east-1a"); err != nil {
		l.close()
		return nil, err
	}
	l.group = l.s.AddSecurityGroup(vpc, "vpcni-bench")
	return l, nil
}

// serve serves h on a loopback port until close.
func (l *ec2Lab) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	l.srvs = append(l.srvs, srv)
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

func (l *ec2Lab) close() {
	for _, s := range l.srvs {
		s.Close()
	}
	l.s.Close()
}

// calls are the endpoint's requests so far, by action.
func (l *ec2Lab) calls() map[string]int { return l.s.Calls() }

// benchNode is one instance with the aws provider and an address manager
// over it, running until close.
type benchNode struct {
	m      *addresses.Manager
	st     *store.Store
	dir    string
	cancel context.CancelFunc
	done   chan struct{}
}

// node runs a new instance of type typ and an address manager with the
// aws provider on it, and waits until the provider is connected.
func (l *ec2Lab) node(ctx context.Context, typ string, prefix bool, policy addresses.Policy) (_ *benchNode, err error) {
	l.next++
	inst, err := l.s.RunInstance(ec2api.RunOptions{Type: typ, SubnetID: l.subnetID, IP: netip.AddrFrom4([4]byte{10, 84, 255, l.next}),
		Groups: []string{l.group}, Role: "vpcni-node"})
	if err != nil {
		return nil, err
	}
	md, err := l.serve(imds.New(l.s, inst.ID, imds.Options{}))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "vpcni-aws-bench-")
	if err != nil {
		return nil, err
	}
	n := &benchNode{dir: dir, done: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.close())
		}
	}()
	if n.st, err = store.Open(dir); err != nil {
		return nil, err
	}
	cfg := awsprovider.Config{Endpoint: l.url, IMDSEndpoint: md, PrefixMode: prefix}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	runCtx, cancel := context.WithCancel(ctx)
	n.cancel = cancel
	connect := func(c context.Context) (provider.Provider, error) {
		// The provider's cleanup lives as long as the node, not the
		// connect attempt.
		return awsprovider.New(runCtx, cfg, provider.Node{Name: inst.ID, StateDir: dir, Log: log})
	}
	n.m = addresses.New(policy, inst.ID, connect, n.st, log)
	go func() { n.m.Run(runCtx); close(n.done) }()
	for deadline := time.Now().Add(30 * time.Second); n.m.Provider().Name == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the aws provider did not connect to the lab's endpoint: %s", n.m.Status(time.Now()).Reason)
		}
	}
	return n, nil
}

func (n *benchNode) close() error {
	if n.cancel != nil {
		n.cancel()
		<-n.done
	}
	var err error
	if n.st != nil {
		err = n.st.Close()
	}
	return errors.Join(err, os.RemoveAll(n.dir))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// diff is after - before, per action (the actions that changed).
func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// byAction prints calls as "(Action n, …)".
func byAction(calls map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(calls)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, calls[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
