package neutronapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider/openstack"
)

func serve(t *testing.T) *gophercloud.ServiceClient {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go New().Serve(l)
	t.Cleanup(func() { l.Close() })
	return openstack.NoAuthClient("http://"+l.Addr().String()+"/", http.Client{Timeout: 30 * time.Second})
}

func mustNet(t *testing.T, nc *gophercloud.ServiceClient, cidr string) (string, string) {
	ctx := context.Background()
	n, err := networks.Create(ctx, nc, networks.CreateOpts{Name: cidr}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: cidr}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return n.ID, sn.ID
}

// The measured Neutron behaviour: add_extraroutes is atomic under
// concurrency, the 31st route is refused, a next hop off the router's
// subnets is refused.
func TestExtraRoutes(t *testing.T) {
	nc := serve(t)
	ctx := context.Background()
	mustNet(t, nc, "10.5.0.0/24")
	r, err := routers.Create(ctx, nc, routers.CreateOpts{Name: "r"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range 10 {
		wg.Go(func() {
			rt := []routers.Route{{DestinationCIDR: fmt.Sprintf("10.244.%d.0/24", i), NextHop: "10.5.0.10"}}
			_, errs[i] = extraroutes.Add(ctx, nc, r.ID, extraroutes.Opts{Routes: &rt}).Extract()
		})
	}
	wg.Wait()
	got, err := routers.Get(ctx, nc, r.ID).Extract()
	if err != nil || len(got.Routes) != 10 {
		t.Fatalf("10 concurrent add_extraroutes left %d routes (%v, %v)", len(got.Routes), err, errs)
	}
	many := make([]routers.Route, 31)
	for i := range many {
		many[i] = routers.Route{DestinationCIDR: fmt.Sprintf("10.243.%d.0/24", i), NextHop: "10.5.0.10"}
	}
	_, err = routers.Update(ctx, nc, r.ID, routers.UpdateOpts{Routes: &many}).Extract()
	if !gophercloud.ResponseCodeIs(err, 400) {
		t.Fatalf("31 routes: %v, want 400 RoutesExhausted", err)
	}
	off := []routers.Route{{DestinationCIDR: "10.242.0.0/24", NextHop: "192.168.99.1"}}
	if _, err := extraroutes.Add(ctx, nc, r.ID, extraroutes.Opts{Routes: &off}).Extract(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Fatalf("next hop off the router's subnets: %v, want 400", err)
	}
	one := []routers.Route{{DestinationCIDR: "10.244.3.0/24", NextHop: "10.5.0.10"}}
	got, err = extraroutes.Remove(ctx, nc, r.ID, extraroutes.Opts{Routes: &one}).Extract()
	if err != nil || len(got.Routes) != 9 {
		t.Fatalf("remove_extraroutes: %d routes, %v", len(got.Routes), err)
	}
}

// Floating IPs: on a secondary fixed IP of a VM port, one per fixed IP;
// not on an allowed-address-pair address; a port with several IPs needs
// fixed_ip_address.
func TestFloatingIPs(t *testing.T) {
	nc := serve(t)
	ctx := context.Background()
	netID, subID := mustNet(t, nc, "10.6.0.0/24")
	extID, _ := mustNet(t, nc, "203.0.113.0/24")
	p, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: netID, FixedIPs: []ports.IP{{SubnetID: subID, IPAddress: "10.6.0.10"}, {SubnetID: subID, IPAddress: "10.6.0.64"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	pairs := []ports.AddressPair{{IPAddress: "10.6.0.99"}}
	if _, err := ports.Update(ctx, nc, p.ID, ports.UpdateOpts{AllowedAddressPairs: &pairs}).Extract(); err != nil {
		t.Fatal(err)
	}
	if _, err := floatingips.Create(ctx, nc, floatingips.CreateOpts{FloatingNetworkID: extID, PortID: p.ID}).Extract(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Fatalf("FIP on a port with two IPs and no fixed_ip_address: %v, want 400", err)
	}
	fip, err := floatingips.Create(ctx, nc, floatingips.CreateOpts{FloatingNetworkID: extID, PortID: p.ID, FixedIP: "10.6.0.64"}).Extract()
	if err != nil || fip.FixedIP != "10.6.0.64" || fip.FloatingIP == "" {
		t.Fatalf("FIP on a secondary fixed IP: %+v, %v", fip, err)
	}
	if _, err := floatingips.Create(ctx, nc, floatingips.CreateOpts{FloatingNetworkID: extID, PortID: p.ID, FixedIP: "10.6.0.64"}).Extract(); !gophercloud.ResponseCodeIs(err, 409) {
		t.Fatalf("second FIP on the same fixed IP: %v, want 409", err)
	}
	if _, err := floatingips.Create(ctx, nc, floatingips.CreateOpts{FloatingNetworkID: extID, PortID: p.ID, FixedIP: "10.6.0.99"}).Extract(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Fatalf("FIP on an allowed-address-pair address: %v, want 400", err)
	}
	if err := floatingips.Delete(ctx, nc, fip.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}
