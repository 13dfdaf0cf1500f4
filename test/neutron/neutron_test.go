// Package neutron runs vpcni's OpenStack provider against a real
// neutron-server (Debian's package, MariaDB, noauth, loopback), started by
// scripts/neutron.sh when it is not up already and stopped again if this
// test started it.
package neutron

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
	"github.com/vpcni/vpcni/internal/testbed"
)

const endpoint = "http://127.0.0.1:19696/"

var nc *gophercloud.ServiceClient

func TestMain(m *testing.M) {
	testbed.RequireRoot("the real-Neutron tests")
	nc = openstack.NoAuthClient(endpoint, http.Client{Timeout: 30 * time.Second})
	os.Exit(testbed.WithNeutron(m.Run))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// realNeutron is the contract's endpoint on the real neutron-server.
type realNeutron struct{ mode string }

func (r realNeutron) ep() neutrontest.Endpoint {
	return neutrontest.Endpoint{NC: nc, URL: endpoint, Mode: r.mode}
}

// NewSubnet implements providertest.Endpoint.
func (r realNeutron) NewSubnet(t *testing.T, cidr string, pool int) providertest.Subnet {
	return r.ep().NewSubnet(t, cidr, pool)
}

// NewNode implements providertest.Endpoint.
func (r realNeutron) NewNode(t *testing.T, sn providertest.Subnet, nodeIP netip.Addr) providertest.Node {
	return r.ep().NewNode(t, sn, nodeIP)
}

// TestProviderContract runs the provider contract against the real server,
// in both address modes.
func TestProviderContract(t *testing.T) {
	for _, mode := range []string{"fixed-ips", "address-pairs"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			providertest.Run(t, realNeutron{mode: mode})
		})
	}
}

// NewSubnet6 implements providertest.DualStack.
func (r realNeutron) NewSubnet6(t *testing.T, sn providertest.Subnet, cidr string, pool int) providertest.Subnet {
	return r.ep().NewSubnet6(t, sn, cidr, pool)
}

// NewDualNode implements providertest.DualStack.
func (r realNeutron) NewDualNode(t *testing.T, sn, sn6 providertest.Subnet, nodeIP, nodeIP6 netip.Addr) providertest.Node {
	return r.ep().NewDualNode(t, sn, sn6, nodeIP, nodeIP6)
}

// TestProviderContractIPv6: the contract's IPv6 part on the real server,
// with an IPv6 subnet whose address modes are unset (it takes named
// addresses) beside the IPv4 one, in mode fixed-ips.
func TestProviderContractIPv6(t *testing.T) {
	t.Parallel() // beside the other IPv6 tests: subnets of their own
	providertest.RunIPv6(t, realNeutron{mode: "fixed-ips"})
}

// TestFloatingIPs: the floating IP contract (internal/lab/neutronapi runs
// the same against the lab's endpoint) on the real server: Neutron leaves
// a floating IP on a fixed IP taken off its port, so the provider keeps
// such an address until vpcni-controller's floating IP side detached it.
func TestFloatingIPs(t *testing.T) {
	t.Run("fixed-ips", func(t *testing.T) {
		neutrontest.RunFloatingIPs(t, realNeutron{}.ep(), "10.201.248.0/24", "198.51.100.0/24")
	})
	t.Run("address-pairs", func(t *testing.T) {
		neutrontest.RunFloatingIPsPairs(t, realNeutron{mode: "address-pairs"}.ep(), "10.201.247.0/24", "198.51.101.0/24")
	})
}

// TestPodMACs: with a datapath whose pods send from MACs of their own
// (macvlan, bridge), the real server keeps each pair's MAC as vpcni writes
// it, and fixed-ips mode is refused while port security is on.
func TestPodMACs(t *testing.T) {
	neutrontest.RunPodMACs(t, realNeutron{}.ep(), "10.201.249.0/24")
}

// TestAddressPairLimit: in address-pairs mode the provider stops at
// Neutron's 10 pairs per port, counting pairs others added, and says so.
func TestAddressPairLimit(t *testing.T) {
	r := realNeutron{mode: "address-pairs"}
	sn := r.NewSubnet(t, "10.201.250.0/24", 200)
	nodeIP := netip.MustParseAddr("10.201.250.10")
	n := r.NewNode(t, sn, nodeIP)
	// Someone else's two pairs (a VIP and a CIDR).
	p, err := ports.List(nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: nodeIP.String()}}}).AllPages(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	vm, _ := ports.ExtractPorts(p)
	pairs := []ports.AddressPair{{IPAddress: "10.201.250.240"}, {IPAddress: "192.168.7.0/24"}}
	rev := vm[0].RevisionNumber
	if _, err := ports.Update(ctx(t), nc, vm[0].ID, ports.UpdateOpts{AllowedAddressPairs: &pairs, RevisionNumber: &rev}).Extract(); err != nil {
		t.Fatal(err)
	}
	got, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 12})
	if len(got) != 8 || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "allowed address pairs") {
		t.Fatalf("Assign(12) with 2 foreign pairs: %d addresses, %v; want 8 and a clear pair-limit error", len(got), err)
	}
	t.Logf("vpcni-test: pair limit says: %v", err)
	if err := n.Provider.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	after, err := ports.Get(ctx(t), nc, vm[0].ID).Extract()
	if err != nil || len(after.AllowedAddressPairs) != 2 {
		t.Fatalf("after Release the VM port has pairs %v, want only the foreign two", after.AllowedAddressPairs)
	}
	res, err := ports.List(nc, ports.ListOpts{DeviceOwner: "network:vpcni", DeviceID: vm[0].ID}).AllPages(ctx(t))
	if err != nil {
		t.Fatalf("list reservation ports: %v", err)
	}
	if left, err := ports.ExtractPorts(res); err != nil || len(left) != 0 {
		t.Fatalf("%d reservation ports left after Release (%v)", len(left), err)
	}
}

// TestPortNotFound: a node IP no Neutron port has gives an error that says
// what to check.
func TestPortNotFound(t *testing.T) {
	sn := realNeutron{}.NewSubnet(t, "10.201.251.0/24", 50)
	cfg := openstack.Config{Endpoint: endpoint, SubnetID: sn.ID}
	cfg.Defaults()
	_, err := openstack.New(ctx(t), cfg, netip.MustParseAddr("10.201.251.99"))
	if err == nil || !strings.Contains(err.Error(), "no Neutron port") || !strings.Contains(err.Error(), "10.201.251.99") {
		t.Fatalf("node IP without a port: %v", err)
	}
	cfg.SubnetID = "00000000-0000-0000-0000-000000000000"
	if _, err := openstack.New(ctx(t), cfg, netip.MustParseAddr("10.201.251.99")); err == nil || !strings.Contains(err.Error(), "subnet") {
		t.Fatalf("unknown subnet: %v", err)
	}
}
