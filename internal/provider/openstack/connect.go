package openstack

import (
	"context"
	"net/http"

	"github.com/gophercloud/gophercloud/v2"
)

// NetworkClient is a Neutron client as cfg's connection fields say
// (endpoint without Keystone, or auth/credentialsFile through Keystone's
// catalog), for vpcni-controller, which shares the agent's section shape.
func NetworkClient(ctx context.Context, cfg Config) (*gophercloud.ServiceClient, error) {
	cfg.Mode, cfg.SecondaryNICs = "fixed-ips", 0 // no Nova
	nc, _, err := clients(ctx, cfg, http.DefaultTransport)
	return nc, err
}
