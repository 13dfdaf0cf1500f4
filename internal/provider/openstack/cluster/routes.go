package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/routes"
)

// Routes is the routed pod subnet's cloud (routes.Cloud) on Neutron: the
// router's extra routes, changed only with the atomic
// add_extraroutes/remove_extraroutes (never a PUT of the whole list,
// which would race other writers), and a VM port's allowed address
// pairs, written under If-Match.
type Routes struct {
	nc       *gophercloud.ServiceClient
	routerID string
	subnetID string
	maxPairs int
}

// NewRoutes uses nc for routerID; subnetID, if set, narrows the lookup of
// a node's VM port to ports with the node's address on that subnet.
// maxPairs is Neutron's max_allowed_address_pair (the openstack section's
// maxAddressPairs).
func NewRoutes(nc *gophercloud.ServiceClient, routerID, subnetID string, maxPairs int) *Routes {
	return &Routes{nc: nc, routerID: routerID, subnetID: subnetID, maxPairs: maxPairs}
}

// MaxPairs implements routes.Cloud.
func (n *Routes) MaxPairs() int { return n.maxPairs }

func toPort(p *ports.Port) routes.Port {
	out := routes.Port{ID: p.ID, Revision: p.RevisionNumber}
	for _, ap := range p.AllowedAddressPairs {
		out.Pairs = append(out.Pairs, routes.Pair{Address: ap.IPAddress, MAC: ap.MACAddress})
	}
	return out
}

// Routes implements routes.Cloud: the router's extra routes. A route
// Neutron holds that does not parse (it validates them, so never seen)
// is an error: the budget would be miscounted.
func (n *Routes) Routes(ctx context.Context) ([]routes.Route, error) {
	r, err := routers.Get(ctx, n.nc, n.routerID).Extract()
	if err != nil {
		return nil, explain(fmt.Errorf("read router %s: %w", n.routerID, err))
	}
	out := make([]routes.Route, 0, len(r.Routes))
	for _, rt := range r.Routes {
		d, err1 := netip.ParsePrefix(rt.DestinationCIDR)
		h, err2 := netip.ParseAddr(rt.NextHop)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("router %s holds a route vpcni cannot read (%s via %s): %w", n.routerID, rt.DestinationCIDR, rt.NextHop, err)
		}
		out = append(out, routes.Route{Destination: d, NextHop: h})
	}
	return out, nil
}

func toNeutron(rs []routes.Route) *[]routers.Route {
	out := make([]routers.Route, len(rs))
	for i, r := range rs {
		out[i] = routers.Route{DestinationCIDR: r.Destination.String(), NextHop: r.NextHop.String()}
	}
	return &out
}

// AddRoutes implements routes.Cloud: one atomic request, all of them or
// none. When the router has no room, the error is a
// *routes.ExhaustedError with the limit Neutron named.
func (n *Routes) AddRoutes(ctx context.Context, rs []routes.Route) error {
	if len(rs) == 0 {
		return nil
	}
	_, err := extraroutes.Add(ctx, n.nc, n.routerID, extraroutes.Opts{Routes: toNeutron(rs)}).Extract()
	if err != nil {
		if max, ok := routesExhausted(err); ok {
			return &routes.ExhaustedError{Max: max, Err: err}
		}
		return explain(fmt.Errorf("add %d routes to router %s: %w", len(rs), n.routerID, err))
	}
	return nil
}

// RemoveRoutes implements routes.Cloud: one atomic request (routes not
// there are no error).
func (n *Routes) RemoveRoutes(ctx context.Context, rs []routes.Route) error {
	if len(rs) == 0 {
		return nil
	}
	_, err := extraroutes.Remove(ctx, n.nc, n.routerID, extraroutes.Opts{Routes: toNeutron(rs)}).Extract()
	if err != nil {
		return explain(fmt.Errorf("remove %d routes from router %s: %w", len(rs), n.routerID, err))
	}
	return nil
}

