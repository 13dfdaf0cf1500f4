package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// The orphan the bench leaves for each restarted agent to remove: a veth
// with vpcni's alias that no record knows.
const (
	orphanID   = "rb-orphan"
	orphanPeer = "rb-orphan-peer"
)

// benchRestart measures how soon a restarted vpcnid serves again with many
// pods on the node, and how long its restore takes: N pods, then vpcnid is
// stopped with SIGTERM (and, in a second series, SIGKILL) and started again,
// each several times. The times count from just before the new vpcnid is
// exec'd (through `ip netns exec`: ~5 ms, and ~20 ms more until vpcnid's
// main runs, measured here):
//
//   - serve: the first answer to GET /v1/state, polled every 5 ms;
//   - ready log: the time stamp of its "vpcnid ready" log line;
//   - first ADD: a new pod's ADD through the plugin, tried from the moment
//     it serves and every 5 ms after a failure, succeeds;
//   - restore: the restore is visibly done. While the agent is down the
//     bench removes the proxy ARP entries of some pods (-break, 3: the
//     first, middle and last in the store's key order) and adds an orphan
//     link; restore is done when they are all wired again and the orphan
//     is gone. An agent that restores before it serves pays for that
//     damage before serving: ~20 ms per re-wired pod (its veth's deletion)
//     and ~20 ms for the orphan, measured here.
//
// The old agent's time from the signal to its exit is shown too: with
// SIGTERM the socket is closed for that long before the new agent starts.
//
// After each restart the agent must hold exactly the N pods plus the new
// one, each at the address it had, no address twice, and every pod must
// answer TCP from the neighbour host.
func benchRestart(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench restart", flag.ContinueOnError)
	n := fs.Int("pods", 200, "pods on the node while it restarts")
	restarts := fs.Int("restarts", 3, "restarts per way of stopping (the median counts)")
	parallel := fs.Int("parallel", 8, "concurrent ADDs, DELs and probes around the restarts (not timed)")
	agentBin := fs.String("agent-bin", "", "directory of the vpcnid to restart (default: beside vpcnictl)")
	keepLog := fs.String("keep-log", "", "copy the agent's log to this file at the end")
	broken := fs.Int("break", 3, "pods whose wiring is damaged before each start, spread over the store's key order (at least 1)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *n < 1 || *n > 900 {
		return errors.New("-pods must be between 1 and 900 (the range holds 960 addresses)")
	}
	if *broken < 1 || *broken > *n {
		return errors.New("-break must be between 1 and -pods")
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	if *agentBin == "" {
		*agentBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	// Pods on the segment's own subnet, so the neighbour reaches them
	// through the node's proxy ARP (the /26 holds gateway, node, neighbour).
	tb := testbed.New("vpcni-rbench", netip.MustParsePrefix("10.84.0.0/22"))
	if err := tb.Up(); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tb.Down()) }()
	cfg := tb.AgentConfig(tb.RunDir, "10.84.0.0/22", "10.84.0.0/26")
	agent, err := tb.StartAgent(*agentBin, cfg)
	if err != nil {
		return err
	}
	if *keepLog != "" {
		defer func() { err = errors.Join(err, copyFile(agent.LogPath, *keepLog)) }()
	}
	cni, err := tb.NewCNI([]string{bin}, filepath.Join(tb.RunDir, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-rbench", cfg.SocketPath))
	if err != nil {
		return err
	}
	b, err := newRestartBed(tb, cni, *agentBin, agent, *parallel, *broken)
	if err != nil {
		return err
	}
	defer b.close()

	start := time.Now()
	if err := b.addPods(ctx, *n); err != nil {
		return err
	}
	fmt.Fprintf(out, "restart-bench: %d pods on one node (static provider, routed veth), added in %.1f s; %d restarts per way of stopping; load average %s\n",
		*n, time.Since(start).Seconds(), *restarts, loadAvg())
	fmt.Fprintln(out, "times from the new vpcnid's exec: serve = first answer on the socket; first ADD = a new pod's ADD succeeds (tried from serve on);")
	fmt.Fprintf(out, "restore = %d pods whose proxy ARP entry was removed while the agent was down are wired again and an orphan link is gone; stop = the old agent's exit after the signal\n", *broken)
	fmt.Fprintf(out, "%-8s %4s %8s %10s %13s %13s %6s %11s\n", "signal", "run", "stop ms", "serve ms", "ready log ms", "first ADD ms", "tries", "restore ms")
	runs := map[string][]restartRun{}
	ways := []string{"SIGTERM", "SIGKILL"}
	for _, how := range ways {
		for r := range *restarts {
			run, err := b.restart(ctx, how, fmt.Sprintf("%s%d", strings.ToLower(how[3:]), r))
			if err != nil {
				return fmt.Errorf("%s restart %d: %w", how, r+1, err)
			}
			fmt.Fprintf(out, "%-8s %4d %s\n", how, r+1, run.row())
			runs[how] = append(runs[how], run)
		}
	}
	worst := time.Duration(0)
	for _, how := range ways {
		m := medianRun(runs[how])
		fmt.Fprintf(out, "%-8s %4s %s\n", how, "p50", m.row())
		worst = max(worst, m.serve)
	}
	fmt.Fprintf(out, "every restart: %d allocations (the pods and the new one), each pod at its address, no address twice, all answer TCP from the neighbour\n", *n+1)
	if err := b.delPods(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "target: serve <= 1000 ms at %d pods: %s\n", *n, met(ms(worst) <= 1000))
	fmt.Fprintf(out, "restart-bench: pods=%d serve_ms=%.0f\n", *n, ms(worst))
	return nil
}

// restartRun is one restart's times, from the new process's exec.
type restartRun struct {
	stop, serve, readyLog, add, restore time.Duration
	addTries                            int
	// verified: every pod checked (bench node-scale prints it).
	verified time.Duration
}

func (r restartRun) row() string {
	logged := "-"
	if r.readyLog > 0 {
		logged = fmt.Sprintf("%.0f", ms(r.readyLog))
	}
	return fmt.Sprintf("%8.1f %10.1f %13s %13.1f %6d %11.1f", ms(r.stop), ms(r.serve), logged, ms(r.add), r.addTries, ms(r.restore))
}

// medianRun takes each column's median on its own.
func medianRun(runs []restartRun) restartRun {
	col := func(f func(restartRun) time.Duration) time.Duration {
		var d []time.Duration
		for _, r := range runs {
			d = append(d, f(r))
		}
		return medianDur(d)
	}
	tries := col(func(r restartRun) time.Duration { return time.Duration(r.addTries) })
	return restartRun{
		stop:     col(func(r restartRun) time.Duration { return r.stop }),
		serve:    col(func(r restartRun) time.Duration { return r.serve }),
		readyLog: col(func(r restartRun) time.Duration { return r.readyLog }),
		add:      col(func(r restartRun) time.Duration { return r.add }),
		restore:  col(func(r restartRun) time.Duration { return r.restore }),
		addTries: int(tries),
	}
}

type benchPod struct {
	id   string // container ID: rb-0000, rb-0001, … sort as the store keys do
	ns   string
	ip   netip.Addr
	echo *netnsutil.EchoServer
}

// restartBed is the node the agent restarts on, with its pods.
type restartBed struct {
	tb        *testbed.Topology
	cni       *testbed.CNI
	agentBin  string
	agent     *testbed.Agent
	parallel  int
	node      *netlink.Handle // in the node namespace
	uplinkIdx int
	pods      []*benchPod
	broken    int
}

func newRestartBed(tb *testbed.Topology, cni *testbed.CNI, agentBin string, agent *testbed.Agent, parallel, broken int) (*restartBed, error) {
	ns, err := netns.GetFromPath(netnsutil.Path(tb.NodeNS()))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	uplink, err := h.LinkByName("eth0")
	if err != nil {
		h.Close()
		return nil, err
	}
	return &restartBed{tb: tb, cni: cni, agentBin: agentBin, agent: agent, parallel: max(parallel, 1), broken: broken, node: h, uplinkIdx: uplink.Attrs().Index}, nil
}

func (b *restartBed) close() {
	for _, p := range b.pods {
		if p != nil && p.echo != nil {
			p.echo.Close()
		}
	}
	b.node.Close()
}

// each runs f(0..n-1), b.parallel at a time.
func (b *restartBed) each(n int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, b.parallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (b *restartBed) addPods(ctx context.Context, n int) error {
	b.pods = make([]*benchPod, n)
	return b.each(n, func(i int) error {
		p := &benchPod{id: fmt.Sprintf("rb-%04d", i), ns: b.tb.PodNS(i)}
		b.pods[i] = p
		return b.addPod(ctx, p, nil)
	})
}

// addPod creates the pod's namespace and ADDs it once, or, with tries, until
// an ADD succeeds (counting the attempts); the pod then serves TCP echo.
func (b *restartBed) addPod(ctx context.Context, p *benchPod, tries *int) error {
	if err := netnsutil.Add(p.ns); err != nil {
		return err
	}
	rt := testbed.Runtime(p.id, netnsutil.Path(p.ns), "eth0", nil)
	for {
		res, err := b.cni.Add(ctx, rt)
		if tries != nil {
			*tries++
		}
		if err == nil {
			r, err := types100.GetResult(res)
			if err != nil {
				return err
			}
			if len(r.IPs) == 0 {
				return fmt.Errorf("ADD %s: no address in the result", p.id)
			}
			p.ip, _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
			p.echo, err = netnsutil.ServeEcho(netnsutil.Path(p.ns), testbed.HostPort(p.ip, echoPort))
			return err
		}
		if tries == nil || ctx.Err() != nil {
			return fmt.Errorf("ADD %s: %w", p.id, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *restartBed) delPod(ctx context.Context, p *benchPod) error {
	if p.echo != nil {
		p.echo.Close()
		p.echo = nil
	}
	err := b.cni.Del(ctx, testbed.Runtime(p.id, netnsutil.Path(p.ns), "eth0", nil))
	return errors.Join(err, netnsutil.Delete(p.ns))
}

func (b *restartBed) delPods(ctx context.Context) error {
	if err := b.each(len(b.pods), func(i int) error { return b.delPod(ctx, b.pods[i]) }); err != nil {
		return err
	}
	st, err := b.agent.State()
	if err != nil {
		return err
	}
	if len(st.Allocations) != 0 {
		return fmt.Errorf("%d allocations left after every pod's DEL", len(st.Allocations))
	}
	return nil
}

// marked are the pods whose wiring is damaged while the agent is down,
// spread evenly over the store's key order from the last one back (a
// restore that walks the records in order re-wires the last one last);
// with 3: the first, middle and last.
func (b *restartBed) marked() []*benchPod {
	n := len(b.pods)
	out := make([]*benchPod, 0, b.broken)
	for i := range b.broken {
		at := n - 1
		if b.broken > 1 {
			at = n - 1 - i*(n-1)/(b.broken-1)
		}
		out = append(out, b.pods[at])
	}
	return out
}

// damage gives the next agent something to restore: the marked pods lose
// their proxy ARP entry, and an orphan link appears.
func (b *restartBed) damage() error {
	for _, p := range b.marked() {
		n := &netlink.Neigh{LinkIndex: b.uplinkIdx, Family: netlink.FAMILY_V4, Flags: netlink.NTF_PROXY, IP: p.ip.AsSlice()}
		if err := b.node.NeighDel(n); err != nil {
			return fmt.Errorf("remove proxy ARP entry of %s: %w", p.ip, err)
		}
	}
	name := veth.HostIfName(orphanID, "eth0")
	if err := b.node.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: orphanPeer}); err != nil {
		return fmt.Errorf("orphan link: %w", err)
	}
	link, err := b.node.LinkByName(name)
	if err != nil {
		return err
	}
	return b.node.LinkSetAlias(link, veth.AliasPrefix+orphanID+"/eth0")
}

// restored says whether the marked pods are wired again and the orphan is
// gone.
func (b *restartBed) restored() bool {
	if _, err := b.node.LinkByName(veth.HostIfName(orphanID, "eth0")); err == nil {
		return false
	}
	neighs, err := b.node.NeighProxyList(b.uplinkIdx, netlink.FAMILY_V4)
	if err != nil {
		return false
	}
	have := map[netip.Addr]bool{}
	for _, n := range neighs {
		ip, _ := netip.AddrFromSlice(n.IP.To4())
		have[ip] = true
	}
	for _, p := range b.marked() {
		if !have[p.ip] {
			return false
		}
	}
	return true
}

// restart stops the agent (how: SIGTERM or SIGKILL), damages the node,
// starts the agent again and times it, checks what it holds and that every
// pod answers, and deletes the pod it added meanwhile.
func (b *restartBed) restart(ctx context.Context, how, tag string) (run restartRun, err error) {
	stop := time.Now()
	if how == "SIGTERM" {
		err = b.agent.Stop()
	} else {
		err = b.agent.Kill()
	}
	// A SIGKILL that took longer than its grace (the process waits for a
	// kernel lock on a loaded machine) still ended the agent.
	if err != nil && !(how == "SIGKILL" && b.agent.Exited()) {
		return run, err
	}
	run.stop = time.Since(stop)
	if err := b.damage(); err != nil {
		return run, err
	}
	probe := &benchPod{id: "rb-new-" + tag, ns: b.tb.Prefix + "-new-" + tag}
	defer func() { err = errors.Join(err, b.delPod(ctx, probe)) }()
	logFrom := int64(0)
	if fi, err := os.Stat(b.agent.LogPath); err == nil {
		logFrom = fi.Size()
	}

	// The timed part: at most a minute.
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	a, err := b.tb.LaunchAgent(b.agentBin, b.agent.Config)
	if err != nil {
		return run, err
	}
	b.agent = a
	var serveErr, addErr, restoreErr error
	served := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(served)
		serveErr = poll(tctx, a, "an answer on the socket", func() bool {
			c, cancel := context.WithTimeout(tctx, 5*time.Second)
			defer cancel()
			var st json.RawMessage
			return a.Client.Do(c, api.PathState, nil, &st) == nil
		})
		run.serve = time.Since(start)
	})
	wg.Go(func() {
		<-served
		if serveErr != nil {
			return
		}
		addErr = b.addPod(tctx, probe, &run.addTries)
		run.add = time.Since(start)
	})
	wg.Go(func() {
		restoreErr = poll(tctx, a, "the restore", b.restored)
		run.restore = time.Since(start)
	})
	wg.Wait()
	if err := errors.Join(serveErr, addErr, restoreErr); err != nil {
		return run, err
	}
	if t, ok := logLineTime(a.LogPath, logFrom, `msg="vpcnid ready"`); ok {
		run.readyLog = t.Sub(start)
	}
	err = b.verify(ctx, probe)
	run.verified = time.Since(start)
	return run, err
}

// poll checks cond every 5 ms until it holds, the agent exits or ctx ends.
func poll(ctx context.Context, a *testbed.Agent, what string, cond func() bool) error {
	for !cond() {
		if a.Exited() {
			log, _ := os.ReadFile(a.LogPath)
			return fmt.Errorf("vpcnid exited while the bench waited for %s: %s", what, tail(log, 2000))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// verify checks that the agent holds every pod at its address and the new
// one at another, and that every pod answers TCP from the neighbour.
func (b *restartBed) verify(ctx context.Context, probe *benchPod) error {
	st, err := b.agent.State()
	if err != nil {
		return err
	}
	want := map[string]netip.Addr{probe.id: probe.ip}
	for _, p := range b.pods {
		want[p.id] = p.ip
	}
	var problems []error
	seen := map[netip.Addr]string{}
	for _, al := range st.Allocations {
		if other, ok := seen[al.Address]; ok {
			problems = append(problems, fmt.Errorf("address %s handed out twice: %s and %s", al.Address, other, al.ContainerID))
		}
		seen[al.Address] = al.ContainerID
		if ip, ok := want[al.ContainerID]; !ok {
			problems = append(problems, fmt.Errorf("allocation of unknown container %s (%s)", al.ContainerID, al.Address))
		} else if ip != al.Address {
			problems = append(problems, fmt.Errorf("%s holds %s, had %s", al.ContainerID, al.Address, ip))
		}
	}
	if len(st.Allocations) != len(want) || st.Pool.Allocated != len(want) {
		problems = append(problems, fmt.Errorf("%d allocations, pool counts %d allocated; want %d", len(st.Allocations), st.Pool.Allocated, len(want)))
	}
	if len(problems) > 0 {
		return errors.Join(problems...)
	}
	all := append([]*benchPod{probe}, b.pods...)
	nbr := netnsutil.Path(b.tb.NbrNS())
	return b.each(len(all), func(i int) error {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if err := netnsutil.Probe(c, nbr, testbed.HostPort(all[i].ip, echoPort)); err != nil {
			return fmt.Errorf("pod %s (%s) does not answer: %w", all[i].id, all[i].ip, err)
		}
		return nil
	})
}

// logLineTime is the time stamp of the first line after offset from that
// contains substr (slog's text format: time=… first).
func logLineTime(path string, offset int64, substr string) (time.Time, bool) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return time.Time{}, false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, substr) {
			continue
		}
		stamp, ok := strings.CutPrefix(strings.Fields(line)[0], "time=")
		if !ok {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339Nano, stamp)
		return t, err == nil
	}
	return time.Time{}, false
}

func tail(b []byte, n int) []byte { return b[max(len(b)-n, 0):] }

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o600)
}
