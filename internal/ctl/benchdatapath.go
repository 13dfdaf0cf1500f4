package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchDatapath compares the routed modes' pod paths with the node's own,
// like with like: one two-node lab (the VPC segment: a bridge with port
// security) brought up afresh in mode veth and in mode ebpf by turns,
// round after round, the first mode alternating, so both modes run on the
// same pair of nodes under the same load. In each lab four paths:
//
//	node        node n1 -> node n2 (across the bridge, no pod)
//	node-local  node n1 -> its own address (the same-node control)
//	pod         a pod on n1 -> a pod on n2
//	pod-local   a pod on n1 -> another pod on n1
//
// each with TCP throughput (Debian's iperf3), request/response latency
// (sockperf ping-pong) and connect/request/response rate (a fresh TCP
// connection per one-byte exchange), the paths' order alternating too,
// client pinned to CPU 0 and server to CPU 1. A pod's ratio to the node is
// taken within its lab (the same minute, the same namespaces), and mode
// ebpf's to mode veth within its round; every figure is printed as the
// median over the rounds with its interquartile range: on a shared
// 2-core machine the rounds scatter more than the modes differ, and the
// range shows whether a difference stands out of the scatter.
//
// With --family 6 the lab's network has an IPv6 subnet too, the agents are
// dual-stack, and every path is measured between IPv6 addresses (the
// request/response latency by rrLatency: sockperf speaks no IPv6 here).
// Mode ebpf's IPv6 packets take its routed path, so its figures are mode
// veth's path with the fast path's programs attached.
func benchDatapath(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench datapath", flag.ContinueOnError)
	rounds := fs.Int("rounds", 10, "rounds; each brings the lab up in mode veth and in mode ebpf, the first alternating")
	secs := fs.Int("seconds", 2, "seconds per measurement")
	fam := fs.Int("family", 4, "4: IPv4 paths; 6: IPv6 paths on a dual-stack lab")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *rounds < 1 {
		return usageError{"bench datapath: --rounds must be at least 1"}
	}
	if *fam != 4 && *fam != 6 {
		return usageError{fmt.Sprintf("bench datapath: --family %d: want 4 or 6", *fam)}
	}
	for _, tool := range []string{"iperf3", "sockperf", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (make deps installs it)", tool)
		}
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*rounds)*10*time.Minute)
	defer cancel()
	start, load0 := time.Now(), loadAvg()
	byMode := map[string]measures{}
	modes := []string{"veth", "ebpf"}
	for r := range *rounds {
		order := slices.Clone(modes)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for i, mode := range order {
			m, err := datapathLab(ctx, bin, mode, r+i, *secs, *fam)
			if err != nil {
				return fmt.Errorf("round %d, mode %s: %w", r+1, mode, err)
			}
			byMode[mode] = byMode[mode].plus(m)
		}
	}
	rr := "sockperf TCP ping-pong"
	if *fam == 6 {
		rr = "a one-byte TCP ping-pong (sockperf 3.7 speaks no IPv6)"
	}
	fmt.Fprintf(out, "datapath-bench: a two-node lab VPC segment (bridge with port security) brought up in mode veth and in mode ebpf by turns, %d rounds (the first mode alternating); IPv%d paths in each: node n1 -> node n2, node n1 -> itself (the same-node control), pod on n1 -> pod on n2, pod -> pod on n1; iperf3 TCP, %s and TCP connect/request/response %d s each, client on CPU 0, server on CPU 1; median [interquartile range] over the rounds; %s\n",
		*rounds, *fam, rr, *secs, time.Since(start).Round(time.Second))
	// Every path is CPU-bound on CPU 0 (sender and every softirq hop of
	// the data), so anything else running there moves the numbers; the
	// load average says how busy the machine was.
	fmt.Fprintf(out, "load average at start %s, at end %s (above ~1.5 the rounds scatter by several Gbit/s); measurements taken twice after a failure: %d\n", load0, loadAvg(), retries.Load())
	v, e := byMode["veth"], byMode["ebpf"]
	rows := []struct {
		name string
		m    measures
		path string
	}{
		{"node", v.plus(e), "node"}, {"node-local", v.plus(e), "node-local"},
		{"veth", v, "pod"}, {"ebpf", e, "pod"}, {"veth-local", v, "pod-local"}, {"ebpf-local", e, "pod-local"},
	}
	fmt.Fprintf(out, "%-11s %-24s %-24s %s\n", "path", "Gbit/s", "RTT us", "CRR/s")
	for _, row := range rows {
		fmt.Fprintf(out, "%-11s %-24s %-24s %s\n", row.name, spreadOf(scaled(row.m.tput[row.path], 1e-9)).format("%.2f"),
			spreadOf(row.m.rtt[row.path]).format("%.1f"), spreadOf(row.m.crr[row.path]).format("%.0f"))
	}
	// Ratios round by round: a pod against the node in the same lab, mode
	// ebpf against mode veth in the same round.
	veth, ebpf := v.ratio("pod", v, "node"), e.ratio("pod", e, "node")
	vethLocal, ebpfLocal := v.ratio("pod-local", v, "node-local"), e.ratio("pod-local", e, "node-local")
	ebpfLocalNode := e.ratio("pod-local", e, "node")
	fast, fastLocal := e.ratio("pod", v, "pod"), e.ratio("pod-local", v, "pod-local")
	fmt.Fprintf(out, "%-28s %-22s %-22s %s\n", "ratio (round by round)", "throughput", "RR latency", "CRR rate")
	for _, row := range []struct {
		name string
		r    pathRatios
	}{
		{"veth / node", veth}, {"ebpf / node", ebpf}, {"veth-local / node-local", vethLocal}, {"ebpf-local / node-local", ebpfLocal},
		{"ebpf-local / node", ebpfLocalNode}, {"ebpf / veth", fast}, {"ebpf-local / veth-local", fastLocal},
	} {
		fmt.Fprintf(out, "%-28s %-22s %-22s %s\n", row.name, row.r.tput.format("%.2fx"), row.r.rr.format("%.2fx"), row.r.crr.format("%.2fx"))
	}
	fmt.Fprintf(out, "is the fast path faster? across nodes: throughput %s, latency %s, connection rate %s; on one node: throughput %s, latency %s, connection rate %s (than mode veth, by the ratios' interquartile range)\n",
		verdict(fast.tput, true), verdict(fast.rr, false), verdict(fast.crr, true),
		verdict(fastLocal.tput, true), verdict(fastLocal.rr, false), verdict(fastLocal.crr, true))
	if *fam == 4 {
		// The fast path's targets; its programs leave IPv6 to the stack.
		fmt.Fprintf(out, "targets (mode ebpf, across nodes): throughput %.2fx node (>= 0.97: %s), TCP_RR latency %.2fx node (<= 1.05: %s); on one node: throughput %.2fx and latency %.2fx the node on one node (beats it: %s)\n",
			ebpf.tput.med, met(ebpf.tput.med >= 0.97), ebpf.rr.med, met(ebpf.rr.med <= 1.05), ebpfLocal.tput.med, ebpfLocal.rr.med,
			met(ebpfLocal.tput.med > 1 && ebpfLocal.rr.med < 1))
	}
	// The lines scripts read since the first bench (mode veth), unchanged
	// for IPv4; IPv6's name their family after the mode.
	famKey := ""
	if *fam == 6 {
		famKey = " family=6"
	} else {
		overhead := spreadOf(diffs(v.rtt["pod"], v.rtt["node"]))
		fmt.Fprintf(out, "datapath-bench: tput_ratio=%.2f rtt_overhead_us=%.1f\n", veth.tput.med, overhead.med)
	}
	fmt.Fprintf(out, "datapath-bench: mode=veth%s tput_ratio=%.2f rr_ratio=%.2f crr_ratio=%.2f %s\n", famKey, veth.tput.med, veth.rr.med, veth.crr.med,
		moreKeys(*rounds, veth, vethLocal, pathRatios{}))
	fmt.Fprintf(out, "datapath-bench: mode=ebpf%s tput_ratio=%.2f rr_ratio=%.2f crr_ratio=%.2f %s\n", famKey, ebpf.tput.med, ebpf.rr.med, ebpf.crr.med,
		moreKeys(*rounds, ebpf, ebpfLocal, fast))
	return nil
}

