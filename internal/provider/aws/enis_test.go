package aws_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/provider"
	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

var cidrN atomic.Int32

// subnetCIDR gives each test a /24 of its own (moto is shared by the
// package's tests).
func subnetCIDR() netip.Prefix {
	n := cidrN.Add(1)
	return netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 120+n/250, n%250))
}

func at(p netip.Prefix, last byte) netip.Addr {
	b := p.Addr().As4()
	b[3] = last
	return netip.AddrFrom4(b)
}

// both runs a test against moto_server and the lab's endpoint.
func both(t *testing.T, f func(t *testing.T, ep *ec2test.Endpoint, s *ec2api.Server)) {
	t.Run("moto", func(t *testing.T) { t.Parallel(); f(t, motoEndpoint(), nil) })
	t.Run("lab", func(t *testing.T) {
		t.Parallel()
		ep, s := lab(t, ec2api.Options{})
		f(t, ep, s)
	})
}

// node makes a subnet, an instance at .10 and a provider with adjust.
func node(t *testing.T, ep *ec2test.Endpoint, adjust func(*vpcaws.Config)) (*vpcaws.Provider, ec2test.Instance, netip.Prefix) {
	t.Helper()
	cidr := subnetCIDR()
	sn := ep.NewSubnet(t, cidr.String(), 250)
	ep.Configure = adjust
	n, inst := ep.NewInstance(t, sn.ID, at(cidr, 10))
	return n.Provider.(*vpcaws.Provider), inst, cidr
}

func byENI(leases []alloc.Lease) map[string][]netip.Addr {
	m := map[string][]netip.Addr{}
	for _, l := range leases {
		m[l.Interface] = append(m[l.Interface], l.Address)
	}
	return m
}

// Once the primary ENI's 9 secondary slots (m5.large: 10 IPv4 addresses
// an ENI) are used, addresses go on ENIs vpcni creates — tagged as its
// own, attached at the next device index, deleted with the instance, in
// the primary's security groups — and their leases name the ENI as a NIC
// of its own (MAC, its primary address) so the datapath routes the pod
// through it. Past the type's 3 ENIs the node is exhausted, and says why.
// moto enforces no limit itself (AT5, AP6): the provider's own count
// from DescribeInstanceTypes stops it there.
func TestExtraENIs(t *testing.T) {
	both(t, func(t *testing.T, ep *ec2test.Endpoint, s *ec2api.Server) {
		p, inst, cidr := node(t, ep, func(c *vpcaws.Config) { c.ENIMinLifetime.Duration = time.Hour })
		if i := p.Info(); i.Capacity != 27 || !strings.Contains(i.CapacityReason, "3 ENIs") {
			t.Errorf("Info = %d (%s), want 27 from 3 ENIs of 10 addresses", i.Capacity, i.CapacityReason)
		}
		first, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 9})
		if err != nil || len(byENI(first)[inst.ENI]) != 9 {
			t.Fatalf("Assign(9) = %v, %v; want 9 on the primary ENI", first, err)
		}
		creates := p.Info().Calls["CreateNetworkInterface"]
		more, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 12})
		if err != nil || len(more) != 12 {
			t.Fatalf("Assign(12) = %v, %v", more, err)
		}
		if d := p.Info().Calls["CreateNetworkInterface"] - creates; d != 2 {
			t.Errorf("12 addresses past the primary took %d new ENIs, want 2", d)
		}
		enis := ep.ENIs(t, inst.ID)
		if len(enis) != 3 {
			t.Fatalf("the instance has %d ENIs, want 3", len(enis))
		}
		nics := byENI(more)
		for i, ni := range enis[1:] {
			id := aws.ToString(ni.NetworkInterfaceId)
			if d := aws.ToInt32(ni.Attachment.DeviceIndex); d != int32(i+1) {
				t.Errorf("ENI %s at device index %d, want %d", id, d, i+1)
			}
			if Tag(ni, "vpcni.io/owner") != "vpcni" || Tag(ni, "vpcni.io/instance-id") != inst.ID || Tag(ni, "vpcni.io/cluster") != "vpcni-test" || Tag(ni, "vpcni.io/created-at") == "" {
				t.Errorf("ENI %s tags %v", id, ni.TagSet)
			}
			if d := aws.ToString(ni.Description); !strings.Contains(d, "vpcni") || !strings.Contains(d, inst.ID) {
				t.Errorf("ENI %s description %q names neither vpcni nor the instance", id, d)
			}
			if s != nil && !aws.ToBool(ni.Attachment.DeleteOnTermination) {
				// moto accepts the attribute and ignores it (MA1).
				t.Errorf("ENI %s is not deleted on termination", id)
			}
			if g := groups(ni); !slices.Equal(g, groups(enis[0])) {
				t.Errorf("ENI %s in groups %v, the primary in %v", id, g, groups(enis[0]))
			}
			on := ep.ENIAddrs(t, id)
			for _, l := range more {
				if l.Interface != id {
					continue
				}
				if l.NIC == nil || l.NIC.MAC != strings.ToLower(aws.ToString(ni.MacAddress)) || l.NIC.Address.String() != aws.ToString(ni.PrivateIpAddress) || !slices.Contains(on, l.Address) {
					t.Errorf("lease %+v on ENI %s (MAC %s, primary %s, holds %v)", l, id, aws.ToString(ni.MacAddress), aws.ToString(ni.PrivateIpAddress), on)
				}
				if l.Prefix != cidr || l.Gateway != at(cidr, 1) {
					t.Errorf("lease %+v: want subnet %s via %s", l, cidr, at(cidr, 1))
				}
			}
			if want := []int{9, 3}[i]; len(nics[id]) != want {
				t.Errorf("ENI %s holds %d of vpcni's addresses, want %d", id, len(nics[id]), want)
			}
		}
		last, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 8})
		if len(last) != 6 || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "m5.large") {
			t.Fatalf("Assign(8) with room for 6 = %d, %v; want 6 and ErrExhausted naming the instance type", len(last), err)
		}
		all := slices.Concat(first, more, last)
		h, err := ep.Open(t, inst, nil).Held(ec2test.Ctx(t))
		if err != nil || !sameLeases(h, all) {
			t.Fatalf("after a restart Held = %v, %v; want %v", h, err, all)
		}
	})
}

