package ec2api

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestSubnetExhaustion: a /28 holds 11 usable addresses (EC2 keeps the
// first four and the broadcast); they are handed out once each, never a
// reserved one, and then InsufficientFreeAddressesInSubnet — with the
// count at 0, not below (moto goes to −31).
func TestSubnetExhaustion(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	if n := l.available(t, l.small); n != 11 {
		t.Fatalf("a fresh /28 has %d available, want 11", n)
	}
	seen := map[string]bool{}
	var enis []string
	for range 3 { // 3 ENIs × (1 + 2 secondaries) = 9
		e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.small, SecondaryPrivateIpAddressCount: aws.Int32(2)})
		enis = append(enis, *e.NetworkInterfaceId)
		for _, a := range ips(e) {
			seen[a] = true
		}
	}
	must[*ec2.AssignPrivateIpAddressesOutput](t, "the last two")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: &enis[0], SecondaryPrivateIpAddressCount: aws.Int32(2)}))
	for _, a := range ips(l.eni(t, enis[0])) {
		seen[a] = true
	}
	sn := netip.MustParsePrefix("10.0.2.0/28")
	for a := range seen {
		off := offset(sn, netip.MustParseAddr(a))
		if off < 4 || off == 15 || !sn.Contains(netip.MustParseAddr(a)) {
			t.Errorf("handed out %s (a reserved or outside address)", a)
		}
	}
	if len(seen) != 11 {
		t.Fatalf("%d distinct addresses handed out, want all 11: %v", len(seen), seen)
	}
	if n := l.available(t, l.small); n != 0 {
		t.Fatalf("full /28: %d available, want 0", n)
	}
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &enis[1], SecondaryPrivateIpAddressCount: aws.Int32(1)})
	wantCode(t, "assign on a full subnet", err, "InsufficientFreeAddressesInSubnet", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.small})
	wantCode(t, "ENI on a full subnet", err, "InsufficientFreeAddressesInSubnet", 400)
	if n := l.available(t, l.small); n != 0 {
		t.Fatalf("after the refusals: %d available, want 0", n)
	}
}

// TestAddressChecks: an address outside the subnet, a reserved one, or
// one another ENI holds is refused; AllowReassignment moves a secondary
// (moto keeps it on both) but never a primary.
func TestAddressChecks(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	a := l.createENI(t, &ec2.CreateNetworkInterfaceInput{})
	b := l.createENI(t, &ec2.CreateNetworkInterfaceInput{})
	aID, bID := *a.NetworkInterfaceId, *b.NetworkInterfaceId
	assign := func(id string, reassign bool, addrs ...string) error {
		_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: addrs, AllowReassignment: aws.Bool(reassign)})
		return err
	}
	wantCode(t, "outside the subnet", assign(aID, false, "192.168.5.5"), "InvalidParameterValue", 400)
	for _, r := range []string{"10.0.1.0", "10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.255"} {
		wantCode(t, "reserved "+r, assign(aID, false, r), "InvalidParameterValue", 400)
	}
	_, err := l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, PrivateIpAddress: aws.String("10.0.9.9")})
	wantCode(t, "CreateNetworkInterface outside the subnet", err, "InvalidParameterValue", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, PrivateIpAddress: b.PrivateIpAddress})
	wantCode(t, "CreateNetworkInterface on another's primary", err, "InvalidIPAddress.InUse", 400)

	if err := assign(aID, false, "10.0.1.200"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "another ENI's secondary", assign(bID, false, "10.0.1.200"), "InvalidIPAddress.InUse", 400)
	wantCode(t, "another ENI's primary, even with reassignment", assign(bID, true, *a.PrivateIpAddress), "InvalidIPAddress.InUse", 400)
	wantCode(t, "twice in one call", assign(bID, false, "10.0.1.201", "10.0.1.201"), "InvalidParameterValue", 400)
	before := l.available(t, l.sub)
	if err := assign(bID, true, "10.0.1.200"); err != nil {
		t.Fatalf("reassign: %v", err)
	}
	if slices.Contains(ips(l.eni(t, aID)), "10.0.1.200") || !slices.Contains(ips(l.eni(t, bID)), "10.0.1.200") {
		t.Fatalf("after reassignment: a %v b %v", ips(l.eni(t, aID)), ips(l.eni(t, bID)))
	}
	if after := l.available(t, l.sub); after != before {
		t.Fatalf("a move changed the free count %d → %d", before, after)
	}
	// Subnet-wide uniqueness over many picks and ENIs.
	all := map[string]string{}
	for i := range 8 {
		e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(int32(i + 3))})
		for _, ip := range ips(e) {
			if other, dup := all[ip]; dup {
				t.Fatalf("%s on %s and %s", ip, other, *e.NetworkInterfaceId)
			}
			all[ip] = *e.NetworkInterfaceId
		}
	}
}

