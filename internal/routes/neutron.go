package routes

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
)

// Port is a node's VM port as far as pairs go.
type Port struct {
	ID       string
	Revision int
	Pairs    []ports.AddressPair
}

// Neutron is the part of Neutron the reconciler uses, shaped like the
// API: the router's routes, changed only with the atomic
// add_extraroutes/remove_extraroutes (never a PUT of the whole list,
// which would race other writers), and a VM port's pairs, written under
// If-Match.
type Neutron struct {
	nc       *gophercloud.ServiceClient
	routerID string
	subnetID string
}

// NewNeutron uses nc for routerID; subnetID, if set, narrows the lookup of
// a node's VM port to ports with the node's address on that subnet.
func NewNeutron(nc *gophercloud.ServiceClient, routerID, subnetID string) *Neutron {
	return &Neutron{nc: nc, routerID: routerID, subnetID: subnetID}
}

// Routes reads the router's extra routes. A route Neutron holds that does
// not parse (it validates them, so never seen) is an error: the budget
// would be miscounted.
func (n *Neutron) Routes(ctx context.Context) ([]Route, error) {
	r, err := routers.Get(ctx, n.nc, n.routerID).Extract()
	if err != nil {
		return nil, explain(fmt.Errorf("read router %s: %w", n.routerID, err))
	}
	out := make([]Route, 0, len(r.Routes))
	for _, rt := range r.Routes {
		d, err1 := netip.ParsePrefix(rt.DestinationCIDR)
		h, err2 := netip.ParseAddr(rt.NextHop)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("router %s holds a route vpcni cannot read (%s via %s): %w", n.routerID, rt.DestinationCIDR, rt.NextHop, err)
		}
		out = append(out, Route{d, h})
	}
	return out, nil
}

func toNeutron(rs []Route) *[]routers.Route {
	out := make([]routers.Route, len(rs))
	for i, r := range rs {
		out[i] = routers.Route{DestinationCIDR: r.Destination.String(), NextHop: r.NextHop.String()}
	}
	return &out
}

// AddRoutes adds routes in one atomic request: all of them or none. When
// the router has no room, the error is a *ExhaustedError with the limit
// Neutron named.
func (n *Neutron) AddRoutes(ctx context.Context, rs []Route) error {
	if len(rs) == 0 {
		return nil
	}
	_, err := extraroutes.Add(ctx, n.nc, n.routerID, extraroutes.Opts{Routes: toNeutron(rs)}).Extract()
	if err != nil {
		if max, ok := routesExhausted(err); ok {
			return &ExhaustedError{Max: max, Err: err}
		}
		return explain(fmt.Errorf("add %d routes to router %s: %w", len(rs), n.routerID, err))
	}
	return nil
}

// RemoveRoutes removes routes in one atomic request (ones not there are
// no error).
func (n *Neutron) RemoveRoutes(ctx context.Context, rs []Route) error {
	if len(rs) == 0 {
		return nil
	}
	_, err := extraroutes.Remove(ctx, n.nc, n.routerID, extraroutes.Opts{Routes: toNeutron(rs)}).Extract()
	if err != nil {
		return explain(fmt.Errorf("remove %d routes from router %s: %w", len(rs), n.routerID, err))
	}
	return nil
}

// ErrNoPort: no VM port has the node's address.
var ErrNoPort = errors.New("no Neutron port has the node's address")

// PortByIP finds the VM port holding ip as a fixed IP.
func (n *Neutron) PortByIP(ctx context.Context, ip netip.Addr) (Port, error) {
	pages, err := ports.List(n.nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: ip.String(), SubnetID: n.subnetID}}}).AllPages(ctx)
	if err != nil {
		return Port{}, explain(fmt.Errorf("find the VM port of %s: %w", ip, err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return Port{}, err
	}
	switch len(all) {
	case 0:
		return Port{}, fmt.Errorf("%s: %w", ip, ErrNoPort)
	case 1:
		return Port{ID: all[0].ID, Revision: all[0].RevisionNumber, Pairs: all[0].AllowedAddressPairs}, nil
	}
	return Port{}, fmt.Errorf("%d ports have %s: set routes.subnetID to the VM subnet", len(all), ip)
}

// PortsByIP finds the VM ports of ips: with a subnet, one list of that
// subnet's ports (a pass over hundreds of nodes every resync stays one
// call); without, one lookup per address. An address no port has maps to
// an ErrNoPort error, as does one several ports have (ambiguous).
func (n *Neutron) PortsByIP(ctx context.Context, ips []netip.Addr) (map[netip.Addr]Port, map[netip.Addr]error, error) {
	found, missing := map[netip.Addr]Port{}, map[netip.Addr]error{}
	if n.subnetID == "" {
		for _, ip := range ips {
			p, err := n.PortByIP(ctx, ip)
			switch {
			case errors.Is(err, ErrNoPort):
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
	holders := map[netip.Addr][]ports.Port{}
	for _, p := range all {
		for _, f := range p.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == n.subnetID {
				holders[a] = append(holders[a], p)
			}
		}
	}
	for _, ip := range ips {
		switch h := holders[ip]; len(h) {
		case 0:
			missing[ip] = fmt.Errorf("%s on subnet %s: %w", ip, n.subnetID, ErrNoPort)
		case 1:
			found[ip] = Port{ID: h[0].ID, Revision: h[0].RevisionNumber, Pairs: h[0].AllowedAddressPairs}
		default:
			missing[ip] = fmt.Errorf("%d ports hold %s: %w", len(h), ip, ErrNoPort)
		}
	}
	return found, missing, nil
}

// SetPairs writes a port's whole pair list under If-Match on revision and
// returns the port as written: a 412 (another writer first) comes back
// as is, for a fresh read.
func (n *Neutron) SetPairs(ctx context.Context, portID string, revision int, pairs []ports.AddressPair) (Port, error) {
	if pairs == nil {
		pairs = []ports.AddressPair{}
	}
	p, err := ports.Update(ctx, n.nc, portID, ports.UpdateOpts{AllowedAddressPairs: &pairs, RevisionNumber: &revision}).Extract()
	if err != nil {
		return Port{}, explain(fmt.Errorf("allowed address pairs of VM port %s: %w", portID, err))
	}
	return Port{ID: p.ID, Revision: p.RevisionNumber, Pairs: p.AllowedAddressPairs}, nil
}

// ExhaustedError is Neutron's 400 RoutesExhausted: the router's limit.
type ExhaustedError struct {
	Max int
	Err error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("the router holds at most %d routes (max_routes): %v", e.Max, e.Err)
}
func (e *ExhaustedError) Unwrap() error { return e.Err }

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
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) && code.Actual == http.StatusForbidden {
		return fmt.Errorf("%w (Neutron's policy forbids it: vpcni-controller needs get_router, add_extraroutes and remove_extraroutes on the router (a member of its project) and update_port:allowed_address_pairs on the nodes' VM ports (the owner of their network, or admin))", err)
	}
	return err
}
