package nova

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// TestSecondaryNICSubnets: with subnets listed (and no subnetID), the VM
// port keeps serving from its own subnet, and secondary NICs go on the
// listed subnets, the one with the most free addresses first: the first
// NIC on s1 (6 free), and when s1 is full the rest on a second NIC on s2,
// each NIC's pod addresses with its own subnet's prefix and gateway. When
// every listed subnet is full the ADD says so; a restarted provider reads
// every NIC back with its subnet; Release gives the NICs back.
func TestSecondaryNICSubnets(t *testing.T) {
	ep := endpoint()
	own := ep.NewSubnet(t, "10.242.1.0/24", 50)
	s1 := ep.NewSubnet(t, "10.242.2.0/28", 6)
	s2 := ep.NewSubnet(t, "10.242.3.0/28", 5)
	nodeIP := netip.MustParseAddr("10.242.1.10")
	vm, err := ports.Create(ctx(t), memberNC, ports.CreateOpts{NetworkID: networkOf(t, own.ID), Name: "vm-" + nodeIP.String(),
		FixedIPs: []ports.IP{{SubnetID: own.ID, IPAddress: nodeIP.String()}}}).Extract()
	if err != nil {
		t.Fatalf("create VM port: %v", err)
	}
	server := newServer(t, vm.ID)
	cfg := openstack.Config{Subnets: []string{s2.ID, s1.ID}, MaxAddresses: 8, SecondaryNICs: 2}
	memberAuth(&cfg)
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := openstack.New(ctx(t), cfg, nodeIP)
	if err != nil {
		t.Fatalf("provider with subnets listed: %v", err)
	}
	info := p.Info().Subnet
	if !strings.Contains(info, own.ID) || !strings.Contains(info, s1.ID) || !strings.Contains(info, s2.ID) {
		t.Errorf("Info().Subnet = %q, want the VM port's subnet %s and the listed %s, %s", info, own.ID, s1.ID, s2.ID)
	}
	t.Logf("vpcni-test: %s", info)

	onVM, err := p.Assign(ctx(t), provider.AssignRequest{Count: 8})
	if err != nil || len(onVM) != 8 {
		t.Fatalf("Assign(8) = %v, %v", onVM, err)
	}
	for _, l := range onVM {
		if l.NIC != nil || l.Prefix != own.CIDR || l.Gateway != own.Gateway {
			t.Errorf("lease %+v: want it on the VM port in %s", l, own.CIDR)
		}
	}
	onNICs, err := p.Assign(ctx(t), provider.AssignRequest{Count: 8})
	if err != nil || len(onNICs) != 8 {
		t.Fatalf("Assign(8) past the VM port = %v, %v", onNICs, err)
	}
	by := bySubnet(t, onNICs, s1, s2)
	if len(by[s1.ID]) != 5 || len(by[s2.ID]) != 3 {
		t.Fatalf("pod addresses by subnet %v: want 5 on s1 (most free first, then full) and 3 on s2", by)
	}
	checkAttached(t, server, onNICs)

	last, err := p.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if len(last) != 1 || !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("Assign(2) with one address left in s2 = %v, %v; want 1 and ErrExhausted", last, err)
	}
	t.Logf("vpcni-test: every listed subnet full: %v", err)
	if by := bySubnet(t, last, s1, s2); len(by[s2.ID]) != 1 {
		t.Fatalf("the last address %v: want it on s2", last)
	}
	all := slices.Concat(onVM, onNICs, last)

	again, err := openstack.New(ctx(t), cfg, nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	held, err := again.Held(ctx(t))
	if err != nil || !sameLeases(held, all) {
		t.Fatalf("after restart Held = %+v, %v; want %+v", held, err, all)
	}
	if err := again.Release(ctx(t), provider.Addresses(all)); err != nil {
		t.Fatal(err)
	}
	if att := (neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}).Attached(t, server); len(att) != 1 {
		t.Fatalf("after releasing everything the VM has NICs %v, want only its own", att)
	}
}

