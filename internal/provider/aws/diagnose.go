package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/provider"
)

// The doctor's steps, in the order New takes them.
const (
	stepIMDS        = "imds"
	stepIdentity    = "identity"
	stepEC2         = "ec2"
	stepCapacity    = "capacity"
	stepPrefix      = "prefix"
	stepSubnets     = "subnets"
	stepPermissions = "permissions"
)

// codeDryRun is EC2's answer (412) to a DryRun request the caller may
// make: the permission check passed and nothing was changed.
const codeDryRun = "DryRunOperation"

// Diagnose is the provider's provider.Doctor: it runs New's start-up steps
// one by one — an IMDSv2 token, the identity IMDS gives, EC2 and the
// credentials, the instance type's limits, prefix delegation, the subnets
// of extra ENIs — and then asks EC2, with DryRun, whether the node's role
// may make each write the provider makes. It changes nothing: a dry run
// is checked for permission and answered 412 DryRunOperation without
// effect. EC2 requests go through node.Transport. It returns the steps in
// order, each not passed with its fix; after a failed one the rest were
// not tried.
func Diagnose(ctx context.Context, cfg Config, node provider.DoctorNode) (steps []provider.Step) {
	defer func() {
		for i := range steps {
			steps[i].Fix = fix(steps[i], cfg, node.ConfigFile)
		}
	}()
	step := func(name, detail string, err error) bool {
		steps = append(steps, provider.Step{Name: name, Detail: detail, Err: err})
		return err == nil
	}
	// IMDS answers at once on EC2; a token lost on the way (the hop
	// limit) would otherwise cost the SDK's three attempts of a full
	// timeout each.
	short := cfg
	short.Timeout.Duration = min(cfg.Timeout.Duration, 5*time.Second)
	md := newIMDS(short)
	if !step(stepIMDS, "IMDSv2 at "+imdsEndpoint(cfg)+" gave a token and the instance ID", readIMDS(ctx, md)) {
		return steps
	}
	id, err := readIdentity(ctx, md)
	if !step(stepIdentity, describeIdentity(id), err) {
		return steps
	}
	p := &Provider{cfg: cfg, id: id, meter: newMeter(cfg.APIRate, cfg.APIBurst), subnets: map[string]*subnet{}, log: slog.New(slog.DiscardHandler)}
	if p.ec2, err = p.connect(ctx, md); err != nil {
		step(stepEC2, "", err)
		return steps
	}
	rt := node.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	// The doctor's requests go through the node's transport (doctor reads
	// the clock of their answers), two attempts each: a person waits.
	p.ec2 = ec2.New(p.ec2.Options(), func(o *ec2.Options) {
		o.HTTPClient = &http.Client{Transport: rt, Timeout: cfg.Timeout.Duration}
		o.Retryer = retry.AddWithMaxAttempts(o.Retryer, 2)
	})
	enis, detail, err := p.diagnoseEC2(ctx)
	if !step(stepEC2, detail, err) {
		return steps
	}
	if p.limits, err = ReadTypeLimits(ctx, p.ec2, id.instanceType); err != nil {
		step(stepCapacity, "", err)
		return steps
	}
	steps = append(steps, p.capacity(enis))
	if cfg.PrefixMode {
		var err error
		if !p.limits.Nitro() {
			err = fmt.Errorf("prefixMode: instance type %s runs on %q, and EC2 delegates prefixes only to Nitro instances", id.instanceType, p.limits.Hypervisor)
		}
		if !step(stepPrefix, fmt.Sprintf("instance type %s runs on Nitro: EC2 delegates /28 prefixes to it", id.instanceType), err) {
			return steps
		}
	}
	s := p.diagnoseSubnets(ctx)
	steps = append(steps, s)
	if s.Err != nil {
		return steps
	}
	return append(steps, p.permissions(ctx, enis))
}

// diagnose is Diagnose as provider.Doctor calls it, with the validated
// section.
func diagnose(ctx context.Context, s provider.Settings, node provider.DoctorNode) []provider.Step {
	return Diagnose(ctx, *s.(*Config), node)
}

