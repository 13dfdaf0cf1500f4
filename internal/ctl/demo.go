package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

const echoPort = 7777

type host struct {
	name string
	ns   string // namespace path
	ip   netip.Addr
	pod  bool
}

func demo(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "leave the lab and the pods up and say how to look around")
	down := fs.Bool("down", false, "remove a demo left up by --keep (or by a crash)")
	nodes := fs.Int("nodes", 3, "lab nodes (one pod on each)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces: run it as root")
	}
	const prefix = "vpcni-demo"
	if *down {
		return labDown(prefix, out)
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "building the lab: a VPC segment with port security, a router, %d nodes running vpcnid against the lab's Neutron endpoint, a legacy VM (namespaces %s-*)\n", *nodes, prefix)
	if err := labUp(prefix, *nodes, "10.77.0.0/24", true, labNodeConfig{}, io.Discard); err != nil {
		return err
	}
	defer func() {
		if *keep && err == nil {
			return
		}
		err = errors.Join(err, labDown(prefix, out))
	}()
	st, err := readLabState(prefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var hosts []host
	for _, h := range append([]lab.Host{st.Legacy}, nodesOf(st)...) {
		hosts = append(hosts, host{name: h.Name, ns: netnsutil.Path(h.NS), ip: h.IP})
	}
	var cnis []*testbed.CNI
	for i, n := range st.Nodes {
		cni, err := testbed.NewCNIIn(n.NS, []string{bin}, filepath.Join(labDir(prefix), n.Name, "cni-cache"), testbed.VpcniConfList("1.1.0", "vpcni-demo", n.Socket))
		if err != nil {
			return err
		}
		cnis = append(cnis, cni)
		name := fmt.Sprintf("%s-pod%d", prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return err
		}
		start := time.Now()
		res, err := cni.Add(ctx, testbed.Runtime(fmt.Sprintf("demo-pod-%d", i), netnsutil.Path(name), "eth0", nil))
		took := time.Since(start)
		if err != nil {
			return fmt.Errorf("ADD pod %d on %s: %w", i, n.Name, err)
		}
		r, err := types100.GetResult(res)
		if err != nil {
			return err
		}
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		fmt.Fprintf(out, "ADD pod-%d on %s  %-12s %6.1f ms (address from the lab's Neutron, on %s's VM port)\n", i, n.Name, ip, float64(took.Microseconds())/1000, n.Name)
		hosts = append(hosts, host{name: fmt.Sprintf("pod-%d", i), ns: netnsutil.Path(name), ip: ip, pod: true})
	}
	for _, h := range hosts {
		srv, err := netnsutil.ServeEcho(h.ns, testbed.HostPort(h.ip, echoPort))
		if err != nil {
			return fmt.Errorf("echo server on %s: %w", h.name, err)
		}
		defer srv.Close()
	}

	fmt.Fprintf(out, "\nconnectivity (TCP to port %d, by the target's own IP; the legacy VM is outside the cluster):\n%-10s", echoPort, "from\\to")
	for _, to := range hosts {
		fmt.Fprintf(out, " %-8s", to.name)
	}
	fmt.Fprintln(out)
	pairs, reachable := 0, 0
	for _, from := range hosts {
		fmt.Fprintf(out, "%-10s", from.name)
		for _, to := range hosts {
			if from.name == to.name || !from.pod && !to.pod {
				fmt.Fprintf(out, " %-8s", "")
				continue
			}
			pairs++
			pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
			perr := netnsutil.Probe(pctx, from.ns, testbed.HostPort(to.ip, echoPort))
			pcancel()
			mark := "ok"
			if perr == nil {
				reachable++
			} else {
				mark = "FAIL"
			}
			fmt.Fprintf(out, " %-8s", mark)
		}
		fmt.Fprintln(out)
	}
	if *keep {
		fmt.Fprintf(out, `
the demo stays up. Look around:
  %[1]s/vpcnictl lab status --prefix %[2]s           # each node's agent, pool and pods
  %[1]s/vpcnictl lab exec --prefix %[2]s n1 ip route  # /32 routes to the pods
  %[1]s/vpcnictl lab exec --prefix %[2]s n1 ip neigh show proxy
  ip netns exec %[2]s-vpc nft list ruleset          # port security on the VPC segment
tear it down with: %[1]s/vpcnictl demo --down
`, bin, prefix)
	} else {
		for i := range st.Nodes {
			if err := cnis[i].Del(ctx, testbed.Runtime(fmt.Sprintf("demo-pod-%d", i), netnsutil.Path(fmt.Sprintf("%s-pod%d", prefix, i)), "eth0", nil)); err != nil {
				return fmt.Errorf("DEL pod %d: %w", i, err)
			}
		}
	}
	fmt.Fprintf(out, "demo: pairs=%d reachable=%d\n", pairs, reachable)
	if reachable != pairs {
		return fmt.Errorf("%d of %d pairs unreachable", pairs-reachable, pairs)
	}
	return nil
}

func nodesOf(st *labState) []lab.Host {
	var out []lab.Host
	for _, n := range st.Nodes {
		out = append(out, n.Host)
	}
	return out
}