// TestSecondaryNICSubnetTags: subnetTags selects the subnets with the
// tag (Neutron's tags filter), the VM port's own among them: the VM port
// serves from it, and the NIC goes on the tagged subnet with the most free
// addresses — the VM port's own (47 free) before the other tagged one (20)
// — never on an untagged one.
func TestSecondaryNICSubnetTags(t *testing.T) {
	ep := endpoint()
	tag := fmt.Sprintf("vpcni-pods-%d", os.Getpid())
	own := ep.NewSubnet(t, "10.242.4.0/24", 50)
	other := ep.NewSubnet(t, "10.242.5.0/24", 20)
	untagged := ep.NewSubnet(t, "10.242.6.0/24", 100)
	for _, sn := range []providertest.Subnet{own, other} {
		if err := attributestags.Add(ctx(t), memberNC, "subnets", sn.ID, tag).ExtractErr(); err != nil {
			t.Fatalf("tag subnet %s: %v", sn.ID, err)
		}
	}
	nodeIP := netip.MustParseAddr("10.242.4.10")
	vm, err := ports.Create(ctx(t), memberNC, ports.CreateOpts{NetworkID: networkOf(t, own.ID), Name: "vm-" + nodeIP.String(),
		FixedIPs: []ports.IP{{SubnetID: own.ID, IPAddress: nodeIP.String()}}}).Extract()
	if err != nil {
		t.Fatalf("create VM port: %v", err)
	}
	server := newServer(t, vm.ID)
	cfg := openstack.Config{SubnetTags: []string{tag}, MaxAddresses: 2, SecondaryNICs: 1}
	memberAuth(&cfg)
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := openstack.New(ctx(t), cfg, nodeIP)
	if err != nil {
		t.Fatalf("provider with subnetTags: %v", err)
	}
	info := p.Info().Subnet
	if !strings.Contains(info, own.ID) || !strings.Contains(info, "the VM port's own") || !strings.Contains(info, other.ID) || strings.Contains(info, untagged.ID) {
		t.Errorf("Info().Subnet = %q, want %s (the VM port's own, tagged) and %s, not %s", info, own.ID, other.ID, untagged.ID)
	}
	t.Logf("vpcni-test: %s", info)
	got, err := p.Assign(ctx(t), provider.AssignRequest{Count: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("Assign(3) = %v, %v", got, err)
	}
	var nic []alloc.Lease
	for _, l := range got {
		if l.Prefix != own.CIDR || l.Gateway != own.Gateway {
			t.Errorf("lease %+v: want it in %s, the tagged subnet with most free addresses", l, own.CIDR)
		}
		if l.NIC != nil {
			nic = append(nic, l)
		}
	}
	if len(nic) != 1 {
		t.Fatalf("leases %+v: want 2 on the VM port and 1 on a secondary NIC", got)
	}
	checkAttached(t, server, nic)
	if err := p.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	if att := (neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}).Attached(t, server); len(att) != 1 {
		t.Fatalf("after releasing everything the VM has NICs %v, want only its own", att)
	}
}

// bySubnet groups NIC leases by subnet, checking each carries its
// subnet's prefix and gateway.
func bySubnet(t *testing.T, ls []alloc.Lease, sns ...providertest.Subnet) map[string][]netip.Addr {
	t.Helper()
	out := map[string][]netip.Addr{}
	for _, l := range ls {
		i := slices.IndexFunc(sns, func(s providertest.Subnet) bool { return s.CIDR.Contains(l.Address) })
		switch {
		case i < 0 || l.NIC == nil:
			t.Errorf("lease %+v is on no listed subnet's NIC", l)
		case l.Prefix != sns[i].CIDR || l.Gateway != sns[i].Gateway || !sns[i].CIDR.Contains(l.NIC.Address):
			t.Errorf("lease %+v: want prefix %s, gateway %s and a NIC address of that subnet", l, sns[i].CIDR, sns[i].Gateway)
		default:
			out[sns[i].ID] = append(out[sns[i].ID], l.Address)
		}
	}
	return out
}

// checkAttached: each lease's port is a NIC Nova lists on the server with
// the lease's MAC and address.
func checkAttached(t *testing.T, server string, ls []alloc.Lease) {
	t.Helper()
	att := neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}.Attached(t, server)
	for _, l := range ls {
		nic, ok := att[l.Interface]
		if !ok || !strings.EqualFold(nic.MAC, l.NIC.MAC) || !slices.Contains(nic.Addrs, l.Address) {
			t.Errorf("lease %s on port %s (MAC %s): Nova lists %v", l.Address, l.Interface, l.NIC.MAC, att)
		}
	}
}

// sameLeases: the same addresses, each with the same prefix, gateway,
// port and NIC.
func sameLeases(a, b []alloc.Lease) bool {
	key := func(l alloc.Lease) string {
		s := l.Address.String() + " " + l.Prefix.String() + " " + l.Gateway.String() + " " + l.Interface
		if l.NIC != nil {
			s += " " + strings.ToLower(l.NIC.MAC) + " " + l.NIC.Address.String()
		}
		return s
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

func networkOf(t *testing.T, subnetID string) string {
	t.Helper()
	sn, err := subnets.Get(ctx(t), memberNC, subnetID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return sn.NetworkID
}