// imdsEndpoint is where the IMDS client asks, as it resolves it.
func imdsEndpoint(cfg Config) string {
	if cfg.IMDSEndpoint != "" {
		return cfg.IMDSEndpoint
	}
	if e := os.Getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"); e != "" {
		return e
	}
	return "http://169.254.169.254"
}

// readIMDS asks IMDS for the instance ID: a token first (the client is
// IMDSv2 only), then the metadata.
func readIMDS(ctx context.Context, md *imds.Client) error {
	out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: "instance-id"})
	if err != nil {
		return fmt.Errorf("IMDSv2 token and instance-id: %w: %w", err, provider.ErrUnavailable)
	}
	defer out.Content.Close()
	_, err = io.Copy(io.Discard, out.Content)
	return err
}

func describeIdentity(id identity) string {
	return fmt.Sprintf("instance %s (%s) in %s; primary ENI %s (%s) in subnet %s (%s); VPC %s %v",
		id.instanceID, id.instanceType, id.az, id.eniID, id.mac, id.subnetID, id.subnet, id.vpcID, id.vpcCIDRs)
}

// diagnoseEC2 asks EC2 whether the node's credentials may read its ENIs
// (a dry run: 412 says yes), then reads them as start does.
func (p *Provider) diagnoseEC2(ctx context.Context) ([]types.NetworkInterface, string, error) {
	creds, err := p.ec2.Options().Credentials.Retrieve(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("no AWS credentials: %w", err)
	}
	filter := []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{p.id.instanceID}}}
	_, err = p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: filter, DryRun: aws.Bool(true)})
	if err != nil && code(err) != codeDryRun {
		return nil, "", explain(fmt.Errorf("dry run of DescribeNetworkInterfaces with credentials from %s: %w", creds.Source, err))
	}
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: filter})
	if err != nil {
		return nil, "", explain(fmt.Errorf("read the ENIs of instance %s: %w", p.id.instanceID, err))
	}
	var list []string
	primary := false
	for _, n := range out.NetworkInterfaces {
		e := p.parseENI(n)
		primary = primary || e.id == p.id.eniID
		list = append(list, fmt.Sprintf("%s (device %d: %d secondary addresses, %d prefixes)", e.id, e.device, len(e.secondaries), len(e.prefixes)))
	}
	if !primary {
		return nil, "", fmt.Errorf("EC2 lists no ENI %s (the primary ENI IMDS names) on instance %s: is provider.aws.endpoint this instance's region?", p.id.eniID, p.id.instanceID)
	}
	slices.Sort(list)
	return out.NetworkInterfaces, fmt.Sprintf("EC2 accepts the credentials (from %s); instance %s has %s", creds.Source, p.id.instanceID, strings.Join(list, ", ")), nil
}

// capacity says what the instance type allows and how much of it the
// instance's ENIs use now (anyone's addresses counted: EC2 counts them).
func (p *Provider) capacity(enis []types.NetworkInterface) provider.Step {
	s := provider.Step{Name: stepCapacity}
	maxENIs := p.limits.ENIs
	if p.cfg.MaxENIs > 0 && p.cfg.MaxENIs < maxENIs {
		maxENIs = p.cfg.MaxENIs
	}
	used := 0
	for _, n := range enis {
		used += p.parseENI(n).used()
	}
	unit := "secondary addresses"
	if p.cfg.PrefixMode {
		unit = "/28 prefixes"
	}
	slots := maxENIs * p.limits.slots()
	s.Detail = fmt.Sprintf("instance type %s: %d ENIs × %d %s = %d pod addresses; %d of %d slots used on its %d ENIs now",
		p.id.instanceType, maxENIs, p.limits.slots(), unit, p.limits.Capacity(maxENIs, p.cfg.PrefixMode), used, slots, len(enis))
	if used >= slots {
		s.Warn = true
		s.Detail += ": no room for another pod address on this node"
	}
	return s
}

