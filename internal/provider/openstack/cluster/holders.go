package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// Holders implements cloudconfig.Cloud: the ports with addr as a fixed
// IP. A reservation port (address-pairs mode) stands for the VM port it
// serves, whose pair carries the address; a NIC port for the instance its
// name gives.
func (c *cloud) Holders(ctx context.Context, addr netip.Addr) ([]cloudconfig.Holder, error) {
	nc, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	t := c.cfg.Timeout.Duration
	if t <= 0 {
		t = 15 * time.Second
	}
	cc, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	pages, err := ports.List(nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: addr.String()}}}).AllPages(cc)
	if err != nil {
		return nil, fmt.Errorf("list the ports holding %s: %w", addr, err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, err
	}
	var out []cloudconfig.Holder
	for _, p := range all {
		h := cloudconfig.Holder{Resource: p.ID, Instance: p.DeviceID, How: fmt.Sprintf("fixed IP of port %s (device_owner %q)", p.ID, p.DeviceOwner)}
		if p.DeviceOwner == c.cfg.DeviceOwner {
			h = cloudconfig.Holder{Resource: p.DeviceID, How: fmt.Sprintf("reserved by port %s for VM port %s (an allowed address pair there)", p.ID, p.DeviceID)}
		} else if inst, nic := openstack.NICOf(p.Name); nic {
			h.Instance, h.How = inst, fmt.Sprintf("fixed IP of NIC port %s of instance %s", p.ID, inst)
		}
		out = append(out, h)
	}
	return out, nil
}
