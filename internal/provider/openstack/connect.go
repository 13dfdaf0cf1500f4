package openstack

import (
	"context"

	"github.com/gophercloud/gophercloud/v2"
)

// NetworkClient is a Neutron client as cfg's connection fields say
// (endpoint without Keystone, or auth/credentialsFile through Keystone's
// catalog), for vpcni-controller, which shares the agent's section shape.
func NetworkClient(ctx context.Context, cfg Config) (*gophercloud.ServiceClient, error) {
	cfg.Mode, cfg.SecondaryNICs = "fixed-ips", 0 // no Nova
	rt, err := cfg.roundTripper(nil)
	if err != nil {
		return nil, err
	}
	nc, _, err := clients(ctx, cfg, rt)
	return nc, err
}
