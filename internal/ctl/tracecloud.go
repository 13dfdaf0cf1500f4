package ctl

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/routes"
)

// The controller's side of a pod's path, read with a cloud file (its
// -cloud-config): when the pod's addresses come from the cloud's own
// provider, what the cloud says holds each (which port or ENI, of which
// instance); the floating IPs pointing at each address; and, with a
// routes section, the block's route on the router and its pair on the
// node's port (a routed pod subnet: the agent holds no cloud credentials
// then). Added to each attachment's hops.
func traceCloud(ctx context.Context, path string, tr *api.Trace) error {
	fc, err := cloudconfig.Load(path)
	if err != nil {
		return err
	}
	cloud := fc.Open(slog.New(slog.DiscardHandler))
	fips, err := cloud.FloatingIPs(ctx)
	if err != nil {
		return fmt.Errorf("log in to the cloud: %w", err)
	}
	var router routes.Cloud
	// A pod whose addresses come from the cloud's own provider lives on
	// the cloud's subnet, on the node's own port: it needs no route.
	if fc.HasRoutes() && tr.Provider != fc.Cloud {
		if router, err = cloud.Router(ctx, fc.Routes.RouterID); err != nil {
			return fmt.Errorf("log in to the cloud: %w", err)
		}
	}
	nodeIP, _ := netip.ParseAddr(tr.NodeIP)
	// The node's own port or ENI, which its pods' addresses must be on
	// (or on another of its instance's).
	var node []cloudconfig.Holder
	holders := tr.Provider == fc.Cloud
	if holders && nodeIP.IsValid() {
		if node, err = cloud.Holders(ctx, nodeIP); err != nil {
			return err
		}
	}
	for i := range tr.Attachments {
		a := &tr.Attachments[i]
		addr, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		if holders {
			held, err := cloud.Holders(ctx, addr)
			if err != nil {
				return err
			}
			a.Hops = append(a.Hops, holderHop(fc.Cloud, addr, held, node))
		}
		hops, err := floatingIPHops(ctx, fips, tr.Pod, addr)
		if err != nil {
			return err
		}
		a.Hops = append(a.Hops, hops...)
		if router != nil {
			hops, err := blockHops(ctx, router, fc.Routes.RouterID, nodeIP, addr)
			if err != nil {
				return err
			}
			a.Hops = append(a.Hops, hops...)
		}
	}
	return nil
}

// holderHop: what the cloud says holds addr, ok when it is the node's own
// port or ENI or another of its instance's. The node's own holders
// unknown to the cloud, it is not compared.
func holderHop(cloud string, addr netip.Addr, held, node []cloudconfig.Holder) api.Hop {
	h := api.Hop{Where: api.HopCloud, What: fmt.Sprintf("%s: what holds %s", cloud, addr), State: api.HopOK}
	if len(held) == 0 {
		h.State = api.HopMissing
		h.Detail = fmt.Sprintf("%s lists no port or ENI holding %s: the network drops the pod's traffic", cloud, addr)
		h.Fix = "the node's agent keeps its pods' addresses on its own port or ENI and repairs them from the cloud at each start: restart vpcnid on the node, and see its log"
		return h
	}
	var hows, where []string
	mine := len(node) == 0
	for _, x := range held {
		hows = append(hows, x.How)
		where = append(where, cmp.Or(x.Instance, x.Resource))
		mine = mine || slices.ContainsFunc(node, func(n cloudconfig.Holder) bool {
			return n.Resource == x.Resource || n.Instance != "" && n.Instance == x.Instance
		})
	}
	h.What = fmt.Sprintf("%s: %s is %s", cloud, addr, strings.Join(hows, "; "))
	if len(held) == 1 && held[0].Instance != "" {
		h.What += " of instance " + held[0].Instance
	}
	if !mine {
		var nodes []string
		for _, n := range node {
			nodes = append(nodes, cmp.Or(n.Instance, n.Resource))
		}
		h.State = api.HopWrong
		h.Detail = fmt.Sprintf("it is held by %s, not by this node's %s", strings.Join(where, ", "), strings.Join(nodes, ", "))
		h.Fix = "the cloud delivers the pod's traffic to another instance: vpcnictl audit -cloud-config shows who holds what; delete the pod so that it starts with an address of its node's"
	}
	return h
}

// floatingIPHops: each floating IP pointing at addr, ok when it is the
// pod's (or unmarked), wrong when another pod's mark is on it.
func floatingIPHops(ctx context.Context, fips floatingip.Cloud, pod string, addr netip.Addr) ([]api.Hop, error) {
	all, err := fips.At(ctx, addr)
	if err != nil {
		return nil, err
	}
	var hops []api.Hop
	for _, f := range all {
		h := api.Hop{Where: api.HopCloud, What: fmt.Sprintf("floating IP %s -> %s (port %s)", f.Address, addr, f.PortID), State: api.HopOK}
		if f.Owner != "" && f.Owner != pod {
			h.State, h.Detail = api.HopWrong, "it is marked for pod "+f.Owner
			h.Fix = "vpcni-controller detaches a gone pod's floating IP; if " + f.Owner + " is gone, its leak collector releases it (vpcnictl audit shows it)"
		}
		hops = append(hops, h)
	}
	return hops, nil
}

// blockHops: the router's route to the block holding addr, by this node,
// and that block's pair on the node's VM port.
func blockHops(ctx context.Context, router routes.Cloud, routerID string, nodeIP, addr netip.Addr) ([]api.Hop, error) {
	rs, err := router.Routes(ctx)
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
		h := api.Hop{Where: api.HopCloud, What: fmt.Sprintf("router %s: route %s via %s", routerID, best.Destination, best.NextHop), State: api.HopOK}
		if best.NextHop != nodeIP {
			h.State, h.Detail, h.Fix = api.HopWrong, fmt.Sprintf("the next hop is %s, not this node's %s", best.NextHop, nodeIP), fix
		}
		return append([]api.Hop{h}, pairHop(ctx, router, nodeIP, best.Destination, fix)...), nil
	}
	return []api.Hop{{Where: api.HopCloud, What: fmt.Sprintf("router %s: a route to the block of %s", routerID, addr), State: api.HopMissing,
		Detail: fmt.Sprintf("router %s has no route to a block holding %s", routerID, addr), Fix: fix}}, nil
}

// pairHop: the block's pair on the node's VM port (port security lets the
// block's traffic through it).
func pairHop(ctx context.Context, router routes.Cloud, nodeIP netip.Addr, block netip.Prefix, fix string) []api.Hop {
	what := fmt.Sprintf("pair %s on the VM port of %s", block, nodeIP)
	port, err := router.PortByIP(ctx, nodeIP)
	if err != nil {
		return []api.Hop{{Where: api.HopCloud, What: what, State: api.HopWrong, Detail: fmt.Sprintf("cannot find the one VM port of %s: %v", nodeIP, err), Fix: fix}}
	}
	ok := slices.ContainsFunc(port.Pairs, func(ap routes.Pair) bool {
		p, err := netip.ParsePrefix(ap.Address)
		return err == nil && p.Masked() == block.Masked()
	})
	h := api.Hop{Where: api.HopCloud, What: what + " (port " + port.ID + ")", State: api.HopOK}
	if !ok {
		h.State, h.Detail, h.Fix = api.HopMissing, fmt.Sprintf("VM port %s does not allow %s", port.ID, block), fix
	}
	return []api.Hop{h}
}
