package ec2api

import (
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sdkimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/lab/imds"
)

// The lab world's IPv6 blocks: the VPC's /56 and the first subnet's /64
// (the /28 and the us-east-1b subnet have none).
var (
	vpc6 = netip.MustParsePrefix("2600:1f18:aa:bb00::/56")
	sub6 = netip.MustParsePrefix("2600:1f18:aa:bb01::/64")
)

func newLab6(t *testing.T) *lab {
	t.Helper()
	l := newLab(t)
	if err := l.s.AddVPCIPv6(l.vpc, vpc6); err != nil {
		t.Fatal(err)
	}
	if err := l.s.AddSubnetIPv6(l.sub, sub6); err != nil {
		t.Fatal(err)
	}
	return l
}

func ipv6s(e types.NetworkInterface) []string {
	var out []string
	for _, a := range e.Ipv6Addresses {
		out = append(out, *a.Ipv6Address)
	}
	return out
}

func prefixes6(e types.NetworkInterface) []string {
	var out []string
	for _, p := range e.Ipv6Prefixes {
		out = append(out, *p.Ipv6Prefix)
	}
	return out
}

// TestIPv6Subnet: DescribeSubnets and DescribeVpcs list the IPv6 blocks
// as EC2 does (ipv6CidrBlockAssociationSet), and the seeding refuses
// blocks EC2 would not give.
func TestIPv6Subnet(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	out := must[*ec2.DescribeSubnetsOutput](t, "DescribeSubnets")(l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{l.sub, l.bz}}))
	got := map[string]string{}
	for _, sn := range out.Subnets {
		var blocks []string
		for _, a := range sn.Ipv6CidrBlockAssociationSet {
			blocks = append(blocks, *a.Ipv6CidrBlock+" "+string(a.Ipv6CidrBlockState.State)+" "+strings.Split(*a.AssociationId, "-")[0])
		}
		got[*sn.SubnetId] = strings.Join(blocks, ",")
	}
	if got[l.sub] != sub6.String()+" associated subnet" || got[l.bz] != "" {
		t.Fatalf("subnets' IPv6 blocks: %v", got)
	}
	f := must[*ec2.DescribeSubnetsOutput](t, "filter")(l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: []types.Filter{
		{Name: aws.String("ipv6-cidr-block-association.ipv6-cidr-block"), Values: []string{sub6.String()}}}}))
	if len(f.Subnets) != 1 || *f.Subnets[0].SubnetId != l.sub {
		t.Fatalf("filter by IPv6 block: %d subnets", len(f.Subnets))
	}
	v := must[*ec2.DescribeVpcsOutput](t, "DescribeVpcs")(l.c.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{VpcIds: []string{l.vpc}}))
	if a := v.Vpcs[0].Ipv6CidrBlockAssociationSet; len(a) != 1 || *a[0].Ipv6CidrBlock != vpc6.String() {
		t.Fatalf("VPC IPv6 blocks: %+v", a)
	}
	for _, bad := range []struct{ id, cidr string }{
		{l.sub, "2600:1f18:aa:bb02::/64"},     // the subnet has one
		{l.bz, "2600:1f18:aa:cc00::/64"},      // outside the VPC's /56
		{l.bz, "2600:1f18:aa:bb01:8000::/80"}, // overlaps l.sub's
		{l.bz, "2600:1f18:aa:bb03::/96"},      // too small
		{l.bz, "10.0.3.0/24"},
	} {
		if err := l.s.AddSubnetIPv6(bad.id, netip.MustParsePrefix(bad.cidr)); err == nil {
			t.Errorf("AddSubnetIPv6 %s %s: accepted", bad.id, bad.cidr)
		}
	}
}

