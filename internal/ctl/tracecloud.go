package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/routes"
)

// The controller's side of a pod's path, read with a cloud file (its
// -cloud-config): the floating IPs pointing at each address and, with a
// routes section, the block's route on the router and its pair on the
// node's VM port (a routed pod subnet: the agent holds no cloud
// credentials then). Added to each attachment's hops.
func traceCloud(ctx context.Context, path string, tr *api.Trace) error {
	fc, err := cloudconfig.Load(path)
	if err != nil {
		return err
	}
	nc, err := openstack.NetworkClient(ctx, *fc.OpenStack)
	if err != nil {
		return fmt.Errorf("log in to the cloud: %w", err)
	}
	var router string
	if fc.HasRoutes() {
		rc, err := routes.LoadCloudConfig(path)
		if err != nil {
			return err
		}
		router = rc.Routes.RouterID
	}
	nodeIP, _ := netip.ParseAddr(tr.NodeIP)
	for i := range tr.Attachments {
		a := &tr.Attachments[i]
		addr, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		fips, err := floatingIPHops(ctx, nc, tr.Pod, addr)
		if err != nil {
			return err
		}
		a.Hops = append(a.Hops, fips...)
		// A pod on the VMs' subnet (provider openstack) needs no route: its
		// address is on the node's own port.
		if router != "" && tr.Provider != "openstack" {
			hops, err := blockHops(ctx, nc, router, nodeIP, addr)
			if err != nil {
				return err
			}
			a.Hops = append(a.Hops, hops...)
		}
	}
	return nil
}

// floatingIPHops: each floating IP pointing at addr, ok when it is the
// pod's (or unmarked), wrong when another pod's mark is on it.
func floatingIPHops(ctx context.Context, nc *gophercloud.ServiceClient, pod string, addr netip.Addr) ([]api.Hop, error) {
	pages, err := floatingips.List(nc, floatingips.ListOpts{FixedIP: addr.String()}).AllPages(ctx)
	if gophercloud.ResponseCodeIs(err, 404) {
		return nil, nil // no L3 extension: no floating IPs
	}
	if err != nil {
		return nil, fmt.Errorf("list floating IPs: %w", err)
	}
	all, err := floatingips.ExtractFloatingIPs(pages)
	if err != nil {
		return nil, err
	}
	var hops []api.Hop
	for _, f := range all {
		if f.FixedIP != addr.String() || f.PortID == "" {
			continue
		}
		h := api.Hop{Where: api.HopCloud, What: fmt.Sprintf("floating IP %s -> %s (port %s)", f.FloatingIP, addr, f.PortID), State: api.HopOK}
		if owner, _, ok := floatingip.ParseMark(f.Description); ok && owner != pod {
			h.State, h.Detail = api.HopWrong, "it is marked for pod "+owner
			h.Fix = "vpcni-controller detaches a gone pod's floating IP; if " + owner + " is gone, its leak collector releases it (vpcnictl audit shows it)"
		}
		hops = append(hops, h)
	}
	return hops, nil
}

// blockHops: the router's route to the block holding addr, by this node,
// and that block's pair on the node's VM port.
func blockHops(ctx context.Context, nc *gophercloud.ServiceClient, router string, nodeIP, addr netip.Addr) ([]api.Hop, error) {
	rs, err := routes.NewNeutron(nc, router, "").Routes(ctx)
	if err != nil {
		return nil, err
	}
	const fix = "vpcni-controller routes each NodeBlock: the block's Routed condition (kubectl get nodeblocks -o yaml) says why not — the router's max_routes, the port's pairs — and its routes reconciler repairs drift at its next sync"
	// The most specific route to the address is the one that carries it.
	var best *routes.Route
	for i, r := range rs {
		if r.Destination.Contains(addr) && (best == nil || r.Destination.Bits() > best.Destination.Bits()) {
			best = &rs[i]
		}
	}
	if best != nil {
		h := api.Hop{Where: api.HopCloud, What: fmt.Sprintf("router %s: route %s via %s", router, best.Destination, best.NextHop), State: api.HopOK}
		if best.NextHop != nodeIP {
			h.State, h.Detail, h.Fix = api.HopWrong, fmt.Sprintf("the next hop is %s, not this node's %s", best.NextHop, nodeIP), fix
		}
		return append([]api.Hop{h}, pairHop(ctx, nc, nodeIP, best.Destination, fix)...), nil
	}
	return []api.Hop{{Where: api.HopCloud, What: fmt.Sprintf("router %s: a route to the block of %s", router, addr), State: api.HopMissing,
		Detail: fmt.Sprintf("router %s has no route to a block holding %s", router, addr), Fix: fix}}, nil
}

// pairHop: the block's allowed address pair on the node's VM port (port
// security lets the block's traffic through it).
func pairHop(ctx context.Context, nc *gophercloud.ServiceClient, nodeIP netip.Addr, block netip.Prefix, fix string) []api.Hop {
	what := fmt.Sprintf("pair %s on the VM port of %s", block, nodeIP)
	pages, err := ports.List(nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: nodeIP.String()}}}).AllPages(ctx)
	var all []ports.Port
	if err == nil {
		all, err = ports.ExtractPorts(pages)
	}
	if err != nil || len(all) != 1 {
		return []api.Hop{{Where: api.HopCloud, What: what, State: api.HopWrong, Detail: fmt.Sprintf("cannot find the one VM port of %s (%d found): %v", nodeIP, len(all), err), Fix: fix}}
	}
	ok := slices.ContainsFunc(all[0].AllowedAddressPairs, func(ap ports.AddressPair) bool {
		p, err := netip.ParsePrefix(ap.IPAddress)
		return err == nil && p.Masked() == block.Masked()
	})
	h := api.Hop{Where: api.HopCloud, What: what + " (port " + all[0].ID + ")", State: api.HopOK}
	if !ok {
		h.State, h.Detail, h.Fix = api.HopMissing, fmt.Sprintf("VM port %s does not allow %s", all[0].ID, block), fix
	}
	return []api.Hop{h}
}
