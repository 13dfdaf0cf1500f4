package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
)

// maxPodsReport is what max-pods prints.
type maxPodsReport struct {
	InstanceType string `json:"instanceType"`
	Hypervisor   string `json:"hypervisor"`
	VCPUs        int    `json:"vcpus"`
	ENIs         int    `json:"enis"`
	IPv4PerENI   int    `json:"ipv4PerENI"`
	Prefix       bool   `json:"prefix"`
	// AWSMaxPods is the figure AWS documents for aws-vpc-cni (kubelet's
	// --max-pods on EKS AMIs).
	AWSMaxPods int    `json:"awsMaxPods"`
	AWSFormula string `json:"awsFormula"`
	// VpcniAddresses is vpcni's own capacity: the pod addresses the node
	// can hold, what it advertises as vpcni.io/ip.
	VpcniAddresses int    `json:"vpcniAddresses"`
	VpcniFormula   string `json:"vpcniFormula"`
}

// maxPods prints, for an EC2 instance type, the max-pods AWS documents and
// vpcni's own figure, from EC2's DescribeInstanceTypes.
func maxPods(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("max-pods", flag.ContinueOnError)
	fs.SetOutput(out)
	typ := fs.String("instance-type", "", "EC2 instance type, e.g. m5.large (required)")
	prefix := fs.Bool("prefix", false, "prefix mode: a /28 (16 addresses) per ENI slot")
	endpoint := fs.String("endpoint", "", "EC2 API URL (default: AWS's for the region)")
	region := fs.String("region", "", "AWS region (default: the SDK's, from the environment or ~/.aws/config; else us-east-1)")
	format := formatFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat("max-pods", *format); err != nil {
		return err
	}
	if *typ == "" {
		return usageError{"max-pods: --instance-type is required"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithDefaultRegion("us-east-1")}
	if *region != "" {
		opts = append(opts, awsconfig.WithRegion(*region))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return fmt.Errorf("AWS SDK configuration: %w", err)
	}
	client := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if *endpoint != "" {
			o.BaseEndpoint = aws.String(*endpoint)
		}
	})
	l, err := vpcaws.ReadTypeLimits(ctx, client, *typ)
	if err != nil {
		return err
	}
	r := report(l, *prefix)
	if *format == "json" {
		return writeJSON(out, r)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "instance type\t%s (%s, %d vCPUs)\n", r.InstanceType, r.Hypervisor, r.VCPUs)
	fmt.Fprintf(w, "ENIs\t%d of %d IPv4 addresses each (default network card)\n", r.ENIs, r.IPv4PerENI)
	fmt.Fprintf(w, "aws max-pods\t%d\t%s\n", r.AWSMaxPods, r.AWSFormula)
	fmt.Fprintf(w, "vpcni\t%d\t%s\n", r.VpcniAddresses, r.VpcniFormula)
	return w.Flush()
}

func report(l vpcaws.TypeLimits, prefix bool) maxPodsReport {
	hv := l.Hypervisor
	if l.BareMetal {
		hv = "bare metal"
	}
	r := maxPodsReport{InstanceType: l.Type, Hypervisor: hv, VCPUs: l.VCPUs, ENIs: l.ENIs, IPv4PerENI: l.IPv4PerENI, Prefix: prefix,
		AWSMaxPods: l.AWSMaxPods(prefix), VpcniAddresses: l.Capacity(l.ENIs, prefix)}
	r.AWSFormula = fmt.Sprintf("= ENIs × (IPs − 1) + 2 = %d × %d + 2 (the +2: host-network pods)", l.ENIs, l.IPv4PerENI-1)
	r.VpcniFormula = fmt.Sprintf("pod addresses = ENIs × (IPs − 1) = %d × %d; the node's vpcni.io/ip (host-network pods need none)", l.ENIs, l.IPv4PerENI-1)
	if prefix {
		ceiling := 110
		if l.VCPUs > 30 {
			ceiling = 250
		}
		r.AWSFormula = fmt.Sprintf("= min(ENIs × (IPs − 1) × 16 + 2, %d) = min(%d × %d × 16 + 2, %d) (the cap AWS recommends for %s30 vCPUs)",
			ceiling, l.ENIs, l.IPv4PerENI-1, ceiling, map[bool]string{true: "more than ", false: "up to "}[l.VCPUs > 30])
		r.VpcniFormula = fmt.Sprintf("pod addresses = ENIs × (IPs − 1) × 16 = %d × %d × 16 in /28 prefixes; the node's vpcni.io/ip — set kubelet's --max-pods to what the node can run", l.ENIs, l.IPv4PerENI-1)
		if !l.Nitro() {
			r.VpcniFormula = "prefix mode needs a Nitro instance type; this one is " + hv
			r.VpcniAddresses = 0
		}
	}
	return r
}
