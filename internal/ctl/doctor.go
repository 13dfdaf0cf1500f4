package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/vpcni/vpcni/internal/doctor"
)

// doctorCmd checks the node's prerequisites and health (internal/doctor)
// and prints one line per check; it fails when any check fails.
func doctorCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	var o doctor.Options
	fs.StringVar(&o.AgentConfig, "agent-config", "/etc/vpcni/vpcnid.yaml", "vpcnid's config file")
	fs.StringVar(&o.Socket, "socket", "", "vpcnid's socket (default: the config's socketPath)")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the runtime's CNI conf dir (on the node itself: /etc/cni/net.d)")
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the runtime's CNI bin dir (on the node itself: /opt/cni/bin)")
	format := formatFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat("doctor", *format); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := doctor.Run(ctx, o)
	if *format == "json" {
		if err := writeJSON(out, rep); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
	} else {
		printDoctor(out, rep)
	}
	if n := rep.Failed(); n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(rep.Results))
	}
	return nil
}

// printDoctor writes a line per check, and its fix on the next when it
// is not ok.
func printDoctor(out io.Writer, rep doctor.Report) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, r.Status, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(tw, "\t\t-> %s\n", r.Fix)
		}
	}
	tw.Flush()
}
