package nova

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// TestPodNetworkNICs: two PodNetworks on one VM, as a project member,
// against the real Neutron and Nova. PodNetwork web (a network with two
// subnets and a security group of its own) gets its addresses on a NIC of
// its own on that network whose port carries exactly that group; when the
// first subnet is full its next NIC goes on the second. PodNetwork db (no
// groups) gets a NIC of its own with the project's default group. Neither
// network's NICs are the node's default provider's, nor each other's; a
// restarted provider reads its NICs back; releasing gives every NIC back.
// Specs that cannot be served are refused with the reason.
func TestPodNetworkNICs(t *testing.T) {
	ep := endpoint()
	own := ep.NewSubnet(t, "10.242.20.0/24", 50)
	web1 := ep.NewSubnet(t, "10.242.21.0/28", 4) // a NIC's own + 3 pods
	webNet := networkOf(t, web1.ID)
	web2 := ep.AddSubnet(t, webNet, "10.242.22.0/28", 3) // a NIC's own + 2 pods
	db := ep.NewSubnet(t, "10.242.23.0/24", 20)
	sg, err := groups.Create(ctx(t), memberNC, groups.CreateOpts{Name: fmt.Sprintf("vpcni-test-web-%d", os.Getpid())}).Extract()
	if err != nil {
		t.Fatalf("create security group: %v", err)
	}
	t.Cleanup(func() { _ = groups.Delete(ctx(t), memberNC, sg.ID).ExtractErr() })

	nodeIP := netip.MustParseAddr("10.242.20.10")
	vm, err := ports.Create(ctx(t), memberNC, ports.CreateOpts{NetworkID: networkOf(t, own.ID), Name: "vm-" + nodeIP.String(),
		FixedIPs: []ports.IP{{SubnetID: own.ID, IPAddress: nodeIP.String()}}}).Extract()
	if err != nil {
		t.Fatalf("create VM port: %v", err)
	}
	server := newServer(t, vm.ID)
	cfg := openstack.Config{MaxAddresses: 4, SecondaryNICs: 1}
	memberAuth(&cfg)
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	spec := func(network string, subnetIDs []string, groups []string) json.RawMessage {
		b, _ := json.Marshal(openstack.NetworkSpec{NetworkID: network, SubnetIDs: subnetIDs, SecurityGroups: groups})
		return b
	}
	webSpec := spec(webNet, []string{web1.ID, web2.ID}, []string{sg.ID})
	web, err := openstack.NewNetwork(ctx(t), cfg, nodeIP, "web", webSpec)
	if err != nil {
		t.Fatalf("PodNetwork web: %v", err)
	}
	t.Logf("vpcni-test: web: %s; capacity %d (%s)", web.Info().Subnet, web.Info().Capacity, web.Info().CapacityReason)
	if s := web.Info().Subnet; !strings.Contains(s, webNet) || !strings.Contains(s, sg.ID) {
		t.Errorf("web's Info().Subnet = %q: want its network and security group", s)
	}

	// The first NIC goes on web1 (most free: 4), its own address and 3
	// pods fill it; the next NIC on web2 (3 free): its own and 2 pods.
	// Then both are full.
	got, err := web.Assign(ctx(t), provider.AssignRequest{Count: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("web: Assign(5) = %v, %v", got, err)
	}
	by := bySubnet(t, got, web1, web2)
	if len(by[web1.ID]) != 3 || len(by[web2.ID]) != 2 {
		t.Fatalf("web's addresses by subnet %v: want 3 on a NIC on web1 (most free, then full) and 2 on a NIC on web2", by)
	}
	if more, err := web.Assign(ctx(t), provider.AssignRequest{Count: 1}); len(more) != 0 || !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("web with both subnets full: Assign(1) = %v, %v; want ErrExhausted", more, err)
	} else {
		t.Logf("vpcni-test: web full: %v", err)
	}
	checkAttached(t, server, got)
	webPorts := nicPorts(t, got)
	if len(webPorts) != 2 {
		t.Fatalf("web's addresses are on ports %v, want two NICs", webPorts)
	}
	for _, id := range webPorts {
		port, err := ports.Get(ctx(t), memberNC, id).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(port.SecurityGroups, []string{sg.ID}) || port.NetworkID != webNet {
			t.Errorf("web's NIC port %s: network %s, security groups %v; want %s and exactly [%s]", id, port.NetworkID, port.SecurityGroups, webNet, sg.ID)
		}
		if inst, ok := openstack.NICOf(port.Name); !ok || inst != server {
			t.Errorf("web's NIC port %s is named %q: NICOf = %q, %v; want this VM's NIC", id, port.Name, inst, ok)
		}
		if !slices.Contains(port.Tags, openstack.NICTag) {
			t.Errorf("web's NIC port %s has tags %v, want %s (the leak audit finds NICs by it)", id, port.Tags, openstack.NICTag)
		}
		if !strings.Contains(port.Description, "pod network web") {
			t.Errorf("web's NIC port %s: description %q does not name the PodNetwork", id, port.Description)
		}
		t.Logf("vpcni-test: web NIC %s: %s, groups %v", id, port.Description, port.SecurityGroups)
	}

	dbNet, err := openstack.NewNetwork(ctx(t), cfg, nodeIP, "db", spec(networkOf(t, db.ID), []string{db.ID}, nil))
	if err != nil {
		t.Fatalf("PodNetwork db: %v", err)
	}
	onDB, err := dbNet.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil || len(onDB) != 2 {
		t.Fatalf("db: Assign(2) = %v, %v", onDB, err)
	}
	bySubnet(t, onDB, db)
	dbPorts := nicPorts(t, onDB)
	if len(dbPorts) != 1 || slices.Contains(webPorts, dbPorts[0]) {
		t.Fatalf("db's addresses on ports %v: want one NIC of its own (web's: %v)", dbPorts, webPorts)
	}
	if port, err := ports.Get(ctx(t), memberNC, dbPorts[0]).Extract(); err != nil || slices.Contains(port.SecurityGroups, sg.ID) || len(port.SecurityGroups) != 1 {
		t.Errorf("db's NIC port: %+v, %v; want the project's default group only", port, err)
	}

	// Each provider sees its own NICs only: the node's default provider
	// (secondary NICs on) and the other network see none of them.
	def, err := openstack.New(ctx(t), cfg, nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := def.Held(ctx(t)); err != nil || len(held) != 0 {
		t.Errorf("the node's default provider holds %v, %v; want none of the PodNetworks' addresses", held, err)
	}
	if held, err := dbNet.Held(ctx(t)); err != nil || !sameLeases(held, onDB) {
		t.Errorf("db holds %v, %v; want %v", held, err, onDB)
	}
	again, err := openstack.NewNetwork(ctx(t), cfg, nodeIP, "web", webSpec)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := again.Held(ctx(t)); err != nil || !sameLeases(held, got) {
		t.Fatalf("web after a restart holds %+v, %v; want %+v", held, err, got)
	}

	// Release: a NIC left without pods goes at once.
	if err := again.Release(ctx(t), provider.Addresses(by2(got, web1))); err != nil {
		t.Fatal(err)
	}
	if att := (neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}).Attached(t, server); len(att) != 3 {
		t.Errorf("after releasing web1's pods the VM has NICs %v, want its own, web2's and db's", att)
	}
	if err := again.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	if err := dbNet.Release(ctx(t), provider.Addresses(onDB)); err != nil {
		t.Fatal(err)
	}
	if att := (neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}).Attached(t, server); len(att) != 1 {
		t.Fatalf("after releasing everything the VM has NICs %v, want only its own", att)
	}

	// Specs that cannot be served, refused with the reason.
	for _, bad := range []struct {
		name string
		spec json.RawMessage
		want string
	}{
		{"subnet-elsewhere", spec(webNet, []string{db.ID}, nil), "not on its networkID"},
		{"no-such-group", spec(webNet, []string{web1.ID}, []string{"00000000-0000-4000-8000-000000000000"}), "security group"},
		{"unknown-field", json.RawMessage(`{"networkID":"x","subnetIDs":["y"],"securityGroup":["z"]}`), "unknown field"},
		{"port-per-pod", json.RawMessage(`{"networkID":"x","subnetIDs":["y"],"portPerPod":true}`), "portPerPod"},
	} {
		_, err := openstack.NewNetwork(ctx(t), cfg, nodeIP, bad.name, bad.spec)
		if err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), bad.name) {
			t.Errorf("PodNetwork %s: %v; want an error naming it and saying %q", bad.name, err, bad.want)
			continue
		}
		t.Logf("vpcni-test: PodNetwork %s refused: %v", bad.name, err)
	}
}

// nicPorts lists the ports the leases are on, each once.
func nicPorts(t *testing.T, ls []alloc.Lease) []string {
	t.Helper()
	var out []string
	for _, l := range ls {
		if l.NIC == nil {
			t.Errorf("lease %+v is not on a NIC", l)
		}
		if !slices.Contains(out, l.Interface) {
			out = append(out, l.Interface)
		}
	}
	return out
}

// by2 are the leases on one subnet.
func by2(ls []alloc.Lease, s providertest.Subnet) []alloc.Lease {
	return slices.DeleteFunc(slices.Clone(ls), func(l alloc.Lease) bool { return !s.CIDR.Contains(l.Address) })
}