// TestAssignIPv6: by count, by address, by /80 prefix count and by
// prefix; the answer lists only what the call assigned; DescribeNetwork-
// Interfaces and the filters show them; unassign gives them back.
func TestAssignIPv6(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	l.attach(t, id, l.inst.ID, 1)
	a := must[*ec2.AssignIpv6AddressesOutput](t, "by count")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(2)}))
	if len(a.AssignedIpv6Addresses) != 2 || len(a.AssignedIpv6Prefixes) != 0 || *a.NetworkInterfaceId != id {
		t.Fatalf("answer: %+v", a)
	}
	for _, s := range a.AssignedIpv6Addresses {
		ip := netip.MustParseAddr(s)
		if !sub6.Contains(ip) || ip.As16()[15] < 4 && ip.As16()[14] == 0 {
			t.Fatalf("address %s: not a usable address of %s", ip, sub6)
		}
	}
	b := must[*ec2.AssignIpv6AddressesOutput](t, "again")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)}))
	if len(b.AssignedIpv6Addresses) != 1 || slices.Contains(a.AssignedIpv6Addresses, b.AssignedIpv6Addresses[0]) {
		t.Fatalf("second answer %v: want one new address only (first %v)", b.AssignedIpv6Addresses, a.AssignedIpv6Addresses)
	}
	explicit := "2600:1f18:aa:bb01::abcd"
	must[*ec2.AssignIpv6AddressesOutput](t, "by address")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6Addresses: []string{explicit}}))
	p := must[*ec2.AssignIpv6AddressesOutput](t, "by prefix count")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6PrefixCount: aws.Int32(1)}))
	if len(p.AssignedIpv6Prefixes) != 1 || len(p.AssignedIpv6Addresses) != 0 {
		t.Fatalf("prefix answer: %+v", p)
	}
	pf := netip.MustParsePrefix(p.AssignedIpv6Prefixes[0])
	if pf.Bits() != 80 || pf.Masked() != pf || !sub6.Contains(pf.Addr()) || pf.Contains(sub6.Addr()) {
		t.Fatalf("prefix %s: not an aligned /80 of %s clear of the reserved addresses", pf, sub6)
	}
	e := l.eni(t, id)
	want := append(append(slices.Clone(a.AssignedIpv6Addresses), b.AssignedIpv6Addresses...), explicit)
	if got := ipv6s(e); !slices.Equal(got, want) {
		t.Fatalf("ipv6AddressesSet %v, want %v", got, want)
	}
	if got := prefixes6(e); !slices.Equal(got, []string{pf.String()}) {
		t.Fatalf("ipv6PrefixSet %v", got)
	}
	for _, a := range want {
		if pf.Contains(netip.MustParseAddr(a)) {
			t.Fatalf("prefix %s covers address %s", pf, a)
		}
	}
	for name, v := range map[string]string{"ipv6-addresses.ipv6-address": explicit, "ipv6-prefix": pf.String()} {
		out := must[*ec2.DescribeNetworkInterfacesOutput](t, name)(l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
			Filters: []types.Filter{{Name: aws.String(name), Values: []string{v}}}}))
		if got := ids(out.NetworkInterfaces); !slices.Equal(got, []string{id}) {
			t.Errorf("filter %s=%s: %v", name, v, got)
		}
	}

	other := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	inside := pf.Addr().Next().String()
	for what, in := range map[string]*ec2.AssignIpv6AddressesInput{
		"an address held by another ENI": {Ipv6Addresses: []string{explicit}},
		"an address inside another /80":  {Ipv6Addresses: []string{inside}},
	} {
		in.NetworkInterfaceId = &other
		_, err := l.c.AssignIpv6Addresses(ctx, in)
		wantCode(t, what, err, "InvalidIPAddress.InUse", 400)
	}
	for what, in := range map[string]*ec2.AssignIpv6AddressesInput{
		"an address outside the /64":    {Ipv6Addresses: []string{"2600:1f18:aa:bb02::9"}},
		"a reserved address":            {Ipv6Addresses: []string{"2600:1f18:aa:bb01::2"}},
		"an IPv4 address":               {Ipv6Addresses: []string{"10.0.1.9"}},
		"a misaligned /80":              {Ipv6Prefixes: []string{"2600:1f18:aa:bb01:0:1::/80"}},
		"a /96":                         {Ipv6Prefixes: []string{"2600:1f18:aa:bb01:9::/96"}},
		"the /80 of reserved addresses": {Ipv6Prefixes: []string{"2600:1f18:aa:bb01::/80"}},
		"a /80 held":                    {Ipv6Prefixes: []string{pf.String()}},
		"a zero count":                  {Ipv6AddressCount: aws.Int32(0)},
	} {
		in.NetworkInterfaceId = &other
		_, err := l.c.AssignIpv6Addresses(ctx, in)
		wantCode(t, what, err, "InvalidParameterValue", 400)
	}
	_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &other, Ipv6AddressCount: aws.Int32(1), Ipv6PrefixCount: aws.Int32(1)})
	wantCode(t, "count and prefix count", err, "InvalidParameterCombination", 400)
	_, err = l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &other})
	wantCode(t, "nothing asked", err, "MissingParameter", 400)
	_, err = l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String("eni-0123456789abcdef0"), Ipv6AddressCount: aws.Int32(1)})
	wantCode(t, "unknown ENI", err, "InvalidNetworkInterfaceID.NotFound", 400)
	explicitPrefix := "2600:1f18:aa:bb01:9::/80"
	must[*ec2.AssignIpv6AddressesOutput](t, "by prefix")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &other, Ipv6Prefixes: []string{explicitPrefix}}))

	u := must[*ec2.UnassignIpv6AddressesOutput](t, "unassign")(l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: &id,
		Ipv6Addresses: []string{explicit}, Ipv6Prefixes: []string{pf.String()}}))
	if !slices.Equal(u.UnassignedIpv6Addresses, []string{explicit}) || !slices.Equal(u.UnassignedIpv6Prefixes, []string{pf.String()}) {
		t.Fatalf("unassign answer: %+v", u)
	}
	if e := l.eni(t, id); len(e.Ipv6Addresses) != 3 || len(e.Ipv6Prefixes) != 0 {
		t.Fatalf("after unassign: %v %v", ipv6s(e), prefixes6(e))
	}
	_, err = l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6Prefixes: []string{explicitPrefix}})
	wantCode(t, "unassign another ENI's /80", err, "InvalidParameterValue", 400)
	_, err = l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6Addresses: []string{explicit}})
	wantCode(t, "unassign an address no longer held", err, "InvalidParameterValue", 400)
	// Freed, the address and the /80 go to another ENI.
	must[*ec2.AssignIpv6AddressesOutput](t, "a freed address")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &other, Ipv6Addresses: []string{explicit}}))
	must[*ec2.AssignIpv6AddressesOutput](t, "a freed /80")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &other, Ipv6Prefixes: []string{pf.String()}}))
	// Deleting an ENI frees what it held.
	must[*ec2.DeleteNetworkInterfaceOutput](t, "delete")(l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &other}))
	third := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	must[*ec2.AssignIpv6AddressesOutput](t, "a deleted ENI's /80")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &third, Ipv6Prefixes: []string{pf.String(), explicitPrefix}}))
}

