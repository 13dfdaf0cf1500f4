package aws

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcni/vpcni/internal/provider"
)

// PodNetworks on AWS: the pods of a PodNetwork take their addresses from
// ENIs of their own — ENIs vpcni creates in the PodNetwork's subnets, with
// exactly its security groups, and attaches to the node's instance, as it
// does the node's own extra ENIs. EC2 applies security groups per ENI, so
// every pod of the network is filtered by the network's groups, and pods
// of two PodNetworks never share an ENI. The ENIs carry vpcni's tags of
// the instance plus vpcni.io/pod-network=<name>: the node's own provider
// takes no ENI with that tag as its own, and each network's provider takes
// only its own network's (parseENI). Addresses are secondary private IPs,
// or /28 prefixes when the node's prefixMode is on, as on the node's own
// ENIs. A new ENI goes to the PodNetwork's subnet with most free addresses
// (a full one moves on); one emptied by Release is detached and deleted
// after eniMinLifetime. The instance type's ENIs on its default network
// card are shared by the node's own pods and every PodNetwork: a node
// whose instance has no ENI slot left serves no new network (nor a full
// one's next ENI).

// NetworkSpec is a PodNetwork's aws section.
type NetworkSpec struct {
	SubnetIDs      []string `json:"subnetIDs"`
	SecurityGroups []string `json:"securityGroups,omitempty"`
}

// podNetwork is the PodNetwork a provider serves.
type podNetwork struct {
	name string
	spec NetworkSpec
}

// recordsPath is where the network's provider keeps its records — its
// idle prefix addresses (prefixes.go) — apart from the node's own, under
// stateDir/podnetworks/<name> as every provider's state of a PodNetwork:
// sharing the node's file, a network would take the node's idle prefix
// addresses on the primary ENI as its own.
func (n *podNetwork) recordsPath(stateDir string) string {
	return filepath.Join(stateDir, "podnetworks", n.name, recordsFile)
}

// NewNetwork connects the provider of PodNetwork name on this node: it
// reads who the node is from IMDS and connects to EC2 as New does (cfg is
// the node's validated aws section), checks that the network's subnets and
// groups can hold ENIs of this instance, and reads the network's ENIs
// back. It refuses a spec that cannot be served, saying why.
func NewNetwork(ctx context.Context, cfg Config, node provider.Node, name string, raw json.RawMessage) (provider.Provider, error) {
	var spec NetworkSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("PodNetwork %s: its aws section: %w", name, err)
	}
	var bad []string
	if len(spec.SubnetIDs) == 0 {
		bad = append(bad, "aws.subnetIDs is empty")
	}
	for _, id := range spec.SubnetIDs {
		if !subnetRe.MatchString(id) {
			bad = append(bad, fmt.Sprintf("aws.subnetIDs: %q is not a subnet ID (subnet-…)", id))
		}
	}
	for _, id := range spec.SecurityGroups {
		if !sgRe.MatchString(id) {
			bad = append(bad, fmt.Sprintf("aws.securityGroups: %q is not a security group ID (sg-…)", id))
		}
	}
	if len(spec.SecurityGroups) > 16 {
		bad = append(bad, fmt.Sprintf("aws.securityGroups: %d groups, and an ENI takes at most 16", len(spec.SecurityGroups)))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("PodNetwork %s: %s", name, strings.Join(bad, "; "))
	}
	p, err := open(ctx, cfg, node, &podNetwork{name: name, spec: spec})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// checkNetwork reads the network's subnets and groups and settles where
