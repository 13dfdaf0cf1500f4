// Package ctl is vpcnictl: the operator's view of the node agent, and the
// demo and benchmarks that run vpcni on a testbed of namespaces.
package ctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/vpcni/vpcni/internal/api"
)

// Main dispatches vpcnictl's subcommands.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	var err error
	switch args[0] {
	case "status":
		err = status(args[1:], stdout)
	case "demo":
		err = demo(args[1:], stdout)
	case "bench":
		err = bench(args[1:], stdout)
	case "lab":
		err = labCmd(args[1:], stdout)
	case "install-cni":
		err = installCNI(args[1:], stdout)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "vpcnictl: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "vpcnictl:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `vpcnictl — operate vpcni

  vpcnictl status [--socket PATH] [-o json]   agent health, pool and allocations
  vpcnictl demo [--keep|--down]               one node, three pods, a neighbour: connectivity matrix
  vpcnictl lab up|down|status|exec [--nodes N]  a whole OpenStack-style VPC on this machine (namespaces only)
  vpcnictl install-cni [flags]                copy the plugin and write the conflist atomically (the DaemonSet's init step)
  vpcnictl bench cni [flags]                  CNI ADD/DEL latency and burst vs Debian's ptp+host-local
  vpcnictl bench neutron [flags]              Neutron calls per pod, batched vs single updates (real neutron-server)
  vpcnictl bench pool [flags]                 pool policy: calls per pod under churn, cold and warm ADD p99 (real neutron-server)
  vpcnictl bench datapath [flags]             pod-to-pod vs node-to-node throughput and RTT on the lab
  vpcnictl bench restart [-pods N]            agent restart with N pods: time until it serves, first ADD, restore
`)
}

func status(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	socket := fs.String("socket", api.DefaultSocket, "vpcnid socket")
	format := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st api.State
	if err := api.NewClient(*socket).Do(ctx, api.PathState, nil, &st); err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	if *format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printState(out, &st)
	if !st.Ready {
		return fmt.Errorf("agent not ready: %s", st.Reason)
	}
	return nil
}

func printState(out io.Writer, st *api.State) {
	health := "ready"
	switch {
	case !st.Ready:
		health = "NOT READY: " + st.Reason
	case st.Degraded:
		health = "ready, DEGRADED: " + st.Reason
	}
	fmt.Fprintf(out, "node      %s\nagent     %s (since %s)\nprovider  %s\ndatapath  %s via %s, mtu %d\n",
		st.Node, health, st.StartedAt, st.Provider, st.Datapath, st.Uplink, st.MTU)
	p := st.Pool
	fmt.Fprintf(out, "pool      free %d, cooling %d, allocated %d, capacity %d\n", p.Free, p.Cooling, p.Allocated, p.Capacity)
	if len(st.Allocations) == 0 {
		fmt.Fprintln(out, "no allocations")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tPOD\tCONTAINER\tIF\tHOST IF\tNETNS\tSINCE")
	for _, a := range st.Allocations {
		pod := a.PodNamespace + "/" + a.PodName
		if a.PodName == "" {
			pod = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.12s\t%s\t%s\t%s\t%s\n", a.Address, pod, a.ContainerID, a.IfName, a.HostIf, filepath.Base(a.Netns), a.Created)
	}
	tw.Flush()
}

// binDir is the directory vpcnictl runs from: vpcni and vpcnid sit beside it.
func binDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(exe)
	for _, b := range []string{"vpcni", "vpcnid"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s is not beside vpcnictl in %s (run make build)", b, dir)
		}
	}
	return dir, nil
}
