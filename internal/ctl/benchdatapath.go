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
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchDatapath compares, on one four-node lab, node n1 talking to node
// n2 with pods talking over the same VPC segment in each routed mode:
// mode veth (a pod on n1 to a pod on n2), mode ebpf (a pod on n3 to a
// pod on n4: the fast path across nodes) and two ebpf pods on n3 (the
// fast path on one node). Per path: TCP throughput (Debian's iperf3),
// request/response latency (sockperf ping-pong) and connect/request/
// response rate (a fresh TCP connection per one-byte exchange), in
// rounds that alternate the paths' order, client pinned to CPU 0 and
// server to CPU 1, medians.
func benchDatapath(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench datapath", flag.ContinueOnError)
	rounds := fs.Int("rounds", 5, "alternating rounds")
	secs := fs.Int("seconds", 3, "seconds per measurement")
	if err := parseFlags(fs, args); err != nil {
		return err
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
	const prefix = "vpcni-dpbench"
	if err := labUp(prefix, 4, "10.91.0.0/24", true, labNodeConfig{Datapath: "veth,veth,ebpf,ebpf"}, io.Discard); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, labDown(prefix, io.Discard)) }()
	st, err := readLabState(prefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// n3 and n4 measure the fast path: one that fell back would print mode
	// veth's figures on the ebpf line.
	for _, n := range st.Nodes[2:] {
		s, err := (&testbed.Agent{Client: api.NewClient(n.Socket)}).State()
		if err != nil {
			return err
		}
		if s.FastPath != "on" {
			return fmt.Errorf("%s runs mode %s with its fast path %q: nothing to measure", n.Name, s.Datapath, s.FastPath)
		}
	}

	// One pod on each node, and a second one on n3.
	var pods []end
	for i, n := range append(slices.Clone(st.Nodes), st.Nodes[2]) {
		cni, err := testbed.NewCNIIn(n.NS, []string{bin}, filepath.Join(labDir(prefix), n.Name, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-bench", n.Socket))
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s-pod%d", prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return err
		}
		res, err := cni.Add(ctx, testbed.Runtime(fmt.Sprintf("dp-%d", i), netnsutil.Path(name), "eth0", nil))
		if err != nil {
			return err
		}
		r, err := types100.GetResult(res)
		if err != nil {
			return err
		}
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		pods = append(pods, end{ns: name, ip: ip})
	}
	nodes := []end{{ns: st.Nodes[0].NS, ip: st.Nodes[0].IP}, {ns: st.Nodes[1].NS, ip: st.Nodes[1].IP}}
	load0 := loadAvg()
	m, err := comparePaths(ctx, map[string][2]end{
		"node": {nodes[0], nodes[1]}, "veth": {pods[0], pods[1]}, "ebpf": {pods[2], pods[3]}, "ebpf-local": {pods[2], pods[4]},
	}, *rounds, *secs)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "datapath-bench: lab VPC segment (bridge with port security); node n1 -> node n2; veth: pod on n1 -> pod on n2; ebpf: pod on n3 -> pod on n4; ebpf-local: pod -> pod on n3; iperf3 TCP, sockperf TCP ping-pong and TCP connect/request/response %d s each per round, %d alternating rounds, client on CPU 0, server on CPU 1; medians\n", *secs, *rounds)
	// Every path is CPU-bound on CPU 0 (sender and every softirq hop of
	// the data), so anything else running there moves the numbers; the
	// load average says how busy the machine was.
	fmt.Fprintf(out, "load average at start %s, at end %s (above ~1.5 the rounds scatter by several Gbit/s)\n", load0, loadAvg())
	nt, nr, nc := median(m.tput["node"]), median(m.rtt["node"]), median(m.crr["node"])
	fmt.Fprintf(out, "%-11s %8s %8s %9s  %6s %6s %6s  %s\n", "path", "Gbit/s", "RTT us", "CRR/s", "tput", "rr", "crr", "(ratios vs node; throughput rounds in Gbit/s)")
	ratios := map[string][3]float64{}
	for _, k := range []string{"node", "veth", "ebpf", "ebpf-local"} {
		t, r, c := median(m.tput[k]), median(m.rtt[k]), median(m.crr[k])
		ratios[k] = [3]float64{t / nt, r / nr, c / nc}
		fmt.Fprintf(out, "%-11s %8.2f %8.1f %9.0f  %5.2fx %5.2fx %5.2fx  %v\n", k, t/1e9, r, c, t/nt, r/nr, c/nc, gbits(m.tput[k]))
	}
	e, local := ratios["ebpf"], ratios["ebpf-local"]
	fmt.Fprintf(out, "targets (mode ebpf, across nodes): throughput %.2fx node (>= 0.97: %s), TCP_RR latency %.2fx node (<= 1.05: %s); on one node: throughput %.2fx and latency %.2fx node (beats node: %s)\n",
		e[0], met(e[0] >= 0.97), e[1], met(e[1] <= 1.05), local[0], local[1], met(local[0] > 1 && local[1] < 1))
	// The line scripts read since the first bench (mode veth), unchanged.
	v := ratios["veth"]
	fmt.Fprintf(out, "datapath-bench: tput_ratio=%.2f rtt_overhead_us=%.1f\n", v[0], median(m.rtt["veth"])-nr)
	fmt.Fprintf(out, "datapath-bench: mode=veth tput_ratio=%.2f rr_ratio=%.2f crr_ratio=%.2f\n", v[0], v[1], v[2])
	fmt.Fprintf(out, "datapath-bench: mode=ebpf tput_ratio=%.2f rr_ratio=%.2f crr_ratio=%.2f\n", e[0], e[1], e[2])
	return nil
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
func comparePaths(ctx context.Context, paths map[string][2]end, rounds, secs int) (_ measures, err error) {
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
		for _, argv := range [][]string{
			{"iperf3", "-s", "-B", e.ip.String()},
			{"sockperf", "sr", "--tcp", "-i", e.ip.String(), "-p", "11111"},
		} {
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
	for r := range rounds {
		order := slices.Clone(names)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			from, to := paths[k][0], paths[k][1]
			bps, err := iperf(ctx, from.ns, to.ip, secs)
			if err != nil {
				return measures{}, fmt.Errorf("%s iperf3: %w", k, err)
			}
			us, err := sockperfRTT(ctx, from.ns, to.ip, secs)
			if err != nil {
				return measures{}, fmt.Errorf("%s sockperf: %w", k, err)
			}
			rate, err := crrRate(ctx, from.ns, netip.AddrPortFrom(to.ip, crrPort), secs, 0)
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

// loadAvg is the 1-minute load average ("?" if unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

func gbits(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x/1e9, 'f', 2, 64)
	}
	return out
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
		return 0, fmt.Errorf("iperf3 output: %v", err)
	}
	return r.End.SumReceived.BitsPerSecond, nil
}

var p50Re = regexp.MustCompile(`percentile 50\.000 =\s+([0-9.]+)`)

// sockperfRTT runs a TCP ping-pong on CPU 0 in ns and returns the median
// round trip in µs (sockperf reports half of it).
func sockperfRTT(ctx context.Context, ns string, to netip.Addr, secs int) (float64, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "taskset", "-c", "0",
		"sockperf", "pp", "--tcp", "-i", to.String(), "-p", "11111", "-t", strconv.Itoa(secs)).CombinedOutput()
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
