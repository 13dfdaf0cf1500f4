package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/routes"
)

// RouteBed is a route-budget test bed on a Neutron (the lab's endpoint or a
// real neutron-server): a network with a VM subnet, a router on it, and
// one VM port per node, each node owning one block of the pod range.
// vpcnictl bench route-budget and the tests share it.
type RouteBed struct {
	NC       *gophercloud.ServiceClient
	NetID    string
	SubnetID string
	RouterID string
	// Ranges is the pod range the blocks come from; Blocks one per node.
	Ranges []netip.Prefix
	Blocks []routes.Block
	Ports  []string // VM port of node i

	attached bool
}

// NewRouteBed builds it: VM subnet vm (a /24 holds up to 200 nodes, from .11),
// pod range pods split in blocks of /bits. attach: plug the router into
// the subnet (a real Neutron checks that a route's next hop is on one of
// the router's subnets; the lab's endpoint knows its subnets anyway).
func NewRouteBed(ctx context.Context, nc *gophercloud.ServiceClient, name string, nodes int, vm, pods netip.Prefix, bits int, attach bool) (b *RouteBed, err error) {
	if nodes < 1 || nodes > 200 || vm.Bits() > 24 {
		return nil, fmt.Errorf("bed: %d nodes in %s: 1..200 in a /24 or larger", nodes, vm)
	}
	blocks, err := ipam.NewBlocks([]netip.Prefix{pods}, bits)
	if err != nil {
		return nil, fmt.Errorf("bed: %w", err)
	}
	var cidrs []netip.Prefix
	for p := range blocks.All {
		if cidrs = append(cidrs, p); len(cidrs) == nodes {
			break
		}
	}
	if len(cidrs) < nodes {
		return nil, fmt.Errorf("bed: %s holds fewer than %d blocks of /%d", pods, nodes, bits)
	}
	b = &RouteBed{NC: nc, Ranges: []netip.Prefix{pods}}
	defer func() {
		if err != nil {
			b.Close(context.WithoutCancel(ctx))
		}
	}()
	n, err := networks.Create(ctx, nc, networks.CreateOpts{Name: name}).Extract()
	if err != nil {
		return nil, fmt.Errorf("bed network: %w", err)
	}
	b.NetID = n.ID
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: vm.String()}).Extract()
	if err != nil {
		return nil, fmt.Errorf("bed subnet: %w", err)
	}
	b.SubnetID = sn.ID
	r, err := routers.Create(ctx, nc, routers.CreateOpts{Name: name}).Extract()
	if err != nil {
		return nil, fmt.Errorf("bed router: %w", err)
	}
	b.RouterID = r.ID
	if attach {
		if _, err := routers.AddInterface(ctx, nc, r.ID, routers.AddInterfaceOpts{SubnetID: sn.ID}).Extract(); err != nil {
			return nil, fmt.Errorf("bed router interface: %w", err)
		}
		b.attached = true
	}
	base := vm.Addr().As4()
	for i := range nodes {
		ip := base
		ip[3] = byte(11 + i)
		addr := netip.AddrFrom4(ip)
		p, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: n.ID, Name: fmt.Sprintf("%s-n%d", name, i+1), DeviceOwner: "compute:bed",
			FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: addr.String()}}}).Extract()
		if err != nil {
			return nil, fmt.Errorf("bed port of node %d: %w", i+1, err)
		}
		b.Ports = append(b.Ports, p.ID)
		b.Blocks = append(b.Blocks, routes.Block{Name: fmt.Sprintf("b%02d", i+1), CIDR: cidrs[i], Node: fmt.Sprintf("n%d", i+1), NodeIP: addr,
			Created: time.Unix(int64(i), 0)})
	}
	return b, nil
}

// Routes is the routed pod subnet's cloud on the bed's router and subnet
// (Neutron's default max_allowed_address_pair, 10).
func (b *RouteBed) Routes() *Routes { return NewRoutes(b.NC, b.RouterID, b.SubnetID, 10) }

// Close removes what NewRouteBed made (its routes first, which Neutron wants).
// A router never attached is left to the endpoint (the lab's, which has
// no router deletion, goes with its process).
func (b *RouteBed) Close(ctx context.Context) error {
	var errs []error
	if b.attached {
		if _, err := routers.Update(ctx, b.NC, b.RouterID, routers.UpdateOpts{Routes: &[]routers.Route{}}).Extract(); err != nil {
			errs = append(errs, err)
		}
		if b.SubnetID != "" {
			_, _ = routers.RemoveInterface(ctx, b.NC, b.RouterID, routers.RemoveInterfaceOpts{SubnetID: b.SubnetID}).Extract()
		}
		errs = append(errs, routers.Delete(ctx, b.NC, b.RouterID).ExtractErr())
	}
	for _, id := range b.Ports {
		errs = append(errs, ports.Delete(ctx, b.NC, id).ExtractErr())
	}
	if b.NetID != "" {
		errs = append(errs, networks.Delete(ctx, b.NC, b.NetID).ExtractErr())
	}
	return errors.Join(errs...)
}
