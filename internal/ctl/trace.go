package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vpcni/vpcni/internal/api"
)

// trace prints a pod's path through this node, as its agent sees it: each
// piece ok, missing or wrong, and what to do. It exits non-zero when a
// piece is not ok, so a script can rely on the exit code.
func trace(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	socket := fs.String("socket", api.DefaultSocket, "vpcnid socket")
	format := formatFlag(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long (the cloud is read too)")
	cloudConfig := fs.String("cloud-config", "", "also read the controller's side with this cloud file (vpcni-controller's -cloud-config): the pod's floating IPs and, with a routes section, its block's route on the router and pair on the VM port")
	// The pod may come before or after the flags.
	var pod string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pod, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if pod == "" && fs.NArg() == 1 {
		pod = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usageError{"trace: one pod, namespace/name"}
	}
	if ns, name, ok := strings.Cut(pod, "/"); !ok || ns == "" || name == "" {
		return usageError{fmt.Sprintf("trace: %q is not namespace/name", pod)}
	}
	if err := checkFormat("trace", *format); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var tr api.Trace
	if err := api.NewClient(*socket).Do(ctx, api.PathTrace+"?pod="+url.QueryEscape(pod), nil, &tr); err != nil {
		return fmt.Errorf("trace %s: %w", pod, err)
	}
	if *cloudConfig != "" {
		// The agent's pieces stand on their own: a cloud that cannot be
		// read is one more piece, marked wrong, on each attachment.
		if err := traceCloud(ctx, *cloudConfig, &tr); err != nil {
			for i := range tr.Attachments {
				tr.Attachments[i].Hops = append(tr.Attachments[i].Hops, api.Hop{Where: api.HopCloud, What: "the controller's side (" + *cloudConfig + ")",
					State: api.HopWrong, Detail: err.Error(), Fix: "check the cloud file's credentials and endpoint (vpcnictl audit -cloud-config uses the same)"})
			}
		}
	}
	if *format == "json" {
		if err := writeJSON(out, tr); err != nil {
			return err
		}
	} else {
		printTrace(out, &tr)
	}
	if !tr.OK() {
		return fmt.Errorf("trace %s: a piece of its path is not as it should be (see FIX)", pod)
	}
	return nil
}

func printTrace(out io.Writer, tr *api.Trace) {
	fmt.Fprintf(out, "pod %s on node %s (datapath %s, provider %s)\n", tr.Pod, tr.Node, tr.Datapath, tr.Provider)
	for _, a := range tr.Attachments {
		network := ""
		if a.PodNetwork != "" {
			network = ", PodNetwork " + a.PodNetwork
		}
		fmt.Fprintf(out, "\n%s %s (container %.12s%s)\n", a.IfName, a.Address, a.ContainerID, network)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WHERE\tPIECE\tSTATE\tDETAIL")
		var fixes []string
		for _, h := range a.Hops {
			state := h.State
			if h.State != api.HopOK {
				state = strings.ToUpper(h.State)
				fixes = append(fixes, h.What+": "+h.Fix)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Where, h.What, state, h.Detail)
		}
		tw.Flush()
		for _, f := range fixes {
			fmt.Fprintln(out, "FIX", f)
		}
	}
}