// diagnoseSubnets finds the subnets of extra ENIs as start does, and how
// many addresses each has free.
func (p *Provider) diagnoseSubnets(ctx context.Context) provider.Step {
	s := provider.Step{Name: stepSubnets}
	if err := p.findENISubnets(ctx); err != nil {
		s.Err = err
		return s
	}
	if err := p.readSubnets(ctx, p.eniSubnets); err != nil {
		s.Err = err
		return s
	}
	need, first := 1, "address"
	if p.cfg.PrefixMode {
		need, first = prefixSize, "prefix"
	}
	room := false
	var list []string
	for _, id := range p.eniSubnets {
		sn := p.subnets[id]
		room = room || sn.free >= need
		list = append(list, fmt.Sprintf("%s (%s, %s): %d free", sn.id, sn.cidr, sn.az, sn.free))
	}
	s.Detail = "extra ENIs go to " + strings.Join(list, ", ")
	if !room {
		s.Warn = true
		s.Detail += fmt.Sprintf(": none has the %d free addresses an extra ENI's first %s needs", need, first)
	}
	return s
}

// dryRun is one write the provider makes, asked with DryRun.
type dryRun struct {
	action string
	call   func(ctx context.Context) error
}

// permissions asks EC2, with DryRun, whether the node's role may make the
// writes the provider makes: 412 DryRunOperation is yes, 403
// UnauthorizedOperation no. Assign and Unassign have no DryRun in EC2's
// API: they cannot be asked without a change.
func (p *Provider) permissions(ctx context.Context, enis []types.NetworkInterface) provider.Step {
	s := provider.Step{Name: stepPermissions}
	dry := aws.Bool(true)
	groups := p.cfg.SecurityGroups
	if len(groups) == 0 {
		groups = p.id.groups
	}
	attachment := ""
	for _, n := range enis {
		if aws.ToString(n.NetworkInterfaceId) == p.id.eniID && n.Attachment != nil {
			attachment = aws.ToString(n.Attachment.AttachmentId)
		}
	}
	eni := p.id.eniID
	calls := []dryRun{
		{"DescribeInstances", func(ctx context.Context) error {
			_, err := p.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{p.id.instanceID}, DryRun: dry})
			return err
		}},
		{"DescribeSubnets", func(ctx context.Context) error {
			_, err := p.ec2.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{p.id.subnetID}, DryRun: dry})
			return err
		}},
		{"CreateNetworkInterface", func(ctx context.Context) error {
			_, err := p.ec2.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &p.eniSubnets[0], Groups: groups, DryRun: dry})
			return err
		}},
		{"CreateTags", func(ctx context.Context) error {
			_, err := p.ec2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eni}, DryRun: dry,
				Tags: []types.Tag{{Key: aws.String(tagOwner), Value: aws.String(ownerValue)}}})
			return err
		}},
		{"AttachNetworkInterface", func(ctx context.Context) error {
			_, err := p.ec2.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{InstanceId: &p.id.instanceID, NetworkInterfaceId: &eni,
				DeviceIndex: aws.Int32(1), DryRun: dry})
			return err
		}},
		{"ModifyNetworkInterfaceAttribute", func(ctx context.Context) error {
			_, err := p.ec2.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &eni, DryRun: dry,
				Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: &attachment, DeleteOnTermination: aws.Bool(true)}})
			return err
		}},
		{"DetachNetworkInterface", func(ctx context.Context) error {
			_, err := p.ec2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &attachment, DryRun: dry})
			return err
		}},
		{"DeleteNetworkInterface", func(ctx context.Context) error {
			_, err := p.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &eni, DryRun: dry})
			return err
		}},
	}
	var allowed, denied, unknown []string
	var errs []error
	for _, c := range calls {
		err := c.call(ctx)
		switch code(err) {
		case codeDryRun:
			allowed = append(allowed, c.action)
		case codeUnauthorized, "AccessDenied":
			denied = append(denied, "ec2:"+c.action)
		case "":
			if err == nil {
				allowed = append(allowed, c.action) // an endpoint that ignores DryRun did the read
				continue
			}
			errs = append(errs, fmt.Errorf("dry run of %s: %w", c.action, err))
		default:
			// Another refusal than the permission's: EC2 checked the
			// request beyond it, but what the role may do is not known.
			unknown = append(unknown, fmt.Sprintf("%s (%s)", c.action, code(err)))
		}
	}
	if len(errs) > 0 {
		s.Err = explain(errors.Join(errs...))
		return s
	}
	if len(denied) > 0 {
		s.Err = fmt.Errorf("the node's IAM role may not call %s (EC2 answered UnauthorizedOperation to a dry run)", strings.Join(denied, ", "))
		return s
	}
	s.Detail = "dry runs allowed: " + strings.Join(allowed, ", ")
	if len(unknown) > 0 {
		s.Detail += "; not determined (EC2 refused the dry run for another reason): " + strings.Join(unknown, ", ")
	}
	s.Detail += "; AssignPrivateIpAddresses and UnassignPrivateIpAddresses have no DryRun in EC2's API: not asked"
	return s
}

