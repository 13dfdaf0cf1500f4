// Package ctl is vpcnictl: the operator's view of the node agent, and the
// demo and benchmarks that run vpcni on a testbed of namespaces.
package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	_ "github.com/vpcni/vpcni/internal/builtin/clouds" // the clouds a -cloud-config may name
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
	case "trace":
		err = trace(args[1:], stdout)
	case "audit":
		err = audit(args[1:], stdout)
	case "doctor":
		err = doctorCmd(args[1:], stdout)
	case "install-cni":
		err = installCNI(args[1:], stdout)
	case "uninstall-cni":
		err = uninstallCNI(args[1:], stdout)
	case "max-pods":
		err = maxPods(args[1:], stdout)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "vpcnictl: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if errors.Is(err, errHelp) {
		return 0 // the subcommand printed its flags
	}
	if err != nil {
		fmt.Fprintln(stderr, "vpcnictl:", err)
		var ue usageError
		if errors.As(err, &ue) {
			usage(stderr)
			return 2
		}
		return 1
	}
	return 0
}

// errHelp: a subcommand's -h printed its flags; not a failure.
var errHelp = errors.New("help requested")

// parseFlags parses a subcommand's flags: a flag it does not know or a bad
// value is a usage error (exit 2), -h prints the flags (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if flagsSeen != nil {
		flagsSeen(fs)
	}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return errHelp
	default:
		return usageError{err.Error()}
	}
}

// flagsSeen, when a test sets it, hears every subcommand's flags before
// they are parsed: the test that holds the documents to them.
var flagsSeen func(*flag.FlagSet)

// formatFlag adds a command's -o flag.
func formatFlag(fs *flag.FlagSet) *string { return fs.String("o", "table", "output: table or json") }

// checkFormat refuses an -o other than table or json.
func checkFormat(cmd, format string) error {
	if format != "table" && format != "json" {
		return usageError{fmt.Sprintf("%s: unknown output format %q (table or json)", cmd, format)}
	}
	return nil
}

// writeJSON writes v as every -o json does: indented.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usageError is a command line vpcnictl does not understand: Main prints
// the usage with it and exits 2, as it does for an unknown command.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usage(w io.Writer) {
	fmt.Fprint(w, `vpcnictl — operate vpcni, and try it out on this machine

On a node:
  vpcnictl status [--socket PATH] [-o table|json]
      the agent's health, pool and allocations; exits 1 while the agent is not ready
  vpcnictl trace NAMESPACE/POD [--socket PATH] [-o table|json]
      every piece of the pod's path on this node (its interface, address, route and
      neighbour; the host veth, route, proxy ARP entry, rules; the address on the cloud
      port), ok, missing or wrong, and what to do; exits 1 if a piece is not ok
  vpcnictl doctor [--agent-config F] [--socket PATH] [--cni-conf-dir D] [--cni-bin-dir D] [-o table|json]
      the node's prerequisites and health, one line per check with what to do: kernel link
      types of every mode, the mode's sysctls, the uplink, the CNI conf and bin dirs, the agent,
      the cloud (openstack), the API server, clock skew; exits 1 when a check fails (as root)
  vpcnictl install-cni [--plugin F] [--bin-dir D] [--conf-dir D] [--conflist F] [--name N] [--agent-config F]
      copy the plugin and write the conflist atomically (the DaemonSet's init step);
      with --agent-config also set the node's sysctls for that config's uplink
  vpcnictl uninstall-cni [--bin-dir D] [--conf-dir D] [--name N] [--agent-config F]
      remove the conflist and the plugin; with --agent-config (vpcnid stopped) also give
      the node back what that config's datapath changed (bridge: the uplink's addresses,
      routes, neighbours and MTU)

For EC2 (provider aws):
  vpcnictl max-pods --instance-type T [--prefix] [--endpoint URL] [--region R] [-o table|json]
      the max-pods AWS documents for the instance type (ENIs × (IPs − 1) + 2; with
      --prefix × 16, capped at 110 or 250) and vpcni's own figure, the pod addresses the
      node can hold, from EC2's DescribeInstanceTypes (credentials: the SDK's default chain)

For the cluster (the controller's view, read-only):
  vpcnictl audit -cloud-config F [-kubeconfig K] [-block-ranges CIDRs] [-o table|json]
      what Neutron holds for vpcni (marked fixed IPs, reservation ports, floating IPs,
      router routes, block pairs), who holds each, and what the leak collector would
      release and why; a dry run

On this machine, as root, in network namespaces only:
  vpcnictl lab up|down|status [--prefix P] [--nodes N] [--subnet CIDR] [--agents=false]
      an OpenStack-style VPC: a segment with port security, a router, N nodes running
      vpcnid against the lab's Neutron endpoint (none with --agents=false), a legacy VM
  vpcnictl lab exec [--prefix P] HOST COMMAND...
      run a command in a lab host's namespace (router, legacy, n1, n2, ...)
  vpcnictl demo [--nodes N] [--keep|--down]
      the lab with a pod on every node through the plugin, then TCP by the target's own IP
      between every pair with a pod in it: pod and pod across nodes, pod and node, pod and
      the legacy VM; --keep leaves it all up, --down removes it
`)
	for _, b := range benches {
		fmt.Fprintf(w, "  vpcnictl bench %s [flags]\n      %s\n", b.name, b.what)
	}
}

