package neutron

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// TestSubnetDiscovery: one config without subnetID serves two nodes whose
// VM ports sit in different subnets: each node's pod addresses come from
// its own port's subnet, with that subnet's prefix and gateway, status and
// doctor say the subnet was discovered, and a restarted provider reads the
// same addresses back. By instance, the VM port is told from vpcni's own
// NICs of the same VM (which carry its device_id on another network).
func TestSubnetDiscovery(t *testing.T) {
	r := realNeutron{}
	cfg := openstack.Config{Endpoint: endpoint}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a config without subnetID: %v", err)
	}
	for _, c := range []struct{ cidr, node string }{
		{"10.201.240.0/24", "10.201.240.77"},
		{"10.201.241.0/28", "10.201.241.7"},
	} {
		nodeIP := netip.MustParseAddr(c.node)
		dropLeftovers(t, nodeIP)
		sn := r.NewSubnet(t, c.cidr, 12)
		n := r.NewNode(t, sn, nodeIP)
		p, err := openstack.New(ctx(t), cfg, nodeIP)
		if err != nil {
			t.Fatalf("node %s without subnetID: %v", nodeIP, err)
		}
		if p.PortID() != n.PortID {
			t.Fatalf("node %s: found VM port %s, want %s", nodeIP, p.PortID(), n.PortID)
		}
		info := p.Info().Subnet
		if !strings.Contains(info, sn.ID) || !strings.Contains(info, "discovered") || !strings.Contains(info, sn.CIDR.String()) {
			t.Errorf("node %s: Info().Subnet = %q, want subnet %s (%s) said discovered", nodeIP, info, sn.ID, sn.CIDR)
		}
		t.Logf("vpcni-test: node %s: %s", nodeIP, info)
		got, err := p.Assign(ctx(t), provider.AssignRequest{Count: 3})
		if err != nil || len(got) != 3 {
			t.Fatalf("node %s: Assign(3) = %v, %v", nodeIP, got, err)
		}
		checkOnSubnet(t, got, sn, n.PortID)
		for _, a := range provider.Addresses(got) {
			if !onPort(t, n.PortID, sn.ID, a) {
				t.Errorf("node %s: %s is not a fixed IP of VM port %s on subnet %s", nodeIP, a, n.PortID, sn.ID)
			}
		}
		again, err := openstack.New(ctx(t), cfg, nodeIP)
		if err != nil {
			t.Fatal(err)
		}
		held, err := again.Held(ctx(t))
		if err != nil || len(held) != 3 {
			t.Fatalf("node %s after restart: Held = %v, %v; want the 3 assigned", nodeIP, held, err)
		}
		checkOnSubnet(t, held, sn, n.PortID)
		steps := openstack.Diagnose(ctx(t), cfg, provider.DoctorNode{IP: nodeIP, ConfigFile: "vpcnid.yaml"})
		var names []string
		for _, s := range steps {
			names = append(names, s.Name)
			if s.Err != nil {
				t.Errorf("node %s: doctor step %s failed: %v", nodeIP, s.Name, s.Err)
			}
			if s.Name == "subnet" && (!strings.Contains(s.Detail, "discovered") || !strings.Contains(s.Detail, sn.ID)) {
				t.Errorf("node %s: doctor's subnet step says %q, want subnet %s discovered", nodeIP, s.Detail, sn.ID)
			}
		}
		if len(names) < 3 || names[1] != "port" || names[2] != "subnet" {
			t.Errorf("node %s: doctor steps %v, want login, port, subnet, …", nodeIP, names)
		}
		if err := again.Release(ctx(t), provider.Addresses(held)); err != nil {
			t.Fatal(err)
		}
	}

	// By instance: the VM's port and a port named as vpcni's secondary NIC
	// of the same VM on another network; the VM port's subnet is used.
	const instance = "6d1c3f5e-28a0-4c1e-9d3b-000000000028"
	if pages, err := ports.List(nc, ports.ListOpts{DeviceID: instance}).AllPages(ctx(t)); err == nil {
		old, _ := ports.ExtractPorts(pages) // a crashed earlier run's
		for _, p := range old {
			_ = ports.Delete(ctx(t), nc, p.ID).ExtractErr()
		}
	}
	vm := r.NewSubnet(t, "10.201.242.0/24", 50)
	other := r.NewSubnet(t, "10.201.243.0/24", 50)
	vmPort := devicePort(t, vm, "vm-by-instance", instance)
	devicePort(t, other, "vpcni-secondary-"+instance, instance)
	icfg := openstack.Config{Endpoint: endpoint, PortLookup: "instance", InstanceID: instance}
	icfg.Defaults()
	if err := icfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := openstack.New(ctx(t), icfg, netip.Addr{})
	if err != nil {
		t.Fatalf("by instance without subnetID: %v", err)
	}
	if p.PortID() != vmPort || !strings.Contains(p.Info().Subnet, vm.ID) {
		t.Fatalf("by instance: port %s, %q; want port %s on subnet %s", p.PortID(), p.Info().Subnet, vmPort, vm.ID)
	}
	got, err := p.Assign(ctx(t), provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("by instance: Assign(1) = %v, %v", got, err)
	}
	checkOnSubnet(t, got, vm, vmPort)
	if err := p.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
}