// datapathLab brings the lab up in one mode, measures its four paths of
// family fam once (their order reversed on odd turns) and takes it down.
func datapathLab(ctx context.Context, bin, mode string, turn, secs, fam int) (_ measures, err error) {
	const prefix = "vpcni-dpbench"
	nc := labNodeConfig{Datapath: mode}
	if fam == 6 {
		nc.Subnet6 = "fd00:91::/64"
	}
	if err := labUp(prefix, 2, "10.91.0.0/24", true, nc, io.Discard); err != nil {
		return measures{}, err
	}
	defer func() { err = errors.Join(err, labDown(prefix, io.Discard)) }()
	st, err := readLabState(prefix)
	if err != nil {
		return measures{}, err
	}
	for _, n := range st.Nodes {
		s, err := (&testbed.Agent{Client: api.NewClient(n.Socket)}).State()
		if err != nil {
			return measures{}, err
		}
		// A node whose programs did not load would print mode veth's
		// figures as mode ebpf's.
		if mode == "ebpf" && !strings.HasPrefix(s.FastPath, "on") {
			return measures{}, fmt.Errorf("%s runs mode %s with its fast path %q: nothing to measure", n.Name, s.Datapath, s.FastPath)
		}
	}
	var clis []*testbed.CNI
	for _, n := range st.Nodes {
		cni, err := testbed.NewCNIIn(n.NS, []string{bin}, filepath.Join(labDir(prefix), n.Name, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-bench", n.Socket))
		if err != nil {
			return measures{}, err
		}
		clis = append(clis, cni)
	}
	// A pod on n1, one on n2, a second one on n1 (lab down removes their
	// namespaces with the lab's).
	var pods []end
	for i, node := range []int{0, 1, 0} {
		name := fmt.Sprintf("%s-pod%d", prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return measures{}, err
		}
		res, err := clis[node].Add(ctx, testbed.Runtime(fmt.Sprintf("dp-%d", i), netnsutil.Path(name), "eth0", nil))
		if err != nil {
			return measures{}, err
		}
		r, err := types100.GetResult(res)
		if err != nil {
			return measures{}, err
		}
		var ip netip.Addr
		for _, c := range r.IPs {
			if a, _ := netip.AddrFromSlice(c.Address.IP); (fam == 6) == (a.Unmap().Is6()) {
				ip = a.Unmap()
				break
			}
		}
		if !ip.IsValid() {
			return measures{}, fmt.Errorf("pod %d got no IPv%d address: %v", i, fam, r.IPs)
		}
		pods = append(pods, end{ns: name, ip: ip})
	}
	n1, n2 := end{ns: st.Nodes[0].NS, ip: st.Nodes[0].IP}, end{ns: st.Nodes[1].NS, ip: st.Nodes[1].IP}
	if fam == 6 {
		n1.ip, n2.ip = st.Nodes[0].IP6, st.Nodes[1].IP6
	}
	return comparePathsFrom(ctx, map[string][2]end{
		"node": {n1, n2}, "node-local": {n1, n1}, "pod": {pods[0], pods[1]}, "pod-local": {pods[0], pods[2]},
	}, turn, 1, secs)
}

// minVerdictRounds is the fewest rounds whose interquartile range the
// verdict reads.
const minVerdictRounds = 4

// pathRatios are one path's ratios to another over the rounds: throughput,
// request/response latency (lower is better), connection rate.
type pathRatios struct{ tput, rr, crr spread }

// ratio is path a of m against path b of o, round by round.
func (m measures) ratio(a string, o measures, b string) pathRatios {
	return pathRatios{spreadOf(ratios(m.tput[a], o.tput[b])), spreadOf(ratios(m.rtt[a], o.rtt[b])), spreadOf(ratios(m.crr[a], o.crr[b]))}
}

// plus is m with o's rounds appended, path by path.
func (m measures) plus(o measures) measures {
	out := measures{tput: map[string][]float64{}, rtt: map[string][]float64{}, crr: map[string][]float64{}}
	for _, x := range []measures{m, o} {
		for k, v := range x.tput {
			out.tput[k] = append(out.tput[k], v...)
		}
		for k, v := range x.rtt {
			out.rtt[k] = append(out.rtt[k], v...)
		}
		for k, v := range x.crr {
			out.crr[k] = append(out.crr[k], v...)
		}
	}
	return out
}

// verdict reads a ratio's interquartile range: "faster" only when all of
// it is on the better side of 1, and over enough rounds for quartiles to
// mean something.
func verdict(s spread, higherBetter bool) string {
	switch {
	case s.n < minVerdictRounds:
		return fmt.Sprintf("too few rounds to tell (%d, want %d or more)", s.n, minVerdictRounds)
	case s.contains(1):
		return fmt.Sprintf("no difference out of the scatter (%s)", s.format("%.2fx"))
	case (s.q1 > 1) == higherBetter:
		return fmt.Sprintf("faster (%s)", s.format("%.2fx"))
	default:
		return fmt.Sprintf("slower (%s)", s.format("%.2fx"))
	}
}

// moreKeys are the summary line's keys after the first three: the
// quartiles of the ratios to the node, the ratios to the node on one node
// and, for mode ebpf, to mode veth.
func moreKeys(rounds int, across, local, vsVeth pathRatios) string {
	s := fmt.Sprintf("tput_ratio_q1=%.2f tput_ratio_q3=%.2f rr_ratio_q1=%.2f rr_ratio_q3=%.2f crr_ratio_q1=%.2f crr_ratio_q3=%.2f local_tput_ratio=%.2f local_rr_ratio=%.2f local_crr_ratio=%.2f rounds=%d",
		across.tput.q1, across.tput.q3, across.rr.q1, across.rr.q3, across.crr.q1, across.crr.q3, local.tput.med, local.rr.med, local.crr.med, rounds)
	if vsVeth != (pathRatios{}) {
		s += fmt.Sprintf(" vs_veth_tput_ratio=%.2f vs_veth_tput_q1=%.2f vs_veth_tput_q3=%.2f vs_veth_rr_ratio=%.2f vs_veth_rr_q1=%.2f vs_veth_rr_q3=%.2f vs_veth_crr_ratio=%.2f",
			vsVeth.tput.med, vsVeth.tput.q1, vsVeth.tput.q3, vsVeth.rr.med, vsVeth.rr.q1, vsVeth.rr.q3, vsVeth.crr.med)
	}
	return s
}

func diffs(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]-b[i])
	}
	return out
}