func groups(ni types.NetworkInterface) []string {
	var out []string
	for _, g := range ni.Groups {
		out = append(out, aws.ToString(g.GroupId))
	}
	slices.Sort(out)
	return out
}

// Tag reads an ENI's tag.
func Tag(ni types.NetworkInterface, key string) string { return ec2test.Tag(ni, key) }

func sameLeases(a, b []alloc.Lease) bool {
	key := func(l alloc.Lease) string {
		nic := ""
		if l.NIC != nil {
			nic = l.NIC.MAC + "/" + l.NIC.Address.String()
		}
		return l.Address.String() + "@" + l.Interface + "/" + nic + "/" + l.Prefix.String() + "/" + l.Gateway.String()
	}
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		ka[i] = key(a[i])
	}
	for i := range b {
		kb[i] = key(b[i])
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// An extra ENI that lost its last pod address is detached and deleted once
// it has lived eniMinLifetime; the primary ENI stays whatever it holds.
func TestEmptiedENIGoes(t *testing.T) {
	both(t, func(t *testing.T, ep *ec2test.Endpoint, _ *ec2api.Server) {
		p, inst, _ := node(t, ep, func(c *vpcaws.Config) {
			c.ENIMinLifetime, c.CleanupInterval = config.Duration{Duration: time.Millisecond}, config.Duration{Duration: 50 * time.Millisecond}
		})
		got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 11})
		if err != nil || len(got) != 11 {
			t.Fatalf("Assign(11) = %v, %v", got, err)
		}
		extra := byENI(got)
		delete(extra, inst.ENI)
		if len(extra) != 1 || len(ep.ENIs(t, inst.ID)) != 2 {
			t.Fatalf("want one extra ENI with 2 addresses: %v", extra)
		}
		var id string
		for id = range extra {
		}
		if err := p.Release(ec2test.Ctx(t), extra[id]); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the emptied ENI detached and deleted", func() bool {
			out, err := ep.Client.DescribeNetworkInterfaces(ec2test.Ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
			return err != nil && strings.Contains(err.Error(), "InvalidNetworkInterfaceID.NotFound") || err == nil && len(out.NetworkInterfaces) == 0
		})
		if n := len(ep.ENIs(t, inst.ID)); n != 1 {
			t.Errorf("the instance has %d ENIs, want only its primary", n)
		}
		h, err := p.Held(ec2test.Ctx(t))
		if err != nil || len(h) != 9 {
			t.Errorf("Held = %d, %v; want the primary's 9", len(h), err)
		}
	})
}

