package imds

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// EC2 is a Source that reads an instance through any EC2 API (moto_server,
// the lab's endpoint, EC2 itself), so IMDS can be served for an instance
// that lives there. EC2's API does not hand out an instance role's keys:
// Role and Credentials, if Role is set, are served as the instance
// profile's.
type EC2 struct {
	client      *ec2.Client
	Role        string
	Credentials Credentials
}

// FromEC2 reads instances through client: DescribeInstances for the
// instance, DescribeNetworkInterfaces for its ENIs (the ENI API's view,
// which also lists prefixes), DescribeSubnets and DescribeVpcs for their
// CIDRs. The region is the client's.
func FromEC2(client *ec2.Client) *EC2 { return &EC2{client: client} }

// Instance implements Source.
func (e *EC2) Instance(ctx context.Context, id string) (Instance, error) {
	out, err := e.client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return Instance{}, fmt.Errorf("describe instance %s: %w", id, err)
	}
	var found *types.Instance
	account := ""
	for _, r := range out.Reservations {
		for i := range r.Instances {
			if aws.ToString(r.Instances[i].InstanceId) == id {
				found, account = &r.Instances[i], aws.ToString(r.OwnerId)
			}
		}
	}
	if found == nil {
		return Instance{}, fmt.Errorf("instance %s: not found", id)
	}
	inst := Instance{
		ID: id, Type: string(found.InstanceType), Region: e.client.Options().Region, AccountID: account,
		Role: e.Role, Credentials: e.Credentials,
	}
	if found.Placement != nil {
		inst.AZ = aws.ToString(found.Placement.AvailabilityZone)
	}
	inst.LocalIPv4, _ = netip.ParseAddr(aws.ToString(found.PrivateIpAddress))

	enis, err := e.client.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{id}}},
	})
	if err != nil {
		return Instance{}, fmt.Errorf("describe the ENIs of instance %s: %w", id, err)
	}
	subnets, vpcs := map[string]netip.Prefix{}, map[string][]netip.Prefix{}
	for _, n := range enis.NetworkInterfaces {
		subnets[aws.ToString(n.SubnetId)] = netip.Prefix{}
		vpcs[aws.ToString(n.VpcId)] = nil
	}
	sub6, vpc6 := map[string][]netip.Prefix{}, map[string][]netip.Prefix{}
	if err := e.cidrs(ctx, subnets, vpcs, sub6, vpc6); err != nil {
		return Instance{}, err
	}
	for _, n := range enis.NetworkInterfaces {
		nic := Interface{
			MAC: strings.ToLower(aws.ToString(n.MacAddress)), ID: aws.ToString(n.NetworkInterfaceId),
			SubnetID: aws.ToString(n.SubnetId), VPCID: aws.ToString(n.VpcId),
		}
		nic.SubnetCIDR, nic.VPCCIDRs = subnets[nic.SubnetID], vpcs[nic.VPCID]
		nic.SubnetIPv6CIDRs, nic.VPCIPv6CIDRs = sub6[nic.SubnetID], vpc6[nic.VPCID]
		for _, a := range n.Ipv6Addresses {
			if ip, err := netip.ParseAddr(aws.ToString(a.Ipv6Address)); err == nil {
				nic.IPv6s = append(nic.IPv6s, ip)
			}
		}
		for _, p := range n.Ipv6Prefixes {
			if pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv6Prefix)); err == nil {
				nic.IPv6Prefixes = append(nic.IPv6Prefixes, pfx)
			}
		}
		if a := n.Attachment; a != nil {
			nic.DeviceNumber = int(aws.ToInt32(a.DeviceIndex))
			nic.NetworkCard = int(aws.ToInt32(a.NetworkCardIndex))
		}
		for _, g := range n.Groups {
			nic.SecurityGroups = append(nic.SecurityGroups, aws.ToString(g.GroupId))
		}
		// The ENI's primary address first, as IMDS lists local-ipv4s.
		var primary, rest []string
		for _, p := range n.PrivateIpAddresses {
			if aws.ToBool(p.Primary) {
				primary = append(primary, aws.ToString(p.PrivateIpAddress))
			} else {
				rest = append(rest, aws.ToString(p.PrivateIpAddress))
			}
		}
		nic.LocalIPv4s = addrs(append(primary, rest...))
		for _, p := range n.Ipv4Prefixes {
			if pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix)); err == nil {
				nic.IPv4Prefixes = append(nic.IPv4Prefixes, pfx)
			}
		}
		inst.Interfaces = append(inst.Interfaces, nic)
	}
	slices.SortFunc(inst.Interfaces, func(a, b Interface) int {
		if a.NetworkCard != b.NetworkCard {
			return a.NetworkCard - b.NetworkCard
		}
		return a.DeviceNumber - b.DeviceNumber
	})
	if len(inst.Interfaces) == 0 || inst.Interfaces[0].DeviceNumber != 0 {
		return Instance{}, fmt.Errorf("instance %s: no ENI at device index 0", id)
	}
	return inst, nil
}