func status(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	socket := fs.String("socket", api.DefaultSocket, "vpcnid socket")
	format := formatFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat("status", *format); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st api.State
	if err := api.NewClient(*socket).Do(ctx, api.PathState, nil, &st); err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	if *format == "json" {
		if err := writeJSON(out, st); err != nil {
			return fmt.Errorf("write the status: %w", err)
		}
	} else {
		printState(out, &st)
	}
	// Both forms exit non-zero while the agent is not ready, so a script or
	// probe can rely on the exit code whichever it parses.
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
	fast := ""
	if st.FastPath != "" {
		fast = ", fast path " + st.FastPath
	}
	prov := st.Provider
	if st.ProviderSubnet != "" {
		prov += ", " + st.ProviderSubnet
	}
	fmt.Fprintf(out, "node      %s\nagent     %s (since %s)\nprovider  %s\ndatapath  %s via %s, mtu %d%s\n",
		st.Node, health, st.StartedAt, prov, st.Datapath, st.Uplink, st.MTU, fast)
	pools := st.Families
	if len(pools) == 0 {
		pools = []api.PoolState{st.Pool}
	}
	for _, p := range pools {
		label := "pool      "
		if p.Family != "" {
			label = fmt.Sprintf("pool %-5s", p.Family)
		}
		fmt.Fprintf(out, "%sfree %d, cooling %d, allocated %d, capacity %d; warm target %d\n", label, p.Free, p.Cooling, p.Allocated, p.Capacity, p.WarmTarget)
		if p.Waiting > 0 {
			fmt.Fprintf(out, "          %d ADDs waiting for addresses from the cloud\n", p.Waiting)
		}
		if p.Aside > 0 {
			fmt.Fprintf(out, "          %d set aside (their wiring kept failing; tried again later): %s\n", p.Aside, strings.Join(p.Addresses["aside"], " "))
		}
		if p.Leaving > 0 {
			fmt.Fprintf(out, "          %d leaving (requested addresses going back to the cloud): %s\n", p.Leaving, strings.Join(p.Addresses["leaving"], " "))
		}
	}
	for _, n := range st.PodNetworks {
		np := n.Pool
		state := "ready"
		if !n.Ready {
			state = "NOT READY: " + n.Reason
		}
		fmt.Fprintf(out, "network   %s (%s): free %d, cooling %d, allocated %d, capacity %d; %s\n", n.Name, state, np.Free, np.Cooling, np.Allocated, np.Capacity, n.Source)
	}
	if len(st.Allocations) == 0 {
		fmt.Fprintln(out, "no allocations")
		return
	}
	// The network and NIC columns only on a node that serves PodNetworks.
	nets := len(st.PodNetworks) > 0 || slices.ContainsFunc(st.Allocations, func(a alloc.Allocation) bool { return a.PodNetwork != "" })
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "ADDRESS\tPOD\tCONTAINER\tIF\tHOST IF\tNETNS\tSINCE\tDATAPATH"
	if nets {
		header += "\tNETWORK\tNIC"
	}
	fmt.Fprintln(tw, header)
	var problems []string
	for _, a := range st.Allocations {
		pod := a.PodNamespace + "/" + a.PodName
		if a.PodName == "" {
			pod = "-"
		}
		h, probed := st.Health[a.Key()]
		dp := "-" // not probed yet, or probes are off
		switch {
		case probed && h.Healthy && h.PingMicros > 0:
			dp = fmt.Sprintf("ok (ping %dus)", h.PingMicros)
		case probed && h.Healthy:
			dp = "ok"
		case probed:
			dp = "UNHEALTHY"
			problems = append(problems, fmt.Sprintf("  %s (%s), checked %s: %s", a.Address, pod, h.CheckedAt, h.Problem))
		}
		var addrs []string
		for _, ip := range a.Addresses() {
			addrs = append(addrs, ip.String())
		}
		row := fmt.Sprintf("%s\t%s\t%.12s\t%s\t%s\t%s\t%s\t%s", strings.Join(addrs, ","), pod, a.ContainerID, a.IfName, a.HostIf(), filepath.Base(a.Netns), a.Created.Format(time.RFC3339), dp)
		if nets {
			network, nic := a.PodNetwork, "-"
			if network == "" {
				network = "default"
			}
			if a.NIC != nil {
				nic = a.NIC.MAC + " (port " + a.Interface + ")"
			}
			row += "\t" + network + "\t" + nic
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	if len(problems) > 0 {
		fmt.Fprintln(out, "unhealthy datapaths:")
		for _, p := range problems {
			fmt.Fprintln(out, p)
		}
	}
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
