package neutrontest

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/attachinterfaces"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// Nova is the compute side of an endpoint under test: the real Nova or the
// lab's os-interface stand-in.
type Nova struct {
	// CC is the test's own Nova client.
	CC *gophercloud.ServiceClient
	// URL is the noauth compute endpoint providers use ("" when Configure
	// gives them Keystone credentials).
	URL string
	// NewServer makes a server whose NIC is the port primary (the port's
	// device_id becomes the server's ID) and returns its ID.
	NewServer func(t *testing.T, primary string) string
}

// NewNICNode implements providertest.NICEndpoint.
func (e Endpoint) NewNICNode(t *testing.T, sn providertest.Subnet, nodeIP netip.Addr, opts providertest.NICOptions) providertest.Node {
	t.Helper()
	netID := e.networkOf(t, sn.ID)
	port, err := ports.Create(ctx(t), e.NC, ports.CreateOpts{
		NetworkID: netID, Name: "vm-" + nodeIP.String(),
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: nodeIP.String()}},
	}).Extract()
	if err != nil {
		t.Fatalf("create VM port: %v", err)
	}
	server := e.Nova.NewServer(t, port.ID)
	open := func(t *testing.T) provider.Provider {
		cfg := openstack.Config{Endpoint: e.URL, ComputeEndpoint: e.Nova.URL, SubnetID: sn.ID, Mode: opts.Mode,
			MaxNICs: opts.MaxNICs, MaxAddresses: opts.MaxAddresses, SecondaryNICs: opts.SecondaryNICs, InstanceID: opts.InstanceID}
		if e.Configure != nil {
			e.Configure(&cfg)
		}
		cfg.Defaults()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("provider config: %v", err)
		}
		p, err := openstack.New(ctx(t), cfg, nodeIP)
		if err != nil {
			t.Fatalf("openstack provider: %v", err)
		}
		return p
	}
	n := e.node(port.ID)
	n.Provider, n.Reopen = open(t), open
	n.Attached = func(t *testing.T) map[string]providertest.AttachedNIC { return e.Attached(t, server) }
	n.Unattached = func(t *testing.T) []string {
		pages, err := ports.List(e.NC, ports.ListOpts{NetworkID: netID}).AllPages(ctx(t))
		if err != nil {
			t.Fatalf("list ports: %v", err)
		}
		all, _ := ports.ExtractPorts(pages)
		var out []string
		for _, p := range all {
			if p.DeviceID == "" {
				out = append(out, p.ID+" "+p.Name)
			}
		}
		return out
	}
	return n
}

// Attached lists a server's NICs as Nova shows them.
func (e Endpoint) Attached(t *testing.T, server string) map[string]providertest.AttachedNIC {
	pages, err := attachinterfaces.List(e.Nova.CC, server).AllPages(ctx(t))
	if err != nil {
		t.Fatalf("list the NICs of server %s: %v", server, err)
	}
	ifs, err := attachinterfaces.ExtractInterfaces(pages)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]providertest.AttachedNIC{}
	for _, i := range ifs {
		nic := providertest.AttachedNIC{MAC: i.MACAddr}
		for _, f := range i.FixedIPs {
			nic.Addrs = append(nic.Addrs, netip.MustParseAddr(f.IPAddress))
		}
		out[i.PortID] = nic
	}
	return out
}

// RunOSInterface is the os-interface contract Nova and the lab's stand-in
// both pass: attach → the VM lists the port with its MAC and Neutron shows
// it claimed; attaching a port claimed by another server → 409 "still in
// use" (what Nova Zed answers a member); detach → 202 and, soon after,
// gone from the VM and free in Neutron; detaching it again is no error
// (202 on Nova Zed).
func (e Endpoint) RunOSInterface(t *testing.T, cidr string) {
	sn := e.NewSubnet(t, cidr, 100)
	netID := e.networkOf(t, sn.ID)
	mk := func(name string) *ports.Port {
		p, err := ports.Create(ctx(t), e.NC, ports.CreateOpts{NetworkID: netID, Name: name, FixedIPs: []ports.IP{{SubnetID: sn.ID}}}).Extract()
		if err != nil {
			t.Fatalf("create port %s: %v", name, err)
		}
		return p
	}
	s1, s2 := e.Nova.NewServer(t, mk("vm1").ID), e.Nova.NewServer(t, mk("vm2").ID)
	nic := mk("nic")
	start := time.Now()
	got, err := attachinterfaces.Create(ctx(t), e.Nova.CC, s1, attachinterfaces.CreateOpts{PortID: nic.ID}).Extract()
	if err != nil {
		t.Fatalf("attach %s to %s: %v", nic.ID, s1, err)
	}
	t.Logf("vpcni-test: os-interface attach took %s", time.Since(start).Round(time.Millisecond))
	if got.PortID != nic.ID || !strings.EqualFold(got.MACAddr, nic.MACAddress) {
		t.Errorf("attach answered %+v, want port %s with MAC %s", got, nic.ID, nic.MACAddress)
	}
	if a := e.Attached(t, s1); !strings.EqualFold(a[nic.ID].MAC, nic.MACAddress) || len(a) != 2 {
		t.Fatalf("server %s lists NICs %v, want its own and %s (%s)", s1, a, nic.ID, nic.MACAddress)
	}
	if p, err := ports.Get(ctx(t), e.NC, nic.ID).Extract(); err != nil || p.DeviceID != s1 {
		t.Fatalf("Neutron shows the attached port %+v, %v; want device_id %s", p, err, s1)
	}
	_, err = attachinterfaces.Create(ctx(t), e.Nova.CC, s2, attachinterfaces.CreateOpts{PortID: nic.ID}).Extract()
	if !gophercloud.ResponseCodeIs(err, http.StatusConflict) || !strings.Contains(fmt.Sprint(err), "still in use") {
		t.Fatalf("attach of a port claimed by %s to %s: %v; want 409 \"still in use\"", s1, s2, err)
	}
	t.Logf("vpcni-test: attach of a port bound elsewhere: %v", err)
	start = time.Now()
	if err := attachinterfaces.Delete(ctx(t), e.Nova.CC, s1, nic.ID).ExtractErr(); err != nil {
		t.Fatalf("detach: %v", err)
	}
	for {
		p, err := ports.Get(ctx(t), e.NC, nic.ID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if _, listed := e.Attached(t, s1)[nic.ID]; !listed && p.DeviceID == "" {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("a minute after the detach the port is %+v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("vpcni-test: os-interface detach until the port is free took %s", time.Since(start).Round(time.Millisecond))
	// Nova Zed answers 202 again (the detach is a no-op in the
	// background); 404 would do too: either way not a failure.
	err = attachinterfaces.Delete(ctx(t), e.Nova.CC, s1, nic.ID).ExtractErr()
	if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Fatalf("detaching a detached port: %v, want 202 or 404", err)
	}
}