// TestAssignRules: exactly one way of asking per call; the answer lists
// only what this call assigned (moto lists every address of the ENI); the
// count goes down by N and back up by N.
func TestAssignRules(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id})
	wantCode(t, "neither count nor addresses", err, "MissingParameter", 400)
	_, err = l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(1), PrivateIpAddresses: []string{"10.0.1.100"}})
	wantCode(t, "count and addresses", err, "InvalidParameterCombination", 400)
	_, err = l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(1), Ipv4PrefixCount: aws.Int32(1)})
	wantCode(t, "count and prefix count", err, "InvalidParameterCombination", 400)

	before := l.available(t, l.sub)
	out := must[*ec2.AssignPrivateIpAddressesOutput](t, "assign 3")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(3)}))
	if len(out.AssignedPrivateIpAddresses) != 3 || *out.NetworkInterfaceId != id {
		t.Fatalf("assign 3 answered %d addresses (only the new ones are listed)", len(out.AssignedPrivateIpAddresses))
	}
	if n := l.available(t, l.sub); n != before-3 {
		t.Fatalf("available %d → %d after assigning 3", before, n)
	}
	var got []string
	for _, a := range out.AssignedPrivateIpAddresses {
		got = append(got, *a.PrivateIpAddress)
	}
	must[*ec2.UnassignPrivateIpAddressesOutput](t, "unassign 3")(l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: got}))
	if n := l.available(t, l.sub); n != before {
		t.Fatalf("available %d → %d after unassigning them", before, n)
	}
	e := l.eni(t, id)
	if len(e.PrivateIpAddresses) != 1 {
		t.Fatalf("after unassign: %v", ips(e))
	}
	_, err = l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: []string{got[0]}})
	wantCode(t, "unassign an address not on the ENI", err, "InvalidParameterValue", 400)
	_, err = l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: []string{*e.PrivateIpAddress}})
	wantCode(t, "unassign the primary", err, "InvalidParameterValue", 400)
	_, err = l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id})
	wantCode(t, "unassign nothing", err, "MissingParameter", 400)
}

// TestIPLimit: on an attached ENI the primary, each secondary and each
// /28 prefix take one of Ipv4AddressesPerInterface (6 on a t3.medium).
func TestIPLimit(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	primary := l.inst.ENIID
	must[*ec2.AssignPrivateIpAddressesOutput](t, "5 secondaries")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &primary, SecondaryPrivateIpAddressCount: aws.Int32(5)}))
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &primary, SecondaryPrivateIpAddressCount: aws.Int32(1)})
	wantCode(t, "a 7th address", err, "PrivateIpAddressLimitExceeded", 400)

	e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(2)})
	id := *e.NetworkInterfaceId
	l.attach(t, id, l.inst.ID, 1)
	must[*ec2.AssignPrivateIpAddressesOutput](t, "2 prefixes")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, Ipv4PrefixCount: aws.Int32(2)}))
	must[*ec2.AssignPrivateIpAddressesOutput](t, "a 6th slot")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(1)}))
	_, err = l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, Ipv4PrefixCount: aws.Int32(1)})
	wantCode(t, "a 7th slot as a prefix", err, "PrivateIpAddressLimitExceeded", 400)

	// An ENI holding more than the type allows cannot be attached.
	big := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(6)})
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: l.eni(t, id).Attachment.AttachmentId}))
	_, err = l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: big.NetworkInterfaceId, InstanceId: &l.inst.ID, DeviceIndex: aws.Int32(1)})
	wantCode(t, "attach an ENI with 7 addresses to a t3.medium", err, "PrivateIpAddressLimitExceeded", 400)
}

