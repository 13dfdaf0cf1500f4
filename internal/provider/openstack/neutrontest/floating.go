package neutrontest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// externalNet asks for an external network (router:external, which
// gophercloud's CreateOpts does not carry).
type externalNet struct{ name string }

func (o externalNet) ToNetworkCreateMap() (map[string]any, error) {
	return map[string]any{"network": map[string]any{"name": o.name, "router:external": true}}, nil
}

// RunFloatingIPs is the floating IP contract vpcni-controller and the
// agent rely on, run against the real neutron-server and the lab's
// endpoint: a router between a tenant subnet (cidr) and an external one
// (extCIDR), a VM port with a node address and pod addresses the openstack
// provider put there, and the floating IPs door's calls on them (FloatingIPs of
// internal/provider/openstack/cluster).
//
//   - Ensure (auto) creates a floating IP already associated with the pod's
//     fixed IP and marked; again, it changes nothing.
//   - Neutron does NOT detach a floating IP when its fixed IP leaves the
//     port (only when the port is deleted): shown on an address taken off
//     by hand.
//   - So the provider refuses to take an address with a floating IP off
//     the port, says why, and does once the floating IP is detached.
//   - Detach with policy release deletes it; with retain keeps it,
//     unassociated and marked, and Ensure for the same pod name takes it
//     again.
//   - A named address: created with that address; one held by another
//     owner or outside the external subnet is refused as ErrInvalid.
func RunFloatingIPs(t *testing.T, e Endpoint, cidr, extCIDR string) {
	c, name, ext, extP, sn, cloud := fipSetup(t, e, cidr, extCIDR)
	owner := name + "/pod"
	node := e.NewNode(t, sn, sn.Gateway.Next().Next())
	prov := node.Provider
	leases, err := prov.Assign(c, provider.AssignRequest{Count: 2})
	if err != nil || len(leases) != 2 {
		t.Fatalf("assign two pod addresses: %v, %v", leases, err)
	}
	podA, podB := leases[0].Address, leases[1].Address
	portID := prov.Info().Port

	// Ensure: created associated, marked; idempotent.
	want := floatingip.Want{Owner: owner, Network: name + "-ext", Policy: floatingip.Release, PortID: portID, FixedIP: podA}
	got, err := cloud.Ensure(c, want)
	if err != nil {
		t.Fatalf("Ensure auto: %v", err)
	}
	f := getFIP(t, c, e, got.ID)
	if f.PortID != portID || f.FixedIP != podA.String() || f.Description != floatingip.Mark(owner, floatingip.Release) || !extP.Contains(netip.MustParseAddr(f.FloatingIP)) {
		t.Fatalf("floating IP after Ensure: %+v, want on %s %s, marked", f, portID, podA)
	}
	again, err := cloud.Ensure(c, want)
	if err != nil || again.ID != got.ID {
		t.Fatalf("Ensure again: %+v, %v; want the same floating IP %s", again, err, got.ID)
	}

	// Neutron's own behaviour: a fixed IP taken off a port keeps its
	// floating IP pointing at it.
	setFixed(t, c, e, portID, podA, false)
	if f := getFIP(t, c, e, got.ID); f.PortID != portID || f.FixedIP != podA.String() {
		t.Fatalf("fixed IP %s taken off port %s: the floating IP says port %q fixed %q — the endpoint detached it, Neutron does not", podA, portID, f.PortID, f.FixedIP)
	}
	setFixed(t, c, e, portID, podA, true)

	// The provider keeps an address with a floating IP, and says why.
	err = prov.Release(c, []netip.Addr{podA, podB})
	if err == nil || !strings.Contains(err.Error(), "floating IP "+got.Address) {
		t.Fatalf("Release of %s with floating IP %s: %v, want a refusal naming it", podA, got.Address, err)
	}
	if !onPort(t, c, e, portID, podA) || onPort(t, c, e, portID, podB) {
		t.Fatalf("after the refused release: %s must stay on the port (floating IP), %s must have left", podA, podB)
	}

	// Detach (release): gone from the port, then deleted; now the address
	// may leave.
	done, err := cloud.Detach(c, owner, nil)
	if err != nil || len(done) != 1 {
		t.Fatalf("Detach: %v, %v", done, err)
	}
	if _, err := floatingips.Get(c, e.NC, got.ID).Extract(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Fatalf("policy release: floating IP %s still there (%v)", got.Address, err)
	}
	if err := prov.Release(c, []netip.Addr{podA}); err != nil || onPort(t, c, e, portID, podA) {
		t.Fatalf("release after the detach: %v (on port: %v)", err, onPort(t, c, e, portID, podA))
	}

	// Retain: detached, kept, marked; the same pod name gets it back.
	leases, err = prov.Assign(c, provider.AssignRequest{Count: 1})
	if err != nil || len(leases) != 1 {
		t.Fatalf("assign: %v, %v", leases, err)
	}
	podC := leases[0].Address
	want = floatingip.Want{Owner: owner, Network: ext.ID, Policy: floatingip.Retain, PortID: portID, FixedIP: podC}
	kept, err := cloud.Ensure(c, want)
	if err != nil {
		t.Fatalf("Ensure (retain): %v", err)
	}
	if _, err := cloud.Detach(c, owner, nil); err != nil {
		t.Fatal(err)
	}
	if f := getFIP(t, c, e, kept.ID); f.PortID != "" || f.FixedIP != "" || f.Description != floatingip.Mark(owner, floatingip.Retain) {
		t.Fatalf("policy retain: %+v, want kept, unassociated, marked", f)
	}
	back, err := cloud.Ensure(c, want)
	if err != nil || back.ID != kept.ID || back.Address != kept.Address {
		t.Fatalf("Ensure after retain: %+v, %v; want %s again", back, err, kept.Address)
	}

	// A named address: taken by another owner, outside the subnet.
	other := floatingip.Want{Owner: name + "/other", Network: ext.ID, Address: netip.MustParseAddr(kept.Address), Policy: floatingip.Release, PortID: portID, FixedIP: podB}
	if _, err := cloud.Ensure(c, other); !errors.Is(err, floatingip.ErrInvalid) {
		t.Fatalf("Ensure of %s held by %s: %v, want ErrInvalid", kept.Address, owner, err)
	}
	leases, err = prov.Assign(c, provider.AssignRequest{Addresses: []netip.Addr{podB}})
	if err != nil || len(leases) != 1 {
		t.Fatalf("assign %s: %v, %v", podB, leases, err)
	}
	named := freeOn(t, c, e, ext.ID, extP)
	other.Address = named
	nf, err := cloud.Ensure(c, other)
	if err != nil || nf.Address != named.String() || nf.FixedIP != podB.String() {
		t.Fatalf("Ensure of the named %s: %+v, %v", named, nf, err)
	}
	other.Owner, other.Address = name+"/third", netip.MustParseAddr("192.0.2.77")
	if _, err := cloud.Ensure(c, other); !errors.Is(err, floatingip.ErrInvalid) {
		t.Fatalf("Ensure of an address outside %s: %v, want ErrInvalid", extCIDR, err)
	}

	// A deleted port takes its floating IPs' associations with it.
	if err := ports.Delete(c, e.NC, portID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if f := getFIP(t, c, e, nf.ID); f.PortID != "" || f.FixedIP != "" {
		t.Fatalf("port deleted: its floating IP still says %q %q", f.PortID, f.FixedIP)
	}
}

// RunFloatingIPsPairs is the address-pairs side of the contract (e.Mode
// must be address-pairs): the PodAddress names the VM port, which only
// allows the pod's address; Ensure finds the reservation port that holds
// it and associates there; the provider keeps the reservation (and the
// pair) while the floating IP points at it, and lets it go once detached.
func RunFloatingIPsPairs(t *testing.T, e Endpoint, cidr, extCIDR string) {
	c, name, ext, _, sn, cloud := fipSetup(t, e, cidr, extCIDR)
	owner := name + "/pod"
	node := e.NewNode(t, sn, sn.Gateway.Next().Next())
	prov := node.Provider
	leases, err := prov.Assign(c, provider.AssignRequest{Count: 1})
	if err != nil || len(leases) != 1 {
		t.Fatalf("assign a pod address: %v, %v", leases, err)
	}
	pod, vmPort := leases[0].Address, prov.Info().Port
	res := reservationOf(t, c, e, pod)
	if res == "" || res == vmPort {
		t.Fatalf("no reservation port holds %s (VM port %s)", pod, vmPort)
	}
	got, err := cloud.Ensure(c, floatingip.Want{Owner: owner, Network: ext.ID, Policy: floatingip.Release, PortID: vmPort, FixedIP: pod})
	if err != nil {
		t.Fatalf("Ensure with the VM port named: %v", err)
	}
	if f := getFIP(t, c, e, got.ID); f.PortID != res || f.FixedIP != pod.String() {
		t.Fatalf("floating IP on %q %q, want the reservation port %s", f.PortID, f.FixedIP, res)
	}
	err = prov.Release(c, []netip.Addr{pod})
	if err == nil || !strings.Contains(err.Error(), "floating IP "+got.Address) {
		t.Fatalf("Release of %s with floating IP %s: %v, want a refusal naming it", pod, got.Address, err)
	}
	if reservationOf(t, c, e, pod) != res {
		t.Fatalf("the refused release took the reservation of %s away", pod)
	}
	if _, err := cloud.Detach(c, owner, nil); err != nil {
		t.Fatal(err)
	}
	if err := prov.Release(c, []netip.Addr{pod}); err != nil || reservationOf(t, c, e, pod) != "" {
		t.Fatalf("release after the detach: %v (reservation %q)", err, reservationOf(t, c, e, pod))
	}
}

// reservationOf is the port holding a as a fixed IP ("" if none).
func reservationOf(t *testing.T, c context.Context, e Endpoint, a netip.Addr) string {
	t.Helper()
	pages, err := ports.List(e.NC, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: a.String()}}}).AllPages(c)
	if err != nil {
		t.Fatal(err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		return ""
	}
	return all[0].ID
}

