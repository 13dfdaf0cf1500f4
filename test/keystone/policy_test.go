package keystone

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/external"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
)

// TestRefusalsNameThePolicyRule: a member user meets Neutron's real
// default policy (Keystone mode) where it refuses, and the error vpcni
// shows names the call, the rule Neutron names, and what to change:
//   - ports: the agent in mode fixed-ips on a shared network of another
//     project (its no-op PUT of the VM port's fixed IPs at start);
//   - floating IPs: vpcni-controller creating a floating IP with a named
//     address (create_floatingip:floating_ip_address is admin-only);
//   - routers: a router with a fixed external address, the admin-only
//     attribute of the router calls (read through openstack.DeniedBy, as
//     vpcni-controller's route writes read theirs).
//
// Nova's refusal is checked from its documented shape only
// (internal/provider/openstack TestDeniedNamesTheRule): the lab's Nova
// runs without Keystone, so it has no policy to refuse with.
func TestRefusalsNameThePolicyRule(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	anc, err := gcos.NewNetworkV2(adminClient(t, c), gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	mpc, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret})
	if err != nil {
		t.Fatal(err)
	}
	mnc, err := gcos.NewNetworkV2(mpc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}

	// Ports: the admin's shared network, the member's VM port on it.
	shared := true
	sn, err := networks.Create(c, anc, networks.CreateOpts{Name: "vpcni-policy-shared", Shared: &shared}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetwork(anc, sn.ID) })
	ssub, err := subnets.Create(c, anc, subnets.CreateOpts{NetworkID: sn.ID, IPVersion: gophercloud.IPv4, CIDR: "10.195.0.0/24"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ports.Create(c, mnc, ports.CreateOpts{NetworkID: sn.ID}).Extract()
	if err != nil {
		t.Fatalf("member's VM port on the shared network: %v", err)
	}
	cfg := openstack.Config{SubnetID: ssub.ID, Auth: openstack.Auth{AuthURL: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret}}
	cfg.Defaults()
	_, err = openstack.New(c, cfg, netip.MustParseAddr(vm.FixedIPs[0].IPAddress))
	want := []string{"mode fixed-ips cannot work here", "Neutron's policy refused PUT", "/v2.0/ports/" + vm.ID,
		"Neutron's policy (update_port:fixed_ips:ip_address and update_port:fixed_ips:subnet_id) lets only",
		"(rules update_port:fixed_ips:ip_address and update_port:fixed_ips:subnet_id: ", "is disallowed by policy", "network's owner or an admin", "use mode: passthrough"}
	expectAll(t, "ports", err, want)

	// Floating IPs: an external network; the member names the address.
	ext, err := networks.Create(c, anc, external.CreateOptsExt{CreateOptsBuilder: networks.CreateOpts{Name: "vpcni-policy-ext"}, External: &shared}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetwork(anc, ext.ID) })
	esub, err := subnets.Create(c, anc, subnets.CreateOpts{NetworkID: ext.ID, IPVersion: gophercloud.IPv4, CIDR: "10.194.0.0/24"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	own := memberNetwork(t, c, "10.193.0.0/24", "10.193.0.10")
	owned, err := subnets.Get(c, mnc, own).Extract()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := ports.List(mnc, ports.ListOpts{NetworkID: owned.NetworkID}).AllPages(c)
	if err != nil {
		t.Fatal(err)
	}
	mports, _ := ports.ExtractPorts(pages)
	if len(mports) != 1 {
		t.Fatalf("member's ports: %+v", mports)
	}
	fips := &cluster.FloatingIPs{NC: mnc, Timeout: 30 * time.Second}
	_, err = fips.Ensure(c, floatingip.Want{Owner: "ns/pod", Network: ext.ID, Address: netip.MustParseAddr("10.194.0.50"), Policy: "release",
		PortID: mports[0].ID, FixedIP: netip.MustParseAddr("10.193.0.10")})
	expectAll(t, "floating IPs", err, []string{"create floating IP 10.194.0.50", "Neutron's policy refused POST", "/v2.0/floatingips",
		"(rule create_floatingip:floating_ip_address", "allocate the floating IP first"})

	// Routers: a fixed address on the external network.
	_, err = routers.Create(c, mnc, routers.CreateOpts{Name: "vpcni-policy", GatewayInfo: &routers.GatewayInfo{NetworkID: ext.ID,
		ExternalFixedIPs: []routers.ExternalFixedIP{{SubnetID: esub.ID, IPAddress: "10.194.0.60"}}}}).Extract()
	d, ok := openstack.DeniedBy(err)
	if !ok {
		t.Fatalf("routers: %v, want a policy refusal", err)
	}
	expectAll(t, "routers", d, []string{"Neutron's policy refused POST", "/v2.0/routers", "(rules create_router:external_gateway_info:network_id and create_router:external_gateway_info:external_fixed_ips: ",
		"create_router:external_gateway_info:external_fixed_ips is admin-only by default"})
	if r := d.Rule(); r != "create_router:external_gateway_info:network_id and create_router:external_gateway_info:external_fixed_ips" {
		t.Errorf("routers: rule %q", r)
	}
}

func expectAll(t *testing.T, what string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want a policy refusal", what)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v\nwant it to say %q", what, err, w)
		}
	}
	t.Logf("%s: %v", what, err)
}