// TestPrefixes: Ipv4PrefixCount gives aligned /28s of the subnet that
// overlap no address; a prefix's 16 addresses leave the free count and
// stay out of other hands; prefixes are unassigned as prefixes.
func TestPrefixes(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(3)})
	id := *e.NetworkInterfaceId
	before := l.available(t, l.sub)
	out := must[*ec2.AssignPrivateIpAddressesOutput](t, "2 prefixes")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, Ipv4PrefixCount: aws.Int32(2)}))
	if len(out.AssignedIpv4Prefixes) != 2 || len(out.AssignedPrivateIpAddresses) != 0 {
		t.Fatalf("answer: %+v", out)
	}
	sn := netip.MustParsePrefix("10.0.1.0/24")
	var got []string
	for _, p := range out.AssignedIpv4Prefixes {
		pf := netip.MustParsePrefix(*p.Ipv4Prefix)
		if pf.Bits() != 28 || pf.Masked() != pf || !sn.Contains(pf.Addr()) || pf.Addr() == sn.Addr() {
			t.Fatalf("prefix %s: not an aligned /28 of %s clear of the reserved addresses", pf, sn)
		}
		for _, a := range append(ips(l.eni(t, id)), ips(l.eni(t, l.inst.ENIID))...) {
			if pf.Contains(netip.MustParseAddr(a)) {
				t.Fatalf("prefix %s covers address %s", pf, a)
			}
		}
		got = append(got, pf.String())
	}
	if n := l.available(t, l.sub); n != before-32 {
		t.Fatalf("available %d → %d after two prefixes, want −32", before, n)
	}
	if p := prefixes(l.eni(t, id)); !slices.Equal(p, got) {
		t.Fatalf("DescribeNetworkInterfaces prefixes %v, assigned %v", p, got)
	}
	inside := netip.MustParsePrefix(got[0]).Addr().Next().String()
	other := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, PrivateIpAddresses: []string{inside}, AllowReassignment: aws.Bool(true)})
	wantCode(t, "an address inside another ENI's prefix", err, "InvalidIPAddress.InUse", 400)
	for _, bad := range []string{"10.0.1.8/28", "10.0.1.64/27", got[1], "10.0.7.0/28", "10.0.1.0/28"} {
		_, err = l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, Ipv4Prefixes: []string{bad}})
		wantCode(t, "prefix "+bad, err, "InvalidParameterValue", 400)
	}
	explicit := "10.0.1.240/28"
	_, err = l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, Ipv4Prefixes: []string{explicit}})
	wantCode(t, "the last /28 (holds the broadcast)", err, "InvalidParameterValue", 400)
	explicit = "10.0.1.224/28"
	must[*ec2.AssignPrivateIpAddressesOutput](t, "explicit prefix")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, Ipv4Prefixes: []string{explicit}}))
	must[*ec2.UnassignPrivateIpAddressesOutput](t, "unassign a prefix")(l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, Ipv4Prefixes: got[:1]}))
	if p := prefixes(l.eni(t, id)); !slices.Equal(p, got[1:]) {
		t.Fatalf("after unassigning %s: %v", got[0], p)
	}
	_, err = l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, Ipv4Prefixes: []string{explicit}})
	wantCode(t, "unassign another ENI's prefix", err, "InvalidParameterValue", 400)
	c := l.createENI(t, &ec2.CreateNetworkInterfaceInput{Ipv4PrefixCount: aws.Int32(1)})
	if len(c.Ipv4Prefixes) != 1 || len(c.PrivateIpAddresses) != 1 {
		t.Fatalf("CreateNetworkInterface with Ipv4PrefixCount 1: %v %v", prefixes(c), ips(c))
	}
}

// TestInsufficientCidrBlocks: a subnet with one address taken in every
// /28 has plenty of free addresses and no prefix to give.
func TestInsufficientCidrBlocks(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz}).NetworkInterfaceId // 10.0.3.4
	var scatter []string
	for blk := 1; blk < 15; blk++ {
		scatter = append(scatter, fmt.Sprintf("10.0.3.%d", blk*16+7))
	}
	must[*ec2.AssignPrivateIpAddressesOutput](t, "one address in every /28")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: scatter}))
	if n := l.available(t, l.bz); n < 200 {
		t.Fatalf("fragmented subnet has only %d free; the test wants plenty", n)
	}
	other := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz}).NetworkInterfaceId
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, Ipv4PrefixCount: aws.Int32(1)})
	wantCode(t, "prefix in a fragmented subnet", err, "InsufficientCidrBlocks", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz, Ipv4PrefixCount: aws.Int32(1)})
	wantCode(t, "new ENI with a prefix in a fragmented subnet", err, "InsufficientCidrBlocks", 400)
	if n := len(l.s.ENIs()); n != 3 {
		t.Fatalf("%d ENIs: the refused create left one behind", n)
	}
	// Freeing one /28 makes room for exactly one prefix.
	must[*ec2.UnassignPrivateIpAddressesOutput](t, "free a /28")(l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: scatter[4:5]}))
	out := must[*ec2.AssignPrivateIpAddressesOutput](t, "prefix in the freed /28")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &other, Ipv4PrefixCount: aws.Int32(1)}))
	if got := *out.AssignedIpv4Prefixes[0].Ipv4Prefix; got != "10.0.3.80/28" {
		t.Fatalf("prefix %s, want the freed 10.0.3.80/28", got)
	}
}