// TestIPv6Limit: Ipv6AddressesPerInterface bounds addresses and /80s
// together (each /80 one slot) on an attached ENI, separately from the
// IPv4 slots; attaching an ENI holding more is refused.
func TestIPv6Limit(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(5)}).NetworkInterfaceId
	l.attach(t, id, l.inst.ID, 1)
	// t3.medium: 6 per ENI.
	must[*ec2.AssignIpv6AddressesOutput](t, "4 addresses")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(4)}))
	must[*ec2.AssignIpv6AddressesOutput](t, "a /80")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6PrefixCount: aws.Int32(1)}))
	_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6PrefixCount: aws.Int32(2)})
	wantCode(t, "two /80s on one free slot", err, "PrivateIpAddressLimitExceeded", 400)
	must[*ec2.AssignIpv6AddressesOutput](t, "the sixth")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)}))
	_, err = l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)})
	wantCode(t, "the seventh", err, "PrivateIpAddressLimitExceeded", 400)
	if e := l.eni(t, id); len(e.PrivateIpAddresses) != 6 || len(e.Ipv6Addresses) != 5 || len(e.Ipv6Prefixes) != 1 {
		t.Fatalf("ENI holds %d v4, %d v6, %d /80", len(e.PrivateIpAddresses), len(e.Ipv6Addresses), len(e.Ipv6Prefixes))
	}
	// A detached ENI has no type to hold it to; attaching checks.
	big := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{Ipv6AddressCount: aws.Int32(7)}).NetworkInterfaceId
	_, err = l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &big, InstanceId: &l.inst.ID, DeviceIndex: aws.Int32(2)})
	wantCode(t, "attach an ENI holding 7", err, "PrivateIpAddressLimitExceeded", 400)
}

