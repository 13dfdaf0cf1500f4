package cluster_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// v6On reads an ENI's IPv6 addresses and /80s.
func v6On(t *testing.T, b *bed, eni string) (addrs []netip.Addr, prefixes []netip.Prefix) {
	t.Helper()
	out, err := b.c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range out.NetworkInterfaces[0].Ipv6Addresses {
		addrs = append(addrs, netip.MustParseAddr(aws.ToString(a.Ipv6Address)))
	}
	for _, p := range out.NetworkInterfaces[0].Ipv6Prefixes {
		prefixes = append(prefixes, netip.MustParsePrefix(aws.ToString(p.Ipv6Prefix)))
	}
	return addrs, prefixes
}

// A sticky pod's IPv6 address leaves a dead node's primary ENI
// (UnassignIpv6Addresses) so another node can take it; one in a /80 stays
// while the instance runs; Holders finds both kinds.
func TestTakeOffIPv6(t *testing.T) {
	b := newBed(t, "  clusterName: "+clusterName+"\n")
	b.ep.InstanceType = "m5.large"
	block := b.ep.AddIPv6(t, b.subnet)
	b.ep.Families = []family.Family{family.V4, family.V6}
	deadNode, dead := b.ep.NewInstance(t, b.subnet, netip.MustParseAddr("10.30.1.10"))
	_, next := b.ep.NewInstance(t, b.subnet, netip.MustParseAddr("10.30.1.20"))
	got, err := deadNode.Provider.Assign(ctx(t), provider.AssignRequest{Count: 2, Family: family.V6})
	if err != nil || len(got) != 2 {
		t.Fatalf("the dead node's IPv6 = %v, %v", got, err)
	}
	sticky := got[0].Address
	c := b.cloud(t)
	hs, err := c.Holders(ctx(t), sticky)
	if err != nil || len(hs) != 1 || hs[0].Resource != dead.ENI || hs[0].Instance != dead.ID || !strings.Contains(hs[0].How, "a secondary address of ENI") {
		t.Fatalf("holders of %s: %+v %v", sticky, hs, err)
	}
	take := func(a netip.Addr) error {
		_, err := b.c.AssignIpv6Addresses(ctx(t), &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &next.ENI, Ipv6Addresses: []string{a.String()}})
		return err
	}
	if err := take(sticky); err == nil || !strings.Contains(err.Error(), "InUse") {
		t.Fatalf("another instance took %s while the dead node's ENI held it: %v", sticky, err)
	}
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{sticky}); err != nil {
		t.Fatal(err)
	}
	if on, _ := v6On(t, b, dead.ENI); slices.Contains(on, sticky) || len(on) != 1 {
		t.Fatalf("the dead node's ENI holds %v after %s was taken off", on, sticky)
	}
	if err := take(sticky); err != nil {
		t.Fatalf("the next node takes %s: %v", sticky, err)
	}

	// In a /80 of a running instance: refused, the /80 named.
	out, err := b.c.AssignIpv6Addresses(ctx(t), &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &dead.ENI, Ipv6PrefixCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	pf := netip.MustParsePrefix(out.AssignedIpv6Prefixes[0])
	inPrefix := pf.Addr().Next()
	if !block.Contains(inPrefix) {
		t.Fatalf("/80 %s outside %s", pf, block)
	}
	hs, err = c.Holders(ctx(t), inPrefix)
	if err != nil || len(hs) != 1 || !strings.Contains(hs[0].How, "in prefix "+pf.String()) {
		t.Fatalf("holders of %s: %+v %v", inPrefix, hs, err)
	}
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{inPrefix}); err == nil || !strings.Contains(err.Error(), "still runs") || !strings.Contains(err.Error(), pf.String()) {
		t.Fatalf("an address of a running instance's /80: %v", err)
	}
	if _, left := v6On(t, b, dead.ENI); len(left) != 1 {
		t.Fatalf("the running instance's /80s: %v", left)
	}
}