// PortByIP implements routes.Cloud: the VM port holding ip as a fixed IP,
// on the VM subnet for an IPv4 address; a dual-stack node's IPv6 address
// is on another subnet of its port, and is looked up on any.
func (n *Routes) PortByIP(ctx context.Context, ip netip.Addr) (routes.Port, error) {
	subnetID := n.subnetID
	if ip.Is6() {
		subnetID = ""
	}
	pages, err := ports.List(n.nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: ip.String(), SubnetID: subnetID}}}).AllPages(ctx)
	if err != nil {
		return routes.Port{}, explain(fmt.Errorf("find the VM port of %s: %w", ip, err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return routes.Port{}, err
	}
	switch len(all) {
	case 0:
		return routes.Port{}, fmt.Errorf("%s: %w", ip, routes.ErrNoPort)
	case 1:
		return toPort(&all[0]), nil
	}
	return routes.Port{}, fmt.Errorf("%d ports have %s: set openstack.subnetID to the VM subnet", len(all), ip)
}

// PortsByIP implements routes.Cloud: with a subnet, one list of that
// subnet's ports (a pass over hundreds of nodes every resync stays one
// call); without, one lookup per address. An address no port has maps to
// an ErrNoPort error, as does one several ports have (ambiguous).
func (n *Routes) PortsByIP(ctx context.Context, ips []netip.Addr) (map[netip.Addr]routes.Port, map[netip.Addr]error, error) {
	found, missing := map[netip.Addr]routes.Port{}, map[netip.Addr]error{}
	if n.subnetID == "" {
		for _, ip := range ips {
			p, err := n.PortByIP(ctx, ip)
			switch {
			case errors.Is(err, routes.ErrNoPort):
				missing[ip] = err
			case err != nil:
				return nil, nil, err
			default:
				found[ip] = p
			}
		}
		return found, missing, nil
	}
	pages, err := ports.List(n.nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{SubnetID: n.subnetID}}}).AllPages(ctx)
	if err != nil {
		return nil, nil, explain(fmt.Errorf("list the ports of subnet %s: %w", n.subnetID, err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, nil, err
	}
	// Every fixed IP of those ports: a dual-stack node's IPv6 address is
	// on another subnet of its port, and the next hop of its IPv6 blocks.
	holders := map[netip.Addr][]ports.Port{}
	for _, p := range all {
		for _, f := range p.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				holders[a] = append(holders[a], p)
			}
		}
	}
	for _, ip := range ips {
		switch h := holders[ip]; len(h) {
		case 0:
			missing[ip] = fmt.Errorf("%s on the ports of subnet %s: %w", ip, n.subnetID, routes.ErrNoPort)
		case 1:
			found[ip] = toPort(&h[0])
		default:
			missing[ip] = fmt.Errorf("%d ports hold %s: %w", len(h), ip, routes.ErrNoPort)
		}
	}
	return found, missing, nil
}

// SetPairs implements routes.Cloud: the port's whole pair list under
// If-Match on revision; a 412 (another writer first) is a routes.ErrStale
// error, for a fresh read.
func (n *Routes) SetPairs(ctx context.Context, portID string, revision int, pairs []routes.Pair) (routes.Port, error) {
	list := make([]ports.AddressPair, 0, len(pairs))
	for _, ap := range pairs {
		list = append(list, ports.AddressPair{IPAddress: ap.Address, MACAddress: ap.MAC})
	}
	p, err := ports.Update(ctx, n.nc, portID, ports.UpdateOpts{AllowedAddressPairs: &list, RevisionNumber: &revision}).Extract()
	if isStale(err) {
		return routes.Port{}, fmt.Errorf("allowed address pairs of VM port %s: %w (%w)", portID, routes.ErrStale, err)
	}
	if err != nil {
		return routes.Port{}, explain(fmt.Errorf("allowed address pairs of VM port %s: %w", portID, err))
	}
	return toPort(p), nil
}

// "Unable to complete operation for <router>. The number of routes
// exceeds the maximum 30." (neutron/extensions/l3.py RoutesExhausted).
var maxRe = regexp.MustCompile(`exceeds the maximum (\d+)`)

func routesExhausted(err error) (int, bool) {
	body, ok := neutronError(err, http.StatusBadRequest)
	if !ok || body.Type != "RoutesExhausted" {
		return 0, false
	}
	m := maxRe.FindStringSubmatch(body.Message)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

type neutronErr struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func neutronError(err error, status int) (neutronErr, bool) {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) || code.Actual != status {
		return neutronErr{}, false
	}
	var body struct {
		NeutronError neutronErr `json:"NeutronError"`
	}
	if json.Unmarshal(code.Body, &body) != nil {
		return neutronErr{}, false
	}
	return body.NeutronError, true
}

// isStale: a 412, the port changed since it was read.
func isStale(err error) bool {
	var code gophercloud.ErrUnexpectedResponseCode
	return errors.As(err, &code) && code.Actual == http.StatusPreconditionFailed
}

// explain says what to do about a refusal of Neutron's policy.
func explain(err error) error {
	if d, ok := openstack.DeniedBy(err); ok {
		return fmt.Errorf("%w; %s (vpcni-controller needs get_router, add_extraroutes and remove_extraroutes on the router (a member of its project) and update_port:allowed_address_pairs on the nodes' VM ports (the owner of their network, or admin))", err, d.Error())
	}
	return err
}