func scaled(v []float64, k float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = k * x
	}
	return out
}

// end is one side of a measured path: a namespace and its address.
type end struct {
	ns string
	ip netip.Addr
}

// measures are per path and round: throughput in bits per second, TCP
// request/response round trips in µs, connect/request/response
// exchanges per second.
type measures struct{ tput, rtt, crr map[string][]float64 }

// comparePaths measures each path (client -> server) with iperf3, a
// sockperf TCP ping-pong and a TCP connect/request/response loop, in
// rounds that alternate the paths' order, servers on CPU 1 and clients on
// CPU 0.
func comparePaths(ctx context.Context, paths map[string][2]end, rounds, secs int) (measures, error) {
	return comparePathsFrom(ctx, paths, 0, rounds, secs)
}

// comparePathsFrom is comparePaths whose first round is round first of
// the alternation (odd: the paths in reverse order).
func comparePathsFrom(ctx context.Context, paths map[string][2]end, first, rounds, secs int) (_ measures, err error) {
	var servers []*exec.Cmd
	var closers []func()
	defer func() {
		for _, s := range servers {
			_ = s.Process.Kill()
			_ = s.Wait()
		}
		for _, c := range closers {
			c()
		}
	}()
	names := slices.Sorted(maps.Keys(paths))
	for _, k := range names {
		e := paths[k][1]
		servers6 := e.ip.Is6()
		argvs := [][]string{{"iperf3", "-s", "-B", e.ip.String()}}
		if servers6 {
			stop, err := rrServer(e.ns, netip.AddrPortFrom(e.ip, rrPort), 1)
			if err != nil {
				return measures{}, fmt.Errorf("%s RR server: %w", k, err)
			}
			closers = append(closers, stop)
		} else {
			argvs = append(argvs, []string{"sockperf", "sr", "--tcp", "-i", e.ip.String(), "-p", strconv.Itoa(rrPort)})
		}
		for _, argv := range argvs {
			cmd := exec.Command("ip", append([]string{"netns", "exec", e.ns, "taskset", "-c", "1"}, argv...)...)
			if err := cmd.Start(); err != nil {
				return measures{}, err
			}
			servers = append(servers, cmd)
		}
		stop, err := crrServer(e.ns, netip.AddrPortFrom(e.ip, crrPort), 1)
		if err != nil {
			return measures{}, fmt.Errorf("%s CRR server: %w", k, err)
		}
		closers = append(closers, stop)
	}
	time.Sleep(500 * time.Millisecond) // the servers bind
	m := measures{tput: map[string][]float64{}, rtt: map[string][]float64{}, crr: map[string][]float64{}}
	for r := first; r < first+rounds; r++ {
		order := slices.Clone(names)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			from, to := paths[k][0], paths[k][1]
			bps, err := retried(func() (float64, error) { return iperf(ctx, from.ns, to.ip, secs) })
			if err != nil {
				return measures{}, fmt.Errorf("%s iperf3: %w", k, err)
			}
			us, err := retried(func() (float64, error) {
				if to.ip.Is6() {
					return rrLatency(ctx, from.ns, netip.AddrPortFrom(to.ip, rrPort), secs, 0)
				}
				return sockperfRTT(ctx, from.ns, to.ip, secs)
			})
			if err != nil {
				return measures{}, fmt.Errorf("%s sockperf: %w", k, err)
			}
			rate, err := retried(func() (float64, error) {
				return crrRate(ctx, from.ns, netip.AddrPortFrom(to.ip, crrPort), secs, 0)
			})
			if err != nil {
				return measures{}, fmt.Errorf("%s connect/request/response: %w", k, err)
			}
			m.tput[k] = append(m.tput[k], bps)
			m.rtt[k] = append(m.rtt[k], us)
			m.crr[k] = append(m.crr[k], rate)
		}
	}
	return m, nil
}