// TestIPv6NoBlock: IPv6 on a subnet without an IPv6 block is refused with
// a client error (moto fails with a 500, AWS-FACTS V63).
func TestIPv6NoBlock(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz}).NetworkInterfaceId
	_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)})
	wantCode(t, "assign on a subnet without IPv6", err, "InvalidParameterValue", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz, Ipv6PrefixCount: aws.Int32(1)})
	wantCode(t, "create with a /80 on a subnet without IPv6", err, "InvalidParameterValue", 400)
	out := must[*ec2.DescribeNetworkInterfacesOutput](t, "describe")(l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("subnet-id"), Values: []string{l.bz}}}}))
	if len(out.NetworkInterfaces) != 1 {
		t.Fatalf("a refused create left %d ENIs in the subnet", len(out.NetworkInterfaces))
	}
	// Once the subnet has a block, its ENIs take addresses from it.
	if err := l.s.AddSubnetIPv6(l.bz, netip.MustParsePrefix("2600:1f18:aa:bb03::/64")); err != nil {
		t.Fatal(err)
	}
	must[*ec2.AssignIpv6AddressesOutput](t, "after AddSubnetIPv6")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)}))
}

// TestInsufficientIPv6CidrBlocks: a block with every /80 taken (or
// touched by an address) has no prefix to give.
func TestInsufficientIPv6CidrBlocks(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	// A /76 holds 16 /80s; the first and last hold reserved addresses.
	if err := l.s.AddSubnetIPv6(l.bz, netip.MustParsePrefix("2600:1f18:aa:bb03::/76")); err != nil {
		t.Fatal(err)
	}
	c := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz, Ipv6PrefixCount: aws.Int32(13), Ipv6Addresses: []types.InstanceIpv6Address{
		{Ipv6Address: aws.String("2600:1f18:aa:bb03:e::9")}}})
	if len(c.Ipv6Prefixes) != 13 || len(c.Ipv6Addresses) != 1 {
		t.Fatalf("CreateNetworkInterface: %v %v", prefixes6(c), ipv6s(c))
	}
	for _, p := range prefixes6(c) {
		if strings.HasPrefix(p, "2600:1f18:aa:bb03:e:") || p == "2600:1f18:aa:bb03::/80" {
			t.Fatalf("prefix %s: holds an address or the reserved ones", p)
		}
	}
	id := *c.NetworkInterfaceId
	_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6PrefixCount: aws.Int32(1)})
	wantCode(t, "no /80 left", err, "InsufficientCidrBlocks", 400)
	// Addresses still come: from the first /80.
	a := must[*ec2.AssignIpv6AddressesOutput](t, "an address")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6AddressCount: aws.Int32(1)}))
	if a.AssignedIpv6Addresses[0] != "2600:1f18:aa:bb03::4" {
		t.Fatalf("address %v: want the lowest usable, 2600:1f18:aa:bb03::4", a.AssignedIpv6Addresses)
	}
	first := prefixes6(c)[0]
	must[*ec2.UnassignIpv6AddressesOutput](t, "free one")(l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6Prefixes: []string{first}}))
	again := must[*ec2.AssignIpv6AddressesOutput](t, "the freed /80")(l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &id, Ipv6PrefixCount: aws.Int32(1)}))
	if !slices.Equal(again.AssignedIpv6Prefixes, []string{first}) {
		t.Fatalf("after freeing %s: got %v", first, again.AssignedIpv6Prefixes)
	}
}