// An ENI vpcni created for this instance that sits detached past
// leakedENIGrace (a crash between create and attach) is deleted at start;
// a detached ENI of another instance, or one not vpcni's, is left alone.
func TestLeakedENIsDeleted(t *testing.T) {
	both(t, func(t *testing.T, ep *ec2test.Endpoint, _ *ec2api.Server) {
		cidr := subnetCIDR()
		sn := ep.NewSubnet(t, cidr.String(), 250)
		_, inst := ep.NewInstance(t, sn.ID, at(cidr, 10))
		old := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		mk := func(tags map[string]string) string {
			var ts []types.Tag
			for k, v := range tags {
				ts = append(ts, types.Tag{Key: aws.String(k), Value: aws.String(v)})
			}
			out, err := ep.Client.CreateNetworkInterface(ec2test.Ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: &sn.ID,
				TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: ts}}})
			if err != nil {
				t.Fatal(err)
			}
			return aws.ToString(out.NetworkInterface.NetworkInterfaceId)
		}
		leaked := mk(map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": inst.ID, "vpcni.io/cluster": "vpcni-test", "vpcni.io/created-at": old})
		young := mk(map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": inst.ID, "vpcni.io/cluster": "vpcni-test", "vpcni.io/created-at": time.Now().UTC().Format(time.RFC3339)})
		other := mk(map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": "i-0000000000000dead", "vpcni.io/cluster": "vpcni-test", "vpcni.io/created-at": old})
		notOurs := mk(map[string]string{"team": "db", "vpcni.io/instance-id": inst.ID})
		ep.Open(t, inst, nil)
		exists := func(id string) bool {
			_, err := ep.Client.DescribeNetworkInterfaces(ec2test.Ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
			return err == nil
		}
		if exists(leaked) {
			t.Errorf("the leaked ENI %s is still there", leaked)
		}
		for _, id := range []string{young, other, notOurs} {
			if !exists(id) {
				t.Errorf("ENI %s was deleted; it is not this instance's leak", id)
			}
		}
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// New ENIs go to the subnets tagged for vpcni (subnetTags), the one with
// the most free addresses first, in the instance's AZ; the primary ENI's
// addresses stay in its own subnet. Leases name each address's subnet and
// router.
func TestSubnetChoice(t *testing.T) {
	both(t, func(t *testing.T, ep *ec2test.Endpoint, _ *ec2api.Server) {
		n := cidrN.Add(4)
		vpc := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", 160+n%90))
		sub := func(i int, bits int) netip.Prefix {
			return netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/%d", 160+n%90, i, bits))
		}
		primary, small, big, untagged := sub(1, 24), sub(2, 26), sub(3, 24), sub(4, 23)
		ids := ep.NewVPC(t, vpc, primary, small, big, untagged)
		for _, id := range []string{ids[1], ids[2]} {
			if _, err := ep.Client.CreateTags(ec2test.Ctx(t), &ec2.CreateTagsInput{Resources: []string{id},
				Tags: []types.Tag{{Key: aws.String("vpcni.io/pods"), Value: aws.String("yes")}}}); err != nil {
				t.Fatal(err)
			}
		}
		ep.Configure = func(c *vpcaws.Config) {
			c.SubnetTags = map[string]string{"vpcni.io/pods": "yes"}
			c.ENIMinLifetime.Duration = time.Hour
		}
		n0, inst := ep.NewInstance(t, ids[0], at(primary, 10))
		p := n0.Provider
		got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 12})
		if err != nil || len(got) != 12 {
			t.Fatalf("Assign(12) = %v, %v", got, err)
		}
		for _, l := range got {
			want, gw := primary, at(primary, 1)
			if l.Interface != inst.ENI {
				want, gw = big, at(big, 1)
			}
			if l.Prefix != want || l.Gateway != gw || !want.Contains(l.Address) {
				t.Errorf("lease %+v: want an address of %s via %s", l, want, gw)
			}
		}
		enis := ep.ENIs(t, inst.ID)
		if len(enis) != 2 || aws.ToString(enis[1].SubnetId) != ids[2] {
			t.Fatalf("the new ENI is in %s, want the tagged subnet with the most free addresses %s (%s)", aws.ToString(enis[len(enis)-1].SubnetId), ids[2], big)
		}
	})
}
