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

	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchDatapath compares, on the lab, a pod on n1 talking to a pod on n2
// with node n1 talking to node n2 over the same VPC segment: TCP
// throughput (Debian's iperf3) and request/response latency (sockperf
// ping-pong), in alternating rounds, client pinned to CPU 0 and server to
// CPU 1, medians.
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
	if err := labUp(prefix, 2, "10.91.0.0/24", true, labNodeConfig{}, io.Discard); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, labDown(prefix, io.Discard)) }()
	st, err := readLabState(prefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	// One pod on each node.
	var pods []end
	for i, n := range st.Nodes {
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
	tput, rtt, err := comparePaths(ctx, map[string][2]end{"pod": {pods[0], pods[1]}, "node": {nodes[0], nodes[1]}}, *rounds, *secs)
	if err != nil {
		return err
	}
	pt, nt := median(tput["pod"]), median(tput["node"])
	pr, nr := median(rtt["pod"]), median(rtt["node"])
	fmt.Fprintf(out, "datapath-bench: lab VPC segment (bridge with port security), pod on n1 -> pod on n2 vs node n1 -> node n2; iperf3 TCP %d s and sockperf TCP ping-pong %d s per round, %d alternating rounds, client on CPU 0, server on CPU 1; medians\n", *secs, *secs, *rounds)
	// Both paths are CPU-bound on CPU 0 (sender and every softirq hop of
	// the data), so anything else running there moves the numbers; the
	// load average says how busy the machine was.
	fmt.Fprintf(out, "load average at start %s, at end %s (above ~1.5 the rounds scatter by several Gbit/s)\n", load0, loadAvg())
	fmt.Fprintf(out, "pod->pod   %.2f Gbit/s  RTT %.1f us  (rounds: %v Gbit/s)\n", pt/1e9, pr, gbits(tput["pod"]))
	fmt.Fprintf(out, "node->node %.2f Gbit/s  RTT %.1f us  (rounds: %v Gbit/s)\n", nt/1e9, nr, gbits(tput["node"]))
	ratio, overhead := pt/nt, pr-nr
	fmt.Fprintf(out, "targets: throughput %.2fx node (>= 0.95: %s), RTT %+.1f us (<= +3: %s)\n", ratio, met(ratio >= 0.95), overhead, met(overhead <= 3))
	fmt.Fprintf(out, "datapath-bench: tput_ratio=%.2f rtt_overhead_us=%.1f\n", ratio, overhead)
	return nil
}

// end is one side of a measured path: a namespace and its address.
type end struct {
	ns string
	ip netip.Addr
}

// comparePaths measures each path (client -> server) with iperf3 and a
// sockperf TCP ping-pong, in rounds that alternate the paths' order,
// servers on CPU 1 and clients on CPU 0; it returns bits per second and
// round trips in µs per path and round.
func comparePaths(ctx context.Context, paths map[string][2]end, rounds, secs int) (tput, rtt map[string][]float64, err error) {
	var servers []*exec.Cmd
	defer func() {
		for _, s := range servers {
			_ = s.Process.Kill()
			_ = s.Wait()
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
				return nil, nil, err
			}
			servers = append(servers, cmd)
		}
	}
	time.Sleep(500 * time.Millisecond) // the servers bind
	tput, rtt = map[string][]float64{}, map[string][]float64{}
	for r := range rounds {
		order := slices.Clone(names)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			from, to := paths[k][0], paths[k][1]
			bps, err := iperf(ctx, from.ns, to.ip, secs)
			if err != nil {
				return nil, nil, fmt.Errorf("%s iperf3: %w", k, err)
			}
			us, err := sockperfRTT(ctx, from.ns, to.ip, secs)
			if err != nil {
				return nil, nil, fmt.Errorf("%s sockperf: %w", k, err)
			}
			tput[k] = append(tput[k], bps)
			rtt[k] = append(rtt[k], us)
		}
	}
	return tput, rtt, nil
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
