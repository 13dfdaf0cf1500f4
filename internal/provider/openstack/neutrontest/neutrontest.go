// Package neutrontest runs the provider contract against any Neutron API —
// the real neutron-server in tests, the lab's endpoint — through the same
// calls, so both are held to one standard.
package neutrontest

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// Endpoint is a Neutron API under test — the real neutron-server or the
// lab's — as the provider contract sees it; the provider runs in Mode
// (default fixed-ips).
type Endpoint struct {
	NC   *gophercloud.ServiceClient
	URL  string // noauth endpoint the providers use, e.g. http://127.0.0.1:9696/
	Mode string
	// Nova, if set, is the endpoint's compute side (NewNICNode,
	// RunOSInterface).
	Nova *Nova
	// Configure, if set, adjusts each provider's config (Keystone
	// credentials instead of URL).
	Configure func(*openstack.Config)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

var seq atomic.Int64

// NewSubnet implements providertest.Endpoint.
func (e Endpoint) NewSubnet(t *testing.T, cidr string, pool int) providertest.Subnet {
	t.Helper()
	name := fmt.Sprintf("vpcni-test-%d-%d", os.Getpid(), seq.Add(1))
	n, err := networks.Create(ctx(t), e.NC, networks.CreateOpts{Name: name}).Extract()
	if err != nil {
		t.Fatalf("create network: %v", err)
	}
	t.Cleanup(func() { e.DeleteNetwork(n.ID) })
	return e.AddSubnet(t, n.ID, cidr, pool)
}

// AddSubnet makes a subnet on a network: the gateway its first address, an
// allocation pool of pool addresses after it. It goes with the network.
// An IPv6 one has both its modes unset: it takes named addresses.
func (e Endpoint) AddSubnet(t *testing.T, network, cidr string, pool int) providertest.Subnet {
	t.Helper()
	prefix := netip.MustParsePrefix(cidr)
	gw := prefix.Addr().Next()
	last := gw
	for range pool {
		last = last.Next()
	}
	gws := gw.String()
	version := gophercloud.IPv4
	if prefix.Addr().Is6() {
		version = gophercloud.IPv6
	}
	sn, err := subnets.Create(ctx(t), e.NC, subnets.CreateOpts{
		NetworkID: network, Name: fmt.Sprintf("vpcni-test-%d-%d", os.Getpid(), seq.Add(1)), IPVersion: version, CIDR: cidr, GatewayIP: &gws,
		AllocationPools: []subnets.AllocationPool{{Start: gw.Next().String(), End: last.String()}},
	}).Extract()
	if err != nil {
		t.Fatalf("create subnet %s: %v", cidr, err)
	}
	return providertest.Subnet{ID: sn.ID, CIDR: prefix, Gateway: gw}
}

// DeleteNetwork removes a network with its ports.
func (e Endpoint) DeleteNetwork(id string) {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if pages, err := ports.List(e.NC, ports.ListOpts{NetworkID: id}).AllPages(c); err == nil {
		all, _ := ports.ExtractPorts(pages)
		for _, p := range all {
			_ = ports.Delete(c, e.NC, p.ID).ExtractErr()
		}
	}
	_ = networks.Delete(c, e.NC, id).ExtractErr()
}

// NewNode implements providertest.Endpoint.
func (e Endpoint) NewNode(t *testing.T, sn providertest.Subnet, nodeIP netip.Addr) providertest.Node {
	t.Helper()
	port, err := ports.Create(ctx(t), e.NC, ports.CreateOpts{
		NetworkID: e.networkOf(t, sn.ID), Name: "vm-" + nodeIP.String(), DeviceOwner: "compute:vpcni-test",
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: nodeIP.String()}},
	}).Extract()
	if err != nil {
		t.Fatalf("create VM port: %v", err)
	}
	open := func(t *testing.T) provider.Provider {
		cfg := openstack.Config{Endpoint: e.URL, SubnetID: sn.ID, Mode: e.Mode}
		if e.Configure != nil {
			e.Configure(&cfg)
		}
		cfg.Defaults()
		p, err := openstack.New(ctx(t), cfg, nodeIP)
		if err != nil {
			t.Fatalf("openstack provider: %v", err)
		}
		if p.PortID() != port.ID {
			t.Fatalf("provider found port %s, want %s", p.PortID(), port.ID)
		}
		return p
	}
	n := e.node(port.ID)
	n.Provider, n.Reopen = open(t), open
	return n
}