// TestENIFilters: the DescribeNetworkInterfaces filters a provider uses
// select what they say; an unknown one is a 4xx InvalidFilter (moto: 500).
func TestENIFilters(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	tag := func(k, v string) []types.TagSpecification {
		return []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: []types.Tag{{Key: &k, Value: &v}}}}
	}
	a := l.createENI(t, &ec2.CreateNetworkInterfaceInput{TagSpecifications: tag("vpcni.io/node", "node-a"), SecondaryPrivateIpAddressCount: aws.Int32(2)})
	b := l.createENI(t, &ec2.CreateNetworkInterfaceInput{TagSpecifications: tag("vpcni.io/node", "node-b")})
	c := l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz, TagSpecifications: tag("other", "x")})
	l.attach(t, *a.NetworkInterfaceId, l.inst.ID, 1)
	A, B, C, P := *a.NetworkInterfaceId, *b.NetworkInterfaceId, *c.NetworkInterfaceId, l.inst.ENIID
	secondary := *a.PrivateIpAddresses[2].PrivateIpAddress
	cases := []struct {
		name   string
		values []string
		want   []string
	}{
		{"tag:vpcni.io/node", []string{"node-*"}, []string{A, B}},
		{"tag:vpcni.io/node", []string{"node-b"}, []string{B}},
		{"tag-key", []string{"other"}, []string{C}},
		{"attachment.instance-id", []string{l.inst.ID}, []string{A, P}},
		{"attachment.status", []string{"attached"}, []string{A, P}},
		{"status", []string{"available"}, []string{B, C}},
		{"subnet-id", []string{l.bz}, []string{C}},
		{"vpc-id", []string{l.vpc}, []string{A, B, C, P}},
		{"network-interface-id", []string{B, C}, []string{B, C}},
		{"interface-type", []string{"interface"}, []string{A, B, C, P}},
		{"requester-managed", []string{"true"}, nil},
		{"addresses.private-ip-address", []string{secondary}, []string{A}},
		{"attachment.device-index", []string{"0"}, []string{P}},
	}
	for _, tc := range cases {
		out := must[*ec2.DescribeNetworkInterfacesOutput](t, tc.name)(l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
			Filters: []types.Filter{{Name: aws.String(tc.name), Values: tc.values}}}))
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if got := ids(out.NetworkInterfaces); !slices.Equal(got, want) {
			t.Errorf("%s=%v: %v, want %v", tc.name, tc.values, got, want)
		}
	}
	out := must[*ec2.DescribeNetworkInterfacesOutput](t, "two filters")(l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("tag-key"), Values: []string{"vpcni.io/node"}}, {Name: aws.String("status"), Values: []string{"in-use"}}}}))
	if got := ids(out.NetworkInterfaces); !slices.Equal(got, []string{A}) {
		t.Errorf("two filters (and): %v, want [%s]", got, A)
	}
	_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{{Name: aws.String("colour"), Values: []string{"red"}}}})
	wantCode(t, "unknown filter", err, "InvalidFilter", 400)
}

// TestENIPagination: MaxResults 5–1000 with NextToken walks every ENI
// once; MaxResults beside IDs, out of range, or a bad token are refused.
func TestENIPagination(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	for range 11 {
		l.createENI(t, &ec2.CreateNetworkInterfaceInput{})
	}
	var seen []string
	pages := 0
	for p := ec2.NewDescribeNetworkInterfacesPaginator(l.c, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5)}); p.HasMorePages(); pages++ {
		out := must[*ec2.DescribeNetworkInterfacesOutput](t, "page")(p.NextPage(ctx))
		if len(out.NetworkInterfaces) > 5 {
			t.Fatalf("%d on a page of 5", len(out.NetworkInterfaces))
		}
		seen = append(seen, ids(out.NetworkInterfaces)...)
	}
	slices.Sort(seen)
	if len(seen) != 12 || len(slices.Compact(seen)) != 12 || pages != 3 {
		t.Fatalf("%d ENIs in %d pages: %v", len(seen), pages, seen)
	}
	_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(4)})
	wantCode(t, "MaxResults 4", err, "InvalidParameterValue", 400)
	_, err = l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(1001)})
	wantCode(t, "MaxResults 1001", err, "InvalidParameterValue", 400)
	_, err = l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5), NetworkInterfaceIds: []string{l.inst.ENIID}})
	wantCode(t, "MaxResults with IDs", err, "InvalidParameterCombination", 400)
	_, err = l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5), NextToken: aws.String("%%%")})
	wantCode(t, "bad NextToken", err, "InvalidNextToken", 400)
}
