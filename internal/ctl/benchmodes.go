package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// labProviderMode is the openstack provider mode each datapath mode runs
// with on the lab: pods with MACs of their own need allowed address pairs
// that carry them, a passthrough pod a port of its own.
var labProviderMode = map[string]string{"macvlan": "address-pairs", "bridge": "address-pairs", "passthrough": "passthrough"}

// modeResult is one mode's row.
type modeResult struct {
	mode              string
	skipped           string
	adds              []time.Duration
	podTput, nodeTput float64
	podRTT, nodeRTT   float64
}

// benchModes measures every datapath mode in one run, each on a fresh
// two-node lab against the lab's Neutron-compatible endpoint: ADD latency
// (pods added one after another on both nodes, warm pool), pod on n1 ->
// pod on n2 throughput as a ratio to node n1 -> node n2 measured in the
// same lab, and the pods' TCP request/response round trip.
func benchModes(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench modes", flag.ContinueOnError)
	modes := fs.String("modes", "", "comma-separated modes (default: every registered mode)")
	pods := fs.Int("pods", 6, "pods added per node (the lab's pair limit is 10 per node)")
	rounds := fs.Int("rounds", 3, "alternating throughput/latency rounds per mode")
	secs := fs.Int("seconds", 2, "seconds per measurement")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, tool := range []string{"iperf3", "sockperf", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (make deps installs it)", tool)
		}
	}
	list := slices.DeleteFunc(datapath.Names(), func(m string) bool { return m == "fake" })
	if *modes != "" {
		list = strings.Split(*modes, ",")
	}
	var results []modeResult
	for _, m := range list {
		r, err := benchMode(m, *pods, *rounds, *secs)
		if err != nil {
			return fmt.Errorf("mode %s: %w", m, err)
		}
		results = append(results, r)
	}
	fmt.Fprintf(out, "mode-bench: each mode on a fresh two-node lab (VPC bridge with port security); ADD: %d pods per node one after another, warm pool; pod n1 -> pod n2 vs node n1 -> node n2: iperf3 TCP %d s and sockperf TCP ping-pong %d s, %d alternating rounds, client CPU 0, server CPU 1, medians; load average %s\n", *pods, *secs, *secs, *rounds, loadAvg())
	fmt.Fprintf(out, "%-12s %9s %9s %11s %11s %7s %8s %8s\n", "mode", "add_p50", "add_p99", "pod Gbit/s", "node Gbit/s", "ratio", "pod RTT", "node RTT")
	for _, r := range results {
		if r.skipped != "" {
			fmt.Fprintf(out, "%-12s skipped: %s\n", r.mode, r.skipped)
			continue
		}
		fmt.Fprintf(out, "%-12s %7.1fms %7.1fms %11.2f %11.2f %7.2f %6.1fus %6.1fus\n", r.mode, ms(pct(r.adds, 50)), ms(pct(r.adds, 99)),
			r.podTput/1e9, r.nodeTput/1e9, r.podTput/r.nodeTput, r.podRTT, r.nodeRTT)
	}
	for _, r := range results {
		if r.skipped != "" {
			fmt.Fprintf(out, "mode-bench: mode=%s skipped=%q\n", r.mode, r.skipped)
			continue
		}
		fmt.Fprintf(out, "mode-bench: mode=%s add_p50_ms=%.1f tput_ratio=%.2f rr_us=%.1f\n", r.mode, ms(pct(r.adds, 50)), r.podTput/r.nodeTput, r.podRTT)
	}
	return nil
}

// benchMode measures one mode.
func benchMode(mode string, pods, rounds, secs int) (r modeResult, err error) {
	r.mode = mode
	if why := kernelLacks(mode); why != "" {
		r.skipped = why
		return r, nil
	}
	bin, err := binDir()
	if err != nil {
		return r, err
	}
	const prefix = "vpcni-modebench"
	nc := labNodeConfig{Datapath: mode, ProviderMode: labProviderMode[mode]}
	if err := labUp(prefix, 2, "10.92.0.0/24", true, nc, io.Discard); err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, labDown(prefix, io.Discard)) }()
	st, err := readLabState(prefix)
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var first []end // the first pod of each node
	for i, n := range st.Nodes {
		agent := &testbed.Agent{Client: api.NewClient(n.Socket)}
		if err := waitWarm(agent, min(pods, 4)); err != nil {
			return r, fmt.Errorf("%s: %w", n.Name, err)
		}
		cni, err := testbed.NewCNIIn(n.NS, []string{bin}, filepath.Join(labDir(prefix), n.Name, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-bench", n.Socket))
		if err != nil {
			return r, err
		}
		for k := range pods {
			name := fmt.Sprintf("%s-n%dp%d", prefix, i, k)
			if err := netnsutil.Add(name); err != nil {
				return r, err
			}
			t0 := time.Now()
			res, err := cni.Add(ctx, testbed.Runtime(fmt.Sprintf("mb-%d-%d", i, k), netnsutil.Path(name), "eth0", nil))
			if err != nil {
				return r, fmt.Errorf("ADD on %s: %w", n.Name, err)
			}
			r.adds = append(r.adds, time.Since(t0))
			if k == 0 {
				cr, err := types100.GetResult(res)
				if err != nil {
					return r, err
				}
				ip, _ := netip.AddrFromSlice(cr.IPs[0].Address.IP.To4())
				first = append(first, end{ns: name, ip: ip})
			}
		}
	}
	nodes := [2]end{{ns: st.Nodes[0].NS, ip: st.Nodes[0].IP}, {ns: st.Nodes[1].NS, ip: st.Nodes[1].IP}}
	m, err := comparePaths(ctx, map[string][2]end{"pod": {first[0], first[1]}, "node": nodes}, rounds, secs)
	if err != nil {
		return r, err
	}
	r.podTput, r.nodeTput = median(m.tput["pod"]), median(m.tput["node"])
	r.podRTT, r.nodeRTT = median(m.rtt["pod"]), median(m.rtt["node"])
	return r, nil
}

// kernelLacks says why a mode cannot run on this kernel ("" if it can):
// ipvlan is not built into every kernel (this lab machine's has none).
func kernelLacks(mode string) string {
	if mode != "ipvlan" {
		return ""
	}
	const ns = "vpcni-probe-ipvlan"
	_ = netnsutil.Delete(ns)
	if err := netnsutil.Add(ns); err != nil {
		return "cannot probe for ipvlan: " + err.Error()
	}
	defer netnsutil.Delete(ns)
	if err := netnsutil.Exec(ns, "ip", "link", "add", "vpcnip0", "type", "veth", "peer", "name", "vpcnip1"); err != nil {
		return "cannot probe for ipvlan: " + err.Error()
	}
	if err := netnsutil.Exec(ns, "ip", "link", "add", "link", "vpcnip0", "name", "vpcnip2", "type", "ipvlan", "mode", "l2"); err != nil {
		return "this kernel has no ipvlan (" + strings.TrimSpace(err.Error()) + ")"
	}
	return ""
}
