package cluster_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	_ "github.com/vpcni/vpcni/internal/provider/openstack/cluster"
)

// The openstack cloud as -cloud-config opens it, against the lab's
// Neutron endpoint: what its section allows, and each door the cluster
// side's consumers open.
func TestCloudDoors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go neutronapi.New().Serve(l)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	ctx := context.Background()
	nc := openstack.NoAuthClient(url, http.Client{Timeout: 30 * time.Second})
	n, err := networks.Create(ctx, nc, networks.CreateOpts{Name: "doors"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: "10.66.0.0/24"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	load := func(extra string) cloudconfig.Cloud {
		t.Helper()
		p := filepath.Join(t.TempDir(), "cloud.yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n%s", url, extra), 0o600); err != nil {
			t.Fatal(err)
		}
		fc, err := cloudconfig.Load(p)
		if err != nil {
			t.Fatal(err)
		}
		return fc.Open(nil)
	}

	// Without subnetID: floating IPs and the router, not what reads the
	// pods' subnet.
	c := load("  maxAddressPairs: 7\n")
	if info := c.Info(); info.Name != "openstack" || info.Subnet {
		t.Errorf("info without subnetID: %+v", info)
	}
	router, err := c.Router(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if router.MaxPairs() != 7 {
		t.Errorf("router door: max pairs %d; want the section's 7", router.MaxPairs())
	}
	fips, err := c.FloatingIPs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if at, err := fips.At(ctx, netip.MustParseAddr("10.66.0.9")); err != nil || len(at) != 0 {
		t.Errorf("floating IPs at an address nobody points at: %+v, %v", at, err)
	}

	// With subnetID: the leak collector's door reads the pods' subnet.
	c = load("  subnetID: " + sn.ID + "\n")
	if !c.Info().Subnet {
		t.Errorf("info with subnetID: %+v", c.Info())
	}
	held, err := c.Leaks(ctx, leaks.Scope{ClusterID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if hs, err := held.Holdings(ctx); err != nil || len(hs) != 0 {
		t.Errorf("holdings of an empty subnet: %+v, %v", hs, err)
	}
	for id, want := range map[string]string{"openstack:///vm-1": "vm-1", "openstack://regionOne/vm-2": "vm-2", "aws:///eu-west-1a/i-1": "", "": ""} {
		if got, ok := held.Instance(id); got != want || ok != (want != "") {
			t.Errorf("instance of %q: %q %v, want %q", id, got, ok, want)
		}
	}
	noID, err := c.Leaks(ctx, leaks.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noID.Holdings(ctx); err == nil || !strings.Contains(err.Error(), "cluster's ID") {
		t.Errorf("holdings without a cluster ID: %v", err)
	}

	// What holds an address: a VM port's fixed IP is that port of its VM;
	// a reservation port's stands for the VM port it serves.
	vm, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: n.ID, DeviceID: "vm-1", DeviceOwner: "compute:nova",
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: "10.66.0.20"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	resv, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: n.ID, DeviceID: vm.ID, DeviceOwner: "network:vpcni",
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: "10.66.0.21"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{"10.66.0.20": vm.ID + " vm-1 fixed IP of port " + vm.ID,
		"10.66.0.21": vm.ID + "  reserved by port " + resv.ID + " for VM port " + vm.ID, "10.66.0.22": ""} {
		hs, err := c.Holders(ctx, netip.MustParseAddr(addr))
		got := ""
		for _, h := range hs {
			got += h.Resource + " " + h.Instance + " " + h.How
		}
		if err != nil || !strings.HasPrefix(got, want) || (want == "") != (got == "") {
			t.Errorf("holders of %s: %q, %v; want %q…", addr, got, err, want)
		}
	}

	// Taking a sticky address off a dead node's port is built for mode
	// fixed-ips only; the section says which.
	c = load("  subnetID: " + sn.ID + "\n  mode: address-pairs\n")
	if err := c.TakeOff(ctx, "p1", []netip.Addr{netip.MustParseAddr("10.66.0.9")}); err == nil || !strings.Contains(err.Error(), "fixed-ips only") {
		t.Errorf("take-off in mode address-pairs: %v", err)
	}
}