// its ENIs go: every subnet must be in the instance's VPC and availability
// zone (EC2 attaches an ENI only to an instance of its own zone, and takes
// groups only of the ENI's VPC), every group must exist in that VPC. No
// group given: EC2 gives each ENI the VPC's default group. The caller
// has the identity read and the client connected.
func (p *Provider) checkNetwork(ctx context.Context, net *podNetwork) error {
	spec := net.spec
	if err := p.readSubnets(ctx, spec.SubnetIDs); err != nil {
		return fmt.Errorf("PodNetwork %s: aws.subnetIDs: %w", net.name, err)
	}
	var bad []string
	for _, id := range spec.SubnetIDs {
		sn := p.subnets[id]
		switch {
		case sn.vpc != "" && sn.vpc != p.id.vpcID:
			bad = append(bad, fmt.Sprintf("subnet %s (%s) is in VPC %s, not in the instance's VPC %s", id, sn.cidr, sn.vpc, p.id.vpcID))
		case sn.az != "" && p.id.az != "" && sn.az != p.id.az:
			bad = append(bad, fmt.Sprintf("subnet %s (%s) is in availability zone %s, and EC2 attaches an ENI only to an instance of its own zone (%s)", id, sn.cidr, sn.az, p.id.az))
		}
	}
	if len(spec.SecurityGroups) > 0 {
		// A group that does not exist fails the first ENI's create with
		// an error a person must decode (and moto accepts it, making a
		// phantom group, AWS-FACTS CN9): say it now.
		out, err := p.ec2.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: spec.SecurityGroups})
		if err != nil {
			return explain(fmt.Errorf("PodNetwork %s: aws.securityGroups %s: %w", net.name, strings.Join(spec.SecurityGroups, ", "), err))
		}
		vpcOf := map[string]string{}
		for _, g := range out.SecurityGroups {
			vpcOf[aws.ToString(g.GroupId)] = aws.ToString(g.VpcId)
		}
		for _, id := range spec.SecurityGroups {
			switch vpc, ok := vpcOf[id]; {
			case !ok:
				bad = append(bad, fmt.Sprintf("security group %s does not exist", id))
			case vpc != "" && vpc != p.id.vpcID:
				bad = append(bad, fmt.Sprintf("security group %s is of VPC %s, not of the instance's VPC %s", id, vpc, p.id.vpcID))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("PodNetwork %s: %s", net.name, strings.Join(bad, "; "))
	}
	p.eniSubnets, p.groups = slices.Clone(spec.SubnetIDs), slices.Clone(spec.SecurityGroups)
	return nil
}

// networkInfo is Info for a PodNetwork's provider: its subnets and
// groups, and its bound — the slots of its own ENIs and of one ENI in each
// free slot of the instance, as last read (before that, of every ENI
// beyond the primary one); the free slots are shared with the node's own
// pods and its other PodNetworks.
func (p *Provider) networkInfo() provider.Info {
	var subs []string
	for _, id := range p.eniSubnets {
		if s := p.subnets[id]; s != nil {
			subs = append(subs, fmt.Sprintf("%s (%s)", id, s.cidr))
		}
	}
	sg := "the VPC's default security group"
	if len(p.groups) > 0 {
		sg = "security groups " + strings.Join(p.groups, ", ")
	}
	extra := max(p.maxENIs-1, 0)
	per := fmt.Sprintf("%d secondary addresses", p.limits.slots())
	if p.cfg.PrefixMode {
		per = fmt.Sprintf("%d /28 prefixes of 16 addresses", p.limits.slots())
	}
	capacity := p.limits.Capacity(extra, p.cfg.PrefixMode)
	why := fmt.Sprintf("%s on each of up to %d ENIs (%d ENIs of instance type %s less the primary ENI; the node's own pods and its other PodNetworks share them)",
		per, extra, p.maxENIs, p.id.instanceType)
	if free, ok := p.freeSlots(); ok {
		// What the instance can still give the network: its ENIs and
		// the free slots (which every network counts as its own).
		own := int(p.ownENIs.Load())
		capacity = p.limits.Capacity(min(own+free, extra), p.cfg.PrefixMode)
		why = fmt.Sprintf("%s on each of its %d ENIs and the instance's %d free ENI slots (%d ENIs of instance type %s; the node's own pods and its other PodNetworks share them)",
			per, own, free, p.maxENIs, p.id.instanceType)
	}
	free, ok := p.freeSlots()
	if !ok {
		free = -1
	}
	return provider.Info{
		Name: "aws", Calls: p.meter.snapshot(), VPCCIDRs: slices.Clone(p.id.vpcCIDRs),
		Capacity: capacity, CapacityReason: why,
		FreeNICs: free, NICAddresses: p.limits.Capacity(1, p.cfg.PrefixMode),
		Subnet: fmt.Sprintf("pod network %s: subnets %s; %s", p.network, strings.Join(subs, ", "), sg),
	}
}

// networkRoom is how many addresses a PodNetwork the node does not serve
// yet could get here (Registration.NetworkRoom): an ENI of its own in each
// of the instance's free slots (def.FreeNICs, counted by the node's own
// provider at each read of its ENIs), each holding def.NICAddresses.
// ok false until the ENIs were read.
func networkRoom(_ provider.Settings, _ json.RawMessage, def provider.Info) (int, bool) {
	if def.FreeNICs < 0 || def.NICAddresses <= 0 {
		return 0, false
	}
	return def.FreeNICs * def.NICAddresses, true
}
