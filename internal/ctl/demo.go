package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

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
	keep := fs.Bool("keep", false, "leave the demo up and say how to look around")
	down := fs.Bool("down", false, "remove a demo left up by --keep (or by a crash)")
	pods := fs.Int("pods", 3, "pods to start")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces: run it as root")
	}
	tb := testbed.New("vpcni-demo", netip.MustParsePrefix("10.77.0.0/24"))
	if *down {
		if err := tb.Down(); err != nil {
			return err
		}
		fmt.Fprintln(out, "demo network removed")
		return nil
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "building the demo network: segment %s, node %s, neighbour %s (namespaces %s-*)\n", tb.Subnet, tb.NodeIP, tb.NbrIP, tb.Prefix)
	if err := tb.Up(); err != nil {
		return fmt.Errorf("build demo network: %w", err)
	}
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(interrupted)
	defer func() {
		if *keep && err == nil {
			return
		}
		if derr := tb.Down(); derr != nil {
			err = errors.Join(err, derr)
		}
		fmt.Fprintln(out, "demo network removed")
	}()

	cfg := tb.AgentConfig(tb.RunDir, "10.77.0.0/24", "10.77.0.0/26")
	agent, err := tb.StartAgent(bin, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "vpcnid running in %s (pid %d), static pool 10.77.0.64-254\n", tb.NodeNS(), agent.Pid())
	cni, err := tb.NewCNI([]string{bin}, filepath.Join(tb.RunDir, "cni-cache"), testbed.VpcniConfList("1.1.0", "vpcni-demo", cfg.SocketPath))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	hosts := []host{
		{name: "node", ns: netnsutil.Path(tb.NodeNS()), ip: tb.NodeIP},
		{name: "neighbour", ns: netnsutil.Path(tb.NbrNS()), ip: tb.NbrIP},
	}
	for i := range *pods {
		path, err := tb.AddPod(i)
		if err != nil {
			return err
		}
		start := time.Now()
		res, err := cni.Add(ctx, testbed.Runtime(fmt.Sprintf("demo-pod-%d", i), path, "eth0", nil))
		took := time.Since(start)
		if err != nil {
			return fmt.Errorf("ADD pod %d: %w", i, err)
		}
		r, err := types100.GetResult(res)
		if err != nil {
			return err
		}
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		fmt.Fprintf(out, "ADD pod-%d  %-12s %6.1f ms\n", i, ip, float64(took.Microseconds())/1000)
		hosts = append(hosts, host{name: fmt.Sprintf("pod-%d", i), ns: path, ip: ip, pod: true})
	}
	for _, h := range hosts {
		srv, err := netnsutil.ServeEcho(h.ns, testbed.HostPort(h.ip, echoPort))
		if err != nil {
			return fmt.Errorf("echo server on %s: %w", h.name, err)
		}
		defer srv.Close()
	}

	fmt.Fprintf(out, "\nconnectivity (TCP to port %d, by the target's own IP):\n%-10s", echoPort, "from\\to")
	for _, to := range hosts {
		fmt.Fprintf(out, " %-10s", to.name)
	}
	fmt.Fprintln(out)
	pairs, reachable := 0, 0
	for _, from := range hosts {
		fmt.Fprintf(out, "%-10s", from.name)
		for _, to := range hosts {
			if from.name == to.name || !from.pod && !to.pod {
				fmt.Fprintf(out, " %-10s", "")
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
			fmt.Fprintf(out, " %-10s", mark)
		}
		fmt.Fprintln(out)
	}
	if st, err := agent.State(); err == nil {
		fmt.Fprintln(out)
		printState(out, st)
	}
	if *keep {
		fmt.Fprintf(out, `
the demo stays up. Look around:
  ip netns exec %[1]s-node ip route            # /32 routes to the pods
  ip netns exec %[1]s-node ip neigh show proxy  # the node answers ARP for its pods
  ip netns exec %[1]s-p0 ip addr; ip netns exec %[1]s-p0 ip route
  %[2]s/vpcnictl status --socket %[3]s
tear it down with: %[2]s/vpcnictl demo --down
`, tb.Prefix, bin, cfg.SocketPath)
	} else {
		for _, h := range hosts[2:] {
			id := "demo-" + h.name
			if err := cni.Del(ctx, testbed.Runtime(id, h.ns, "eth0", nil)); err != nil {
				return fmt.Errorf("DEL %s: %w", h.name, err)
			}
		}
	}
	fmt.Fprintf(out, "demo: pairs=%d reachable=%d\n", pairs, reachable)
	if reachable != pairs {
		return fmt.Errorf("%d of %d pairs unreachable", pairs-reachable, pairs)
	}
	return nil
}