// fipSetup builds what a floating IP needs: an external network and
// subnet, a tenant subnet, a router between them; and a Cloud whose marked
// floating IPs of this run go first at cleanup.
func fipSetup(t *testing.T, e Endpoint, cidr, extCIDR string) (c context.Context, name string, ext *networks.Network, extP netip.Prefix, sn providertest.Subnet, cloud *cluster.FloatingIPs) {
	b := e.NewFloatingBed(t, cidr, extCIDR)
	return b.Ctx, b.Name, b.Ext, b.ExtPrefix, b.Subnet, b.Cloud
}

// FloatingBed is a tenant subnet routed to an external network, where
// floating IPs can point at the subnet's ports (RunFloatingIPs' setting,
// and the leak audit's in test/leaks). Name prefixes what it made;
// everything goes at the test's end.
type FloatingBed struct {
	Ctx       context.Context
	Name      string
	Ext       *networks.Network
	ExtPrefix netip.Prefix
	Subnet    providertest.Subnet
	RouterID  string
	Cloud     *cluster.FloatingIPs
}

// NewFloatingBed makes one: the tenant subnet cidr (a pool of 40), the
// external network with extCIDR, and a router between them.
func (e Endpoint) NewFloatingBed(t *testing.T, cidr, extCIDR string) FloatingBed {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	name := fmt.Sprintf("vpcni-fip-%d-%d", os.Getpid(), seq.Add(1))

	ext, err := networks.Create(c, e.NC, externalNet{name: name + "-ext"}).Extract()
	if err != nil {
		t.Fatalf("external network: %v", err)
	}
	t.Cleanup(func() { e.DeleteNetwork(ext.ID) })
	extP := netip.MustParsePrefix(extCIDR)
	extGW := extP.Addr().Next().String()
	_, err = subnets.Create(c, e.NC, subnets.CreateOpts{NetworkID: ext.ID, Name: name + "-ext", IPVersion: gophercloud.IPv4, CIDR: extCIDR, GatewayIP: &extGW}).Extract()
	if err != nil {
		t.Fatalf("external subnet: %v", err)
	}
	sn := e.NewSubnet(t, cidr, 40)
	r, err := routers.Create(c, e.NC, routers.CreateOpts{Name: name, GatewayInfo: &routers.GatewayInfo{NetworkID: ext.ID}}).Extract()
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	// Cleanups run last-in first-out: floating IPs, the interface, the
	// router, then the networks.
	t.Cleanup(func() {
		cc, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		// Routes through the subnet (a routed pod subnet's) keep Neutron
		// from removing the interface: they go first.
		_, _ = routers.Update(cc, e.NC, r.ID, routers.UpdateOpts{Routes: &[]routers.Route{}}).Extract()
		_, _ = routers.RemoveInterface(cc, e.NC, r.ID, routers.RemoveInterfaceOpts{SubnetID: sn.ID}).Extract()
		_ = routers.Delete(cc, e.NC, r.ID).ExtractErr()
	})
	if _, err := routers.AddInterface(c, e.NC, r.ID, routers.AddInterfaceOpts{SubnetID: sn.ID}).Extract(); err != nil {
		t.Fatalf("router interface: %v", err)
	}
	cloud := &cluster.FloatingIPs{NC: e.NC, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		cc, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if owned, err := cloud.Owned(cc, ""); err == nil {
			for _, f := range owned {
				if strings.HasPrefix(f.Owner, name+"/") {
					_ = floatingips.Delete(cc, e.NC, f.ID).ExtractErr()
				}
			}
		}
	})

	return FloatingBed{Ctx: c, Name: name, Ext: ext, ExtPrefix: extP, Subnet: sn, RouterID: r.ID, Cloud: cloud}
}