// NewSubnet6 implements providertest.DualStack.
func (e Endpoint) NewSubnet6(t *testing.T, sn providertest.Subnet, cidr string, pool int) providertest.Subnet {
	t.Helper()
	return e.AddSubnet(t, e.networkOf(t, sn.ID), cidr, pool)
}

// NewDualNode implements providertest.DualStack: the provider is
// configured with both subnets (subnetID, subnetIDv6).
func (e Endpoint) NewDualNode(t *testing.T, sn, sn6 providertest.Subnet, nodeIP, nodeIP6 netip.Addr) providertest.Node {
	t.Helper()
	port, err := ports.Create(ctx(t), e.NC, ports.CreateOpts{
		NetworkID: e.networkOf(t, sn.ID), Name: "vm-" + nodeIP.String(), DeviceOwner: "compute:vpcni-test",
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: nodeIP.String()}, {SubnetID: sn6.ID, IPAddress: nodeIP6.String()}},
	}).Extract()
	if err != nil {
		t.Fatalf("create dual-stack VM port: %v", err)
	}
	open := func(t *testing.T) provider.Provider {
		cfg := openstack.Config{Endpoint: e.URL, SubnetID: sn.ID, SubnetIDv6: sn6.ID, Mode: e.Mode}
		if e.Configure != nil {
			e.Configure(&cfg)
		}
		cfg.Defaults()
		p, err := openstack.New(ctx(t), cfg, nodeIP)
		if err != nil {
			t.Fatalf("openstack provider: %v", err)
		}
		return p
	}
	n := e.node(port.ID)
	n.AddByHand = func(t *testing.T, ip netip.Addr) {
		id := sn.ID
		if ip.Is6() {
			id = sn6.ID
		}
		e.AddByHand(t, port.ID, id, ip)
	}
	n.Provider, n.Reopen = open(t), open
	return n
}

// node is a VM port as the contract reads it from the endpoint.
func (e Endpoint) node(portID string) providertest.Node {
	subnetOf := func(t *testing.T) string {
		p, err := ports.Get(ctx(t), e.NC, portID).Extract()
		if err != nil || len(p.FixedIPs) == 0 {
			t.Fatalf("read port: %v", err)
		}
		return p.FixedIPs[0].SubnetID
	}
	return providertest.Node{
		PortID: portID,
		PortIPs: func(t *testing.T) []netip.Addr {
			p, err := ports.Get(ctx(t), e.NC, portID).Extract()
			if err != nil {
				t.Fatalf("read port: %v", err)
			}
			var out []netip.Addr
			for _, f := range p.FixedIPs {
				out = append(out, netip.MustParseAddr(f.IPAddress))
			}
			for _, ap := range p.AllowedAddressPairs {
				out = append(out, netip.MustParseAddr(ap.IPAddress))
			}
			return out
		},
		AddByHand: func(t *testing.T, ip netip.Addr) { e.AddByHand(t, portID, subnetOf(t), ip) },
	}
}

func (e Endpoint) networkOf(t *testing.T, subnetID string) string {
	sn, err := subnets.Get(ctx(t), e.NC, subnetID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return sn.NetworkID
}

// AddByHand is a well-behaved outside writer: read, modify, If-Match, retry.
func (e Endpoint) AddByHand(t *testing.T, portID, subnetID string, ip netip.Addr) {
	for attempt := 0; attempt < 30; attempt++ {
		p, err := ports.Get(ctx(t), e.NC, portID).Extract()
		if err != nil {
			t.Errorf("read port: %v", err)
			return
		}
		fixed := slices.Clone(p.FixedIPs)
		fixed = append(fixed, ports.IP{SubnetID: subnetID, IPAddress: ip.String()})
		rev := p.RevisionNumber
		_, err = ports.Update(ctx(t), e.NC, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if err == nil {
			return
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Errorf("add %s by hand: %v", ip, err)
			return
		}
		time.Sleep(time.Duration(50+attempt*20) * time.Millisecond)
	}
	t.Errorf("add %s by hand: still conflicting after 30 attempts", ip)
}
