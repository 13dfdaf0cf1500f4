package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/leaks"
)

// AuditReport is vpcnictl audit's JSON: every finding and the counts.
type AuditReport struct {
	Findings  []leaks.Finding                      `json:"findings"`
	Counts    map[leaks.Kind]map[leaks.Verdict]int `json:"counts"`
	Held      int                                  `json:"held"`
	Orphans   int                                  `json:"orphans"`
	Unclaimed int                                  `json:"unclaimed"`
	ClusterID string                               `json:"clusterID"`
}

// audit is the leak collector's comparison as a dry run: it reads the
// cloud (with vpcni-controller's -cloud-config) and the cluster, and prints
// what is held, by whom, and what the collector would release and why.
// It changes nothing.
func audit(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: $KUBECONFIG, else in-cluster)")
	cloudConfig := fs.String("cloud-config", "", "vpcni-controller's -cloud-config file (required: its openstack section, with subnetID, a routes section adding the router; or its aws section)")
	blockRanges := fs.String("block-ranges", "", "vpcni-controller's -block-ranges (comma-separated CIDRs): with a routes section, the routes and pairs of these ranges are audited")
	format := formatFlag(fs)
	clusterID := fs.String("cluster-id", "", "vpcni-controller's -cluster-id (default: the UID of namespace kube-system, as the controller's)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return usageError{fmt.Sprintf("-o %q: table or json", *format)}
	}
	if *cloudConfig == "" {
		return usageError{"audit: -cloud-config is required (the file vpcni-controller reads)"}
	}
	fc, err := cloudconfig.Load(*cloudConfig)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cloud := fc.Open(log)
	if info := cloud.Info(); !info.Subnet {
		return fmt.Errorf("%s: %s is required: the audit reads the pods' subnet", *cloudConfig, info.SubnetKey)
	}
	var ranges []netip.Prefix
	for _, f := range strings.Split(*blockRanges, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return usageError{fmt.Sprintf("-block-ranges: %q is not a CIDR", f)}
		}
		ranges = append(ranges, p)
	}
	scope := leaks.Scope{}
	if fc.HasRoutes() {
		if len(ranges) == 0 {
			return usageError{"audit: the cloud config has a routes section: give -block-ranges, as vpcni-controller has"}
		}
		scope.Router, scope.Ranges = fc.Routes.RouterID, ranges
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cfg, err := k8s.RestConfig(*kubeconfig)
	if err != nil {
		return err
	}
	if *clusterID == "" {
		if *clusterID, err = controller.ClusterID(ctx, cfg); err != nil {
			return err
		}
	}
	scope.ClusterID = *clusterID
	held, err := cloud.Leaks(ctx, scope)
	if err != nil {
		return fmt.Errorf("log in to the cloud: %w", err)
	}
	reader, err := controller.NewClusterReader(cfg, held.Instance)
	if err != nil {
		return err
	}
	findings, err := leaks.Audit(ctx, held, reader.Read)
	if err != nil {
		return err
	}
	rep := AuditReport{Findings: findings, Counts: map[leaks.Kind]map[leaks.Verdict]int{}, ClusterID: *clusterID}
	for _, k := range leaks.Kinds {
		rep.Counts[k] = map[leaks.Verdict]int{leaks.Held: 0, leaks.Orphan: 0, leaks.Unclaimed: 0}
	}
	for _, f := range findings {
		rep.Counts[f.Kind][f.Verdict]++
		switch f.Verdict {
		case leaks.Orphan:
			rep.Orphans++
		case leaks.Unclaimed:
			rep.Unclaimed++
		default:
			rep.Held++
		}
	}
	if *format == "json" {
		return writeJSON(out, rep)
	}
	return printAudit(out, rep)
}

func printAudit(out io.Writer, rep AuditReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tADDRESS\tRESOURCE\tVERDICT\tHELD BY / WHY NOT\tRELEASE")
	for _, f := range rep.Findings {
		who := f.Reason
		if f.Verdict == leaks.Held {
			who = f.Holder + ": " + f.Reason
		}
		release := f.Release
		if release == "" {
			release = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Kind, f.Address, f.Resource, f.Verdict, who, release)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var parts []string
	for _, k := range leaks.Kinds {
		parts = append(parts, fmt.Sprintf("%s=%d/%d/%d", k, rep.Counts[k][leaks.Held], rep.Counts[k][leaks.Orphan], rep.Counts[k][leaks.Unclaimed]))
	}
	_, err := fmt.Fprintf(out, "audit: held=%d orphans=%d unclaimed=%d (held/orphan/unclaimed: %s) cluster=%s\n",
		rep.Held, rep.Orphans, rep.Unclaimed, strings.Join(parts, " "), rep.ClusterID)
	if rep.Orphans+rep.Unclaimed > 0 {
		_, err = fmt.Fprintln(out, "a dry run: vpcni-controller releases an orphan once it stays orphaned for its -leak-grace (routes and pairs: its routes reconciler); an unclaimed one never")
	}
	return err
}
