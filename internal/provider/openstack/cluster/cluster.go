// Package cluster is the openstack cloud of the cluster side:
// vpcni-controller's reconcilers (floating IPs, the routed pod subnet's
// router and pairs, a sticky address taken off a dead node's port, the
// leak collector) and vpcnictl's audit and trace, each through the
// interface its consumer owns (floatingip.Cloud, routes.Cloud,
// leaks.Cloud, the sticky keeper's TakeOff). It registers itself as the
// cloud "openstack" of -cloud-config (internal/cloudconfig);
// internal/builtin/clouds links it. (vpcnictl doctor, which reads the
// node's agent config, asks the provider itself: its provider.Doctor.)
//
// It is a package apart from the provider (internal/provider/openstack,
// whose Neutron client, marks and take-off it uses) so that vpcnid, which
// links the provider, links none of the controller's packages.
package cluster

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/routes"
)

// Name is the cloud's name: its section's key in -cloud-config, and the
// provider's in the agent config.
const Name = "openstack"

func init() {
	cloudconfig.Register(cloudconfig.Registration{
		Name:        Name,
		NewSettings: func() cloudconfig.Settings { return &Settings{} },
		Open: func(s cloudconfig.Settings, log *slog.Logger) cloudconfig.Cloud {
			return &cloud{cfg: s.(*Settings).Config, log: log}
		},
	})
}

// Settings is the openstack section of -cloud-config: the agent's
// provider.openstack section (the same fields), with subnetID optional.
type Settings struct{ openstack.Config }

// Validate implements cloudconfig.Settings. Only the login and the call
// bounds matter to the cluster side: the provider's own checks run with a
// stand-in subnet, and their complaints about it are not the
// controller's (what needs the subnet says so: Info.Subnet).
func (s *Settings) Validate() error {
	c := s.Config
	if c.SubnetID == "" {
		c.SubnetID = "unused-by-the-controller"
	}
	return c.Validate()
}

// cloud implements cloudconfig.Cloud. Its doors share one Neutron client,
// logged in by the first door opened.
type cloud struct {
	cfg openstack.Config
	log *slog.Logger

	mu sync.Mutex
	nc *gophercloud.ServiceClient
}

func (c *cloud) Info() cloudconfig.Info {
	return cloudconfig.Info{Name: Name, Subnet: c.cfg.SubnetID != "", SubnetKey: Name + ".subnetID"}
}

// login is the shared Neutron client: made (Keystone, or a noauth
// endpoint) on first use.
func (c *cloud) login(ctx context.Context) (*gophercloud.ServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc == nil {
		nc, err := openstack.NetworkClient(ctx, c.cfg)
		if err != nil {
			return nil, err
		}
		c.nc = nc
	}
	return c.nc, nil
}

func (c *cloud) FloatingIPs(ctx context.Context) (floatingip.Cloud, error) {
	nc, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	return &FloatingIPs{NC: nc, Timeout: c.cfg.Timeout.Duration}, nil
}

// Router: with subnetID, a node's VM port is looked up among that
// subnet's ports.
func (c *cloud) Router(ctx context.Context, router string) (routes.Cloud, error) {
	nc, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	return NewRoutes(nc, router, c.cfg.SubnetID, c.cfg.MaxAddressPairs), nil
}

func (c *cloud) Leaks(ctx context.Context, scope leaks.Scope) (leaks.Cloud, error) {
	nc, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	l := &Leaks{NC: nc, OpenStack: &c.cfg, ClusterID: scope.ClusterID, RouterID: scope.Router, Log: c.log}
	if scope.Router != "" {
		l.Ranges = scope.Ranges
	}
	return l, nil
}

// TakeOff logs in at each call (openstack.TakeOff): it is rare, a dead
// node's sticky address.
func (c *cloud) TakeOff(ctx context.Context, port string, addrs []netip.Addr) error {
	return openstack.TakeOff(ctx, c.cfg, port, addrs)
}