// freeOn is an address of the external subnet that no port or floating
// IP holds yet, from its top down: Neutron picks floating IPs and the
// router's gateway at random, so a fixed choice would collide now and then
// (it did: a CI run's auto floating IP got .254).
func freeOn(t *testing.T, c context.Context, e Endpoint, netID string, p netip.Prefix) netip.Addr {
	t.Helper()
	pages, err := ports.List(e.NC, ports.ListOpts{NetworkID: netID}).AllPages(c)
	if err != nil {
		t.Fatal(err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, port := range all {
		for _, f := range port.FixedIPs {
			used[f.IPAddress] = true
		}
	}
	fpages, err := floatingips.List(e.NC, floatingips.ListOpts{FloatingNetworkID: netID}).AllPages(c)
	if err != nil {
		t.Fatal(err)
	}
	fips, err := floatingips.ExtractFloatingIPs(fpages)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fips {
		used[f.FloatingIP] = true
	}
	for a := lastButOne(p); p.Contains(a) && a != p.Addr(); a = a.Prev() {
		if !used[a.String()] {
			return a
		}
	}
	t.Fatalf("no free address left in %s", p)
	return netip.Addr{}
}

func lastButOne(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	a[3] |= byte(0xff >> (p.Bits() - 24))
	a[3]--
	return netip.AddrFrom4(a)
}

// fipView is the part of a floating IP the contract reads.
type fipView struct {
	PortID, FixedIP, FloatingIP, Description string
}

func getFIP(t *testing.T, c context.Context, e Endpoint, id string) fipView {
	t.Helper()
	f, err := floatingips.Get(c, e.NC, id).Extract()
	if err != nil {
		t.Fatalf("floating IP %s: %v", id, err)
	}
	return fipView{PortID: f.PortID, FixedIP: f.FixedIP, FloatingIP: f.FloatingIP, Description: f.Description}
}

func onPort(t *testing.T, c context.Context, e Endpoint, portID string, a netip.Addr) bool {
	t.Helper()
	p, err := ports.Get(c, e.NC, portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(p.FixedIPs, func(f ports.IP) bool { return f.IPAddress == a.String() })
}

// setFixed puts a fixed IP on a port or takes it off, as a person would
// (the description with vpcni's marks is left as it is).
func setFixed(t *testing.T, c context.Context, e Endpoint, portID string, a netip.Addr, on bool) {
	t.Helper()
	for range 10 {
		p, err := ports.Get(c, e.NC, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		var fixed []ports.IP
		for _, f := range p.FixedIPs {
			if f.IPAddress != a.String() {
				fixed = append(fixed, f)
			}
		}
		if on {
			fixed = append(fixed, ports.IP{SubnetID: p.FixedIPs[0].SubnetID, IPAddress: a.String()})
		}
		rev := p.RevisionNumber
		if _, err = ports.Update(c, e.NC, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract(); err == nil {
			return
		} else if !gophercloud.ResponseCodeIs(err, 412) {
			t.Fatalf("set %s on port %s to %v: %v", a, portID, on, err)
		}
	}
	t.Fatalf("port %s kept changing", portID)
}
