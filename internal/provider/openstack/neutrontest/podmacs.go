package neutrontest

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// RunPodMACs holds an endpoint to what a datapath with pods' own MACs
// (macvlan, bridge) needs of the provider: in address-pairs mode every
// pair of vpcni's carries its pod's MAC — also pairs made before the node
// switched modes, and back again — while a pair someone else made keeps
// its MAC; in fixed-ips mode the provider refuses to start while the VM
// port has port security, naming what works, and starts once it is off.
// The provider is built through its registration, as the agent builds it.
func RunPodMACs(t *testing.T, e Endpoint, cidr string) {
	reg, err := provider.Lookup("openstack")
	if err != nil {
		t.Fatal(err)
	}
	sn := e.NewSubnet(t, cidr, 100)
	nodeIP := sn.Gateway.Next().Next()
	node := e.NewNode(t, sn, nodeIP)
	open := func(mode string, podMACs bool) (provider.Provider, error) {
		cfg := &openstack.Config{Endpoint: e.URL, SubnetID: sn.ID, Mode: mode}
		cfg.Defaults()
		return reg.New(ctx(t), provider.Node{Name: "n", IP: nodeIP, PodMACs: podMACs, StateDir: t.TempDir()}, cfg)
	}
	pairsOf := func() (macs map[string]string, portMAC string) {
		p, err := ports.Get(ctx(t), e.NC, node.PortID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		macs = map[string]string{}
		for _, ap := range p.AllowedAddressPairs {
			macs[ap.IPAddress] = strings.ToLower(ap.MACAddress)
		}
		return macs, p.MACAddress
	}
	expect := func(when string, addrs []netip.Addr, own bool) {
		t.Helper()
		macs, portMAC := pairsOf()
		for _, a := range addrs {
			want := portMAC
			if own {
				want = alloc.AddressMAC(a)
			}
			if macs[a.String()] != want {
				t.Errorf("%s: pair of %s carries MAC %q, want %s (pairs %v)", when, a, macs[a.String()], want, macs)
			}
		}
	}

	// Two addresses taken by a node in a mode with the node's MAC.
	plain, err := open("address-pairs", false)
	if err != nil {
		t.Fatal(err)
	}
	before, err := plain.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	expect("node's MAC", provider.Addresses(before), false)
	foreign := sn.Gateway.Next().Next().Next().Next().Next() // a VIP someone allowed
	addPair(t, e, node.PortID, ports.AddressPair{IPAddress: foreign.String()})

	// The node switches to a mode with pods' own MACs: its pairs follow.
	own, err := open("address-pairs", true)
	if err != nil {
		t.Fatalf("address-pairs with pods' MACs: %v", err)
	}
	expect("after switching to pods' MACs", provider.Addresses(before), true)
	more, err := own.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	expect("new pairs", provider.Addresses(more), true)
	if held, err := own.Held(ctx(t)); err != nil || len(held) != 4 {
		t.Errorf("Held with pods' MACs: %v, %v; want the 4 addresses", held, err)
	}
	macs, portMAC := pairsOf()
	if macs[foreign.String()] != portMAC {
		t.Errorf("the foreign pair %s now carries %q: vpcni rewrote a pair it did not make", foreign, macs[foreign.String()])
	}
	// And back.
	if _, err := open("address-pairs", false); err != nil {
		t.Fatal(err)
	}
	expect("after switching back", append(provider.Addresses(before), provider.Addresses(more)...), false)
	if err := own.Release(ctx(t), append(provider.Addresses(before), provider.Addresses(more)...)); err != nil {
		t.Fatal(err)
	}
	if macs, _ := pairsOf(); len(macs) != 1 {
		t.Errorf("after Release the port has pairs %v, want only the foreign one", macs)
	}

	// fixed-ips: refused while port security is on, and says what works.
	_, err = open("fixed-ips", true)
	if err == nil || !strings.Contains(err.Error(), "port security") || !strings.Contains(err.Error(), "address-pairs") {
		t.Fatalf("fixed-ips with pods' MACs on a port with port security: %v; want a refusal naming port security and address-pairs", err)
	}
	t.Logf("vpcni-test: fixed-ips with pods' MACs says: %v", err)
	// Neutron turns port security off only on a port without pairs and
	// security groups.
	empty, noGroups, off := []ports.AddressPair{}, []string{}, false
	if _, err := ports.Update(ctx(t), e.NC, node.PortID, portsecurity.PortUpdateOptsExt{
		UpdateOptsBuilder: ports.UpdateOpts{AllowedAddressPairs: &empty, SecurityGroups: &noGroups}, PortSecurityEnabled: &off}).Extract(); err != nil {
		t.Fatal(err)
	}
	if _, err := open("fixed-ips", true); err != nil {
		t.Fatalf("fixed-ips with pods' MACs on a port without port security: %v", err)
	}
}

func addPair(t *testing.T, e Endpoint, portID string, ap ports.AddressPair) {
	t.Helper()
	p, err := ports.Get(ctx(t), e.NC, portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	list := append(p.AllowedAddressPairs, ap)
	rev := p.RevisionNumber
	if _, err := ports.Update(ctx(t), e.NC, portID, ports.UpdateOpts{AllowedAddressPairs: &list, RevisionNumber: &rev}).Extract(); err != nil {
		t.Fatal(err)
	}
}