// cidrs fills in the subnets' and VPCs' IPv4 CIDRs, and their IPv6 blocks
// in sub6 and vpc6.
func (e *EC2) cidrs(ctx context.Context, subnets map[string]netip.Prefix, vpcs, sub6, vpc6 map[string][]netip.Prefix) error {
	sn, err := e.client.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: keys(subnets)})
	if err != nil {
		return fmt.Errorf("describe subnets: %w", err)
	}
	for _, s := range sn.Subnets {
		subnets[aws.ToString(s.SubnetId)], _ = netip.ParsePrefix(aws.ToString(s.CidrBlock))
		for _, a := range s.Ipv6CidrBlockAssociationSet {
			// moto 5.2.1 writes the state as "{'State': 'associated'}".
			if st := a.Ipv6CidrBlockState; st != nil && (strings.Contains(string(st.State), "disassociat") || !strings.Contains(string(st.State), "associated")) {
				continue
			}
			if p, err := netip.ParsePrefix(aws.ToString(a.Ipv6CidrBlock)); err == nil {
				sub6[aws.ToString(s.SubnetId)] = append(sub6[aws.ToString(s.SubnetId)], p)
			}
		}
	}
	vs, err := e.client.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{VpcIds: keys(vpcs)})
	if err != nil {
		return fmt.Errorf("describe VPCs: %w", err)
	}
	for _, v := range vs.Vpcs {
		// The VPC's first CIDR, then every other one associated.
		var list []netip.Prefix
		if p, err := netip.ParsePrefix(aws.ToString(v.CidrBlock)); err == nil {
			list = append(list, p)
		}
		for _, a := range v.CidrBlockAssociationSet {
			if a.CidrBlockState != nil && a.CidrBlockState.State != types.VpcCidrBlockStateCodeAssociated {
				continue
			}
			if p, err := netip.ParsePrefix(aws.ToString(a.CidrBlock)); err == nil && !slices.Contains(list, p) {
				list = append(list, p)
			}
		}
		vpcs[aws.ToString(v.VpcId)] = list
		for _, a := range v.Ipv6CidrBlockAssociationSet {
			// moto leaves a VPC's Amazon-provided block "associating".
			if st := a.Ipv6CidrBlockState; st != nil && st.State != types.VpcCidrBlockStateCodeAssociated && st.State != types.VpcCidrBlockStateCodeAssociating {
				continue
			}
			if p, err := netip.ParsePrefix(aws.ToString(a.Ipv6CidrBlock)); err == nil {
				vpc6[aws.ToString(v.VpcId)] = append(vpc6[aws.ToString(v.VpcId)], p)
			}
		}
	}
	for id, p := range subnets {
		if !p.IsValid() {
			return errors.New("subnet " + id + ": no CIDR in EC2's answer")
		}
	}
	return nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
