package ec2api

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestDescribeNetworkWorld: VPCs with their CIDR, security groups by VPC
// and name, subnets by tag (how a provider picks its subnets) with their
// free counts, and DescribeTags.
func TestDescribeNetworkWorld(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	vpcs := must[*ec2.DescribeVpcsOutput](t, "DescribeVpcs")(l.c.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{VpcIds: []string{l.vpc}}))
	if v := vpcs.Vpcs[0]; *v.CidrBlock != "10.0.0.0/16" || len(v.CidrBlockAssociationSet) != 1 || *v.CidrBlockAssociationSet[0].CidrBlock != "10.0.0.0/16" {
		t.Fatalf("VPC: %+v", v)
	}
	_, err := l.c.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{VpcIds: []string{"vpc-0123456789abcdef0"}})
	wantCode(t, "unknown VPC", err, "InvalidVpcID.NotFound", 400)

	nodes := l.s.AddSecurityGroup(l.vpc, "nodes")
	other := l.s.AddVPC(netip.MustParsePrefix("10.1.0.0/16"))
	l.s.AddSecurityGroup(other, "nodes")
	sgs := must[*ec2.DescribeSecurityGroupsOutput](t, "DescribeSecurityGroups")(l.c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{
		Filters: []types.Filter{{Name: aws.String("vpc-id"), Values: []string{l.vpc}}, {Name: aws.String("group-name"), Values: []string{"nodes"}}}}))
	if len(sgs.SecurityGroups) != 1 || *sgs.SecurityGroups[0].GroupId != nodes || *sgs.SecurityGroups[0].VpcId != l.vpc {
		t.Fatalf("security groups: %+v", sgs.SecurityGroups)
	}
	all := must[*ec2.DescribeSecurityGroupsOutput](t, "all groups")(l.c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{}))
	if len(all.SecurityGroups) != 4 { // two defaults, two "nodes"
		t.Fatalf("%d groups, want 4", len(all.SecurityGroups))
	}

	must[*ec2.CreateTagsOutput](t, "tag subnets")(l.c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{l.sub, l.bz},
		Tags: []types.Tag{{Key: aws.String("vpcni.io/cluster"), Value: aws.String("lab")}}}))
	subs := must[*ec2.DescribeSubnetsOutput](t, "subnets by tag")(l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{
		Filters: []types.Filter{{Name: aws.String("tag:vpcni.io/cluster"), Values: []string{"lab"}}, {Name: aws.String("vpc-id"), Values: []string{l.vpc}}}}))
	got := map[string]int32{}
	for _, s := range subs.Subnets {
		got[*s.SubnetId] = *s.AvailableIpAddressCount
		if len(s.Tags) != 1 || *s.VpcId != l.vpc {
			t.Fatalf("subnet %+v", s)
		}
	}
	if len(got) != 2 || got[l.sub] != 250 || got[l.bz] != 251 {
		t.Fatalf("tagged subnets and their free counts: %v (want %s 250, %s 251)", got, l.sub, l.bz)
	}
	_, err = l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: []types.Filter{{Name: aws.String("colour"), Values: []string{"x"}}}})
	wantCode(t, "unknown subnet filter", err, "InvalidFilter", 400)

	tags := must[*ec2.DescribeTagsOutput](t, "DescribeTags")(l.c.DescribeTags(ctx, &ec2.DescribeTagsInput{
		Filters: []types.Filter{{Name: aws.String("key"), Values: []string{"vpcni.io/cluster"}}, {Name: aws.String("resource-type"), Values: []string{"subnet"}}}}))
	var ids []string
	for _, td := range tags.Tags {
		ids = append(ids, *td.ResourceId)
	}
	slices.Sort(ids)
	want := []string{l.sub, l.bz}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("DescribeTags: %v, want %v", ids, want)
	}
	must[*ec2.DeleteTagsOutput](t, "untag")(l.c.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{l.bz},
		Tags: []types.Tag{{Key: aws.String("vpcni.io/cluster"), Value: aws.String("not-lab")}}}))
	if n := len(must[*ec2.DescribeSubnetsOutput](t, "after DeleteTags with another value")(l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{
		Filters: []types.Filter{{Name: aws.String("tag-key"), Values: []string{"vpcni.io/cluster"}}}})).Subnets); n != 2 {
		t.Fatalf("DeleteTags with a value that does not match removed the tag: %d subnets tagged", n)
	}
}

// TestCreateWithAddresses: CreateNetworkInterface takes its primary from
// PrivateIpAddress or the PrivateIpAddresses entry marked Primary, adds
// the other entries and SecondaryPrivateIpAddressCount more; and
// ModifyNetworkInterfaceAttribute sets its groups.
func TestCreateWithAddresses(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(1),
		PrivateIpAddresses: []types.PrivateIpAddressSpecification{{PrivateIpAddress: aws.String("10.0.1.51")},
			{PrivateIpAddress: aws.String("10.0.1.50"), Primary: aws.Bool(true)}}})
	got := ips(e)
	if *e.PrivateIpAddress != "10.0.1.50" || len(got) != 3 || got[0] != "10.0.1.50" || got[1] != "10.0.1.51" || !*e.PrivateIpAddresses[0].Primary {
		t.Fatalf("addresses %v primary %s", got, *e.PrivateIpAddress)
	}
	f := l.createENI(t, &ec2.CreateNetworkInterfaceInput{PrivateIpAddress: aws.String("10.0.1.60")})
	if *f.PrivateIpAddress != "10.0.1.60" {
		t.Fatalf("primary %s, want 10.0.1.60", *f.PrivateIpAddress)
	}
	_, err := l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub,
		PrivateIpAddresses: []types.PrivateIpAddressSpecification{{PrivateIpAddress: aws.String("10.0.1.61"), Primary: aws.Bool(true)}},
		PrivateIpAddress:   aws.String("10.0.1.62")})
	wantCode(t, "two primaries", err, "InvalidParameterCombination", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, PrivateIpAddress: aws.String("10.0.1.51")})
	wantCode(t, "a secondary of another ENI as primary", err, "InvalidIPAddress.InUse", 400)

	sg := l.s.AddSecurityGroup(l.vpc, "pods")
	id := *f.NetworkInterfaceId
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "Groups")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id, Groups: []string{sg}}))
	if g := l.eni(t, id).Groups; len(g) != 1 || *g[0].GroupId != sg || *g[0].GroupName != "pods" {
		t.Fatalf("groups after modify: %+v", g)
	}
	_, err = l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id, Groups: []string{"sg-0123456789abcdef0"}})
	wantCode(t, "modify to an unknown group", err, "InvalidGroup.NotFound", 400)
}