// retries counts the measurements taken a second time in this run
// (benchDatapath prints it).
var retries atomic.Int64

// retried runs a measurement and, if it fails, once more: on a machine
// with a load average above 100 a server bound a moment late or an
// iperf3 run that moved nothing in its seconds is the machine, not the
// path; a second failure is the path's.
func retried(f func() (float64, error)) (float64, error) {
	v, err := f()
	if err == nil {
		return v, nil
	}
	retries.Add(1)
	time.Sleep(time.Second)
	v, err2 := f()
	if err2 != nil {
		return 0, errors.Join(err, err2)
	}
	return v, nil
}

// loadAvg is the 1-minute load average ("?" if unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// iperf runs an iperf3 client on CPU 0 in ns and returns bits per second.
func iperf(ctx context.Context, ns string, to netip.Addr, secs int) (float64, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "taskset", "-c", "0",
		"iperf3", "-c", to.String(), "-t", strconv.Itoa(secs), "-J").Output()
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 measured nothing (%v): %.300s", err, out)
	}
	return r.End.SumReceived.BitsPerSecond, nil
}

var p50Re = regexp.MustCompile(`percentile 50\.000 =\s+([0-9.]+)`)

// sockperfRTT runs a TCP ping-pong on CPU 0 in ns and returns the median
// round trip in µs (sockperf reports half of it).
func sockperfRTT(ctx context.Context, ns string, to netip.Addr, secs int) (float64, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "taskset", "-c", "0",
		"sockperf", "pp", "--tcp", "-i", to.String(), "-p", strconv.Itoa(rrPort), "-t", strconv.Itoa(secs)).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	m := p50Re.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no median in sockperf output: %s", out)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return 2 * v, err
}
