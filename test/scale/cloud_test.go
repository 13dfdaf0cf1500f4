package scale

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// cloud is the routed pod subnet's cloud for the simulated nodes: the
// lab's Neutron-compatible endpoint (the API only, in this process, on
// loopback) with a VM subnet, a router with Neutron's default max_routes
// (30) and one VM port per node, as OpenStack would hold them for 1,000
// VMs. vpcni-controller reaches it through -cloud-config as it would a
// real neutron-server (noauth).
type cloud struct {
	srv      *neutronapi.Server
	url      string
	subnetID string
	routerID string
	// nodeIPs[i] is node i's VM port address, vms[i] its instance.
	nodeIPs []netip.Addr
	vms     []string
	close   func()
}

// vmSubnet holds the nodes' ports: a /20, room for 4,000 nodes from .11.
var vmSubnet = netip.MustParsePrefix("10.200.0.0/20")

func newCloud(ctx context.Context, nodes int) (*cloud, error) {
	if nodes > 4000 {
		return nil, fmt.Errorf("%d nodes: the VM subnet %s holds 4,000", nodes, vmSubnet)
	}
	srv := neutronapi.New()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	c := &cloud{srv: srv, url: "http://" + ln.Addr().String() + "/", close: func() { _ = hs.Close() }}
	nc := openstack.NoAuthClient(c.url, http.Client{Timeout: 30 * time.Second})
	n, err := networks.Create(ctx, nc, networks.CreateOpts{Name: "scale"}).Extract()
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: vmSubnet.String()}).Extract()
	if err != nil {
		return nil, fmt.Errorf("subnet: %w", err)
	}
	c.subnetID = sn.ID
	r, err := routers.Create(ctx, nc, routers.CreateOpts{Name: "scale"}).Extract()
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	c.routerID = r.ID
	ip := vmSubnet.Addr()
	for range 10 {
		ip = ip.Next()
	}
	for i := range nodes {
		ip = ip.Next()
		vm := fmt.Sprintf("vm-%05d", i)
		if _, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: n.ID, Name: vm, DeviceOwner: "compute:nova", DeviceID: vm,
			FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: ip.String()}}}).Extract(); err != nil {
			return nil, fmt.Errorf("VM port of node %d: %w", i, err)
		}
		c.nodeIPs = append(c.nodeIPs, ip)
		c.vms = append(c.vms, vm)
	}
	return c, nil
}

// configFile writes vpcni-controller's -cloud-config: the openstack
// section on the endpoint (the VM subnet is where the nodes' ports are)
// and the routes section on the router, its max_routes learned from the
// endpoint's refusal as with a real Neutron.
func (c *cloud) configFile(dir string) (string, error) {
	path := filepath.Join(dir, "cloud.yaml")
	return path, os.WriteFile(path, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n  subnetID: %s\nroutes:\n  routerID: %s\n",
		c.url, c.subnetID, c.routerID), 0o600)
}

// routes counts the router's routes.
func (c *cloud) routes() int {
	c.srv.Lock()
	defer c.srv.Unlock()
	for _, r := range c.srv.Routers() {
		if r.ID == c.routerID {
			return len(r.Routes)
		}
	}
	return 0
}