// TestIMDSIPv6: the lab IMDS serves an ENI's ipv6s, ipv6-prefix,
// subnet-ipv6-cidr-blocks and vpc-ipv6-cidr-blocks, and none of them for
// an ENI without IPv6.
func TestIMDSIPv6(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{Ipv6AddressCount: aws.Int32(2), Ipv6PrefixCount: aws.Int32(1)}).NetworkInterfaceId
	l.attach(t, id, l.inst.ID, 1)
	e := l.eni(t, id)
	for name, src := range map[string]imds.Source{"lab": l.s, "through the SDK": imds.FromEC2(l.c)} {
		hs := httptest.NewServer(imds.New(src, l.inst.ID, imds.Options{}))
		c := sdkimds.New(sdkimds.Options{Endpoint: hs.URL})
		get := func(p string) (string, int) {
			t.Helper()
			out, err := c.GetMetadata(ctx, &sdkimds.GetMetadataInput{Path: p})
			if err != nil {
				var re interface{ HTTPStatusCode() int }
				if errors.As(err, &re) {
					return "", re.HTTPStatusCode()
				}
				t.Fatalf("%s: GET %s: %v", name, p, err)
			}
			defer out.Content.Close()
			b, _ := io.ReadAll(out.Content)
			return string(b), 200
		}
		d := "network/interfaces/macs/" + *e.MacAddress + "/"
		for path, want := range map[string]string{
			d + "ipv6s":                   strings.Join(ipv6s(e), "\n"),
			d + "ipv6-prefix":             strings.Join(prefixes6(e), "\n"),
			d + "subnet-ipv6-cidr-blocks": sub6.String(),
			d + "vpc-ipv6-cidr-blocks":    vpc6.String(),
		} {
			if got, code := get(path); code != 200 || got != want {
				t.Errorf("%s: %s: %d %q, want %q", name, path, code, got, want)
			}
		}
		prim := "network/interfaces/macs/" + l.inst.MAC + "/"
		if _, code := get(prim + "ipv6s"); code != 404 {
			t.Errorf("%s: the primary ENI, without IPv6, serves ipv6s (%d)", name, code)
		}
		if got, _ := get(d); !strings.Contains(got, "ipv6s") || !strings.Contains(got, "ipv6-prefix") {
			t.Errorf("%s: the ENI's listing lacks ipv6s/ipv6-prefix: %q", name, got)
		}
		hs.Close()
	}
}

// TestIPv6ThrottleBuckets: AssignIpv6Addresses has its own bucket of 100
// (EC2's table); UnassignIpv6Addresses, not listed there, takes the
// generic mutating one of 50.
func TestIPv6ThrottleBuckets(t *testing.T) {
	t.Parallel()
	l := newLab6(t)
	l.s.faults.mu.Lock()
	l.s.faults.now = func() time.Time { return time.Unix(1e9, 0) } // no refill during the test
	l.s.faults.mu.Unlock()
	l.s.Throttle(true)
	missing := aws.String("eni-0123456789abcdef0")
	for i := range 100 {
		_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: missing, Ipv6AddressCount: aws.Int32(1)})
		wantCode(t, fmt.Sprintf("assign %d", i+1), err, "InvalidNetworkInterfaceID.NotFound", 400)
	}
	_, err := l.c.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: missing, Ipv6AddressCount: aws.Int32(1)})
	wantCode(t, "assign 101", err, "RequestLimitExceeded", 503)
	for i := range 50 {
		_, err := l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: missing, Ipv6Addresses: []string{"2600:1f18:aa:bb01::9"}})
		wantCode(t, fmt.Sprintf("unassign %d", i+1), err, "InvalidNetworkInterfaceID.NotFound", 400)
	}
	_, err = l.c.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: missing, Ipv6Addresses: []string{"2600:1f18:aa:bb01::9"}})
	wantCode(t, "unassign 51", err, "RequestLimitExceeded", 503)
}