// TestSubnetsFirstOnVMNetwork: with subnets listed that do not include
// the VM port's own, the first listed on the VM port's network serves the
// VM port's fixed IPs (a second subnet of the same network), and a listed
// subnet of another network does not.
func TestSubnetsFirstOnVMNetwork(t *testing.T) {
	r := realNeutron{}
	nodeIP := netip.MustParseAddr("10.201.244.19")
	dropLeftovers(t, nodeIP)
	own := r.NewSubnet(t, "10.201.244.0/24", 50)
	elsewhere := r.NewSubnet(t, "10.201.245.0/24", 50)
	gw := "10.201.246.1"
	sn, err := subnets.Create(ctx(t), nc, subnets.CreateOpts{NetworkID: network(t, own.ID), IPVersion: 4, CIDR: "10.201.246.0/24", GatewayIP: &gw,
		AllocationPools: []subnets.AllocationPool{{Start: "10.201.246.2", End: "10.201.246.40"}}}).Extract()
	if err != nil {
		t.Fatalf("a second subnet on the VM port's network: %v", err)
	}
	second := providertest.Subnet{ID: sn.ID, CIDR: netip.MustParsePrefix("10.201.246.0/24"), Gateway: netip.MustParseAddr(gw)}
	n := r.NewNode(t, own, nodeIP)
	cfg := openstack.Config{Endpoint: endpoint, Subnets: []string{elsewhere.ID, second.ID}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := openstack.New(ctx(t), cfg, nodeIP)
	if err != nil {
		t.Fatalf("subnets listed without the VM port's own: %v", err)
	}
	if info := p.Info().Subnet; !strings.Contains(info, second.ID) || !strings.Contains(info, "first on the VM port's network") {
		t.Errorf("Info().Subnet = %q, want %s, the first listed on the VM port's network", info, second.ID)
	}
	got, err := p.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) = %v, %v", got, err)
	}
	checkOnSubnet(t, got, second, n.PortID)
	for _, a := range provider.Addresses(got) {
		if !onPort(t, n.PortID, second.ID, a) {
			t.Errorf("%s is not a fixed IP of VM port %s on subnet %s", a, n.PortID, second.ID)
		}
	}
	if err := p.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
}

// checkOnSubnet: every lease carries the subnet's prefix and gateway and
// names the VM port.
func checkOnSubnet(t *testing.T, ls []alloc.Lease, sn providertest.Subnet, port string) {
	t.Helper()
	for _, l := range ls {
		if !sn.CIDR.Contains(l.Address) || l.Prefix != sn.CIDR || l.Gateway != sn.Gateway || l.Interface != port {
			t.Errorf("lease %+v: want an address of %s with prefix %s, gateway %s on port %s", l, sn.ID, sn.CIDR, sn.Gateway, port)
		}
	}
}

// onPort says whether the port holds a on the subnet.
func onPort(t *testing.T, port, subnet string, a netip.Addr) bool {
	p, err := ports.Get(ctx(t), nc, port).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range p.FixedIPs {
		if f.SubnetID == subnet && f.IPAddress == a.String() {
			return true
		}
	}
	return false
}

// dropLeftovers deletes this test's VM ports with ip that a crashed
// earlier run left (the lookup by IP spans every network).
func dropLeftovers(t *testing.T, ip netip.Addr) {
	pages, err := ports.List(nc, ports.ListOpts{Name: "vm-" + ip.String()}).AllPages(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	old, _ := ports.ExtractPorts(pages)
	for _, p := range old {
		_ = ports.Delete(ctx(t), nc, p.ID).ExtractErr()
	}
}

// devicePort makes a port on sn with the given name and device_id.
func devicePort(t *testing.T, sn providertest.Subnet, name, device string) string {
	p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: network(t, sn.ID), Name: name, DeviceID: device,
		DeviceOwner: "compute:vpcni-test", FixedIPs: []ports.IP{{SubnetID: sn.ID}}}).Extract()
	if err != nil {
		t.Fatalf("create port %s: %v", name, err)
	}
	return p.ID
}

func network(t *testing.T, subnetID string) string {
	sn, err := subnets.Get(ctx(t), nc, subnetID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return sn.NetworkID
}