// nodePolicy is the least IAM policy of a node's role, for fixes.
const nodePolicy = "ec2:DescribeInstances, ec2:DescribeInstanceTypes, ec2:DescribeNetworkInterfaces, ec2:DescribeSubnets, " +
	"ec2:DescribeSecurityGroups (PodNetworks with securityGroups), " +
	"ec2:CreateNetworkInterface, ec2:AttachNetworkInterface, ec2:DetachNetworkInterface, ec2:DeleteNetworkInterface, " +
	"ec2:ModifyNetworkInterfaceAttribute, ec2:AssignPrivateIpAddresses, ec2:UnassignPrivateIpAddresses, " +
	"ec2:AssignIpv6Addresses and ec2:UnassignIpv6Addresses (ipFamilies with ipv6), ec2:CreateTags (on network-interface/*)"

// fix says what to do about a step that failed or warns ("" for one that
// passed); configFile is the agent's config.
func fix(s provider.Step, cfg Config, configFile string) string {
	key := func(k string) string { return "provider.aws." + k + " in " + configFile }
	switch {
	case s.Err == nil && !s.Warn:
		return ""
	case s.Err == nil && s.Name == stepSubnets:
		return "add subnets for extra ENIs (" + key("subnets") + " or subnetTags), or free addresses in these"
	case s.Err == nil:
		return "the node holds as many pod addresses as its instance type allows: a larger instance type, prefixMode (Nitro types), or more nodes"
	}
	switch c := code(s.Err); {
	case c == codeUnauthorized || c == "AccessDenied":
		act := action(s.Err)
		if act == "" {
			act = "the action named"
		}
		return "add ec2:" + act + " to the node's IAM role (vpcni's least policy: " + nodePolicy + ")"
	case c == "AuthFailure" || c == "InvalidClientTokenId" || c == "SignatureDoesNotMatch":
		return "EC2 refused the credentials: check the instance profile's role, or the keys in vpcnid's environment, and the node's clock"
	}
	switch s.Name {
	case stepIMDS:
		return "vpcnid reads IMDSv2 at 169.254.169.254 from the host network; from a pod's own network namespace (not hostNetwork) the token's answer needs the instance's metadata hop limit ≥ 2 " +
			"(aws ec2 modify-instance-metadata-options --instance-id <id> --http-tokens required --http-put-response-hop-limit 2); an IMDS elsewhere is " + key("imdsEndpoint")
	case stepIdentity:
		return "IMDS answered a token but not the instance's network metadata: check the instance's metadata options (instance metadata tags and categories enabled), or " + key("imdsEndpoint")
	case stepEC2:
		if strings.Contains(s.Err.Error(), "no AWS credentials") {
			return "give the instance an instance profile whose role has vpcni's policy (" + nodePolicy + "), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in vpcnid's environment"
		}
		if errors.Is(s.Err, provider.ErrUnavailable) {
			ep := cfg.Endpoint
			if ep == "" {
				ep = "EC2's regional endpoint"
			}
			return "check that this node reaches " + ep + " (routes, DNS, a VPC endpoint for ec2, proxies), or " + key("endpoint") + " and region"
		}
		return "check " + key("endpoint") + " and region: EC2 must be the instance's own region"
	case stepPrefix:
		return "set " + key("prefixMode") + " to false, or run the node on a Nitro instance type"
	case stepSubnets:
		return "check " + key("subnets") + " and subnetTags: subnets of the instance's VPC in its availability zone"
	case stepPermissions:
		return "add the actions named to the node's IAM role (vpcni's least policy: " + nodePolicy + ")"
	}
	return "see the detail; vpcnid fails at start the same way"
}
