package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// FloatingIPs is pods' floating IPs (floatingip.Cloud) on Neutron. The
// owner and policy of each are in its description (floatingip.Mark).
//
// Each change is one Neutron call, so nothing is ever half applied: a new
// floating IP is created already associated (POST with port_id and
// fixed_ip_address), an existing one is associated and marked in one PUT.
//
// Neutron's policy the controller's credential needs: create_floatingip
// (and create_floatingip:floating_ip_address for a named address that does
// not exist yet — admin-only by default; allocate it beforehand instead),
// get_floatingip, update_floatingip, delete_floatingip, get_network (to
// find the external network by name), get_port (association reads it).
type FloatingIPs struct {
	NC      *gophercloud.ServiceClient
	Timeout time.Duration

	mu   sync.Mutex
	nets map[string]string // network name or ID -> ID
}

func (c *FloatingIPs) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.Timeout)
}

// NetworkID resolves an external network's name (or ID).
func (c *FloatingIPs) NetworkID(ctx context.Context, nameOrID string) (string, error) {
	c.mu.Lock()
	id, ok := c.nets[nameOrID]
	c.mu.Unlock()
	if ok {
		return id, nil
	}
	cc, cancel := c.call(ctx)
	defer cancel()
	if n, err := networks.Get(cc, c.NC, nameOrID).Extract(); err == nil {
		id = n.ID
	} else if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return "", fmt.Errorf("external network %q: %w", nameOrID, err)
	} else {
		pages, err := networks.List(c.NC, networks.ListOpts{Name: nameOrID}).AllPages(cc)
		if err != nil {
			return "", fmt.Errorf("external network %q: %w", nameOrID, err)
		}
		all, err := networks.ExtractNetworks(pages)
		if err != nil {
			return "", err
		}
		if len(all) != 1 {
			return "", fmt.Errorf("%w: %d networks are named %q (want exactly one; give its ID)", floatingip.ErrInvalid, len(all), nameOrID)
		}
		id = all[0].ID
	}
	c.mu.Lock()
	if c.nets == nil {
		c.nets = map[string]string{}
	}
	c.nets[nameOrID] = id
	c.mu.Unlock()
	return id, nil
}

// Owned implements floatingip.Cloud. The whole project's list is read and
// filtered here: Neutron filters a description only by equality, and the
// mark's policy part varies.
func (c *FloatingIPs) Owned(ctx context.Context, owner string) ([]floatingip.FIP, error) {
	return c.list(ctx, floatingips.ListOpts{}, func(f floatingip.FIP) bool { return f.Owner != "" && (owner == "" || f.Owner == owner) })
}

// At implements floatingip.Cloud. A cloud without the L3 extension (404)
// has no floating IPs.
func (c *FloatingIPs) At(ctx context.Context, addr netip.Addr) ([]floatingip.FIP, error) {
	fips, err := c.list(ctx, floatingips.ListOpts{FixedIP: addr.String()}, func(f floatingip.FIP) bool { return f.FixedIP == addr.String() && f.PortID != "" })
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return nil, nil
	}
	return fips, err
}

func (c *FloatingIPs) list(ctx context.Context, opts floatingips.ListOpts, keep func(floatingip.FIP) bool) ([]floatingip.FIP, error) {
	cc, cancel := c.call(ctx)
	defer cancel()
	pages, err := floatingips.List(c.NC, opts).AllPages(cc)
	if err != nil {
		return nil, fmt.Errorf("list floating IPs: %w", err)
	}
	all, err := floatingips.ExtractFloatingIPs(pages)
	if err != nil {
		return nil, err
	}
	var out []floatingip.FIP
	for _, f := range all {
		x := floatingip.FIP{ID: f.ID, Address: f.FloatingIP, Network: f.FloatingNetworkID, PortID: f.PortID, FixedIP: f.FixedIP}
		x.Owner, x.Policy, _ = floatingip.ParseMark(f.Description)
		if keep(x) {
			out = append(out, x)
		}
	}
	return out, nil
}

// Ensure implements floatingip.Cloud, changing at most one floating IP,
// in one call.
func (c *FloatingIPs) Ensure(ctx context.Context, w floatingip.Want) (floatingip.FIP, error) {
	netID, err := c.NetworkID(ctx, w.Network)
	if err != nil {
		return floatingip.FIP{}, err
	}
	owned, err := c.Owned(ctx, w.Owner)
	if err != nil {
		return floatingip.FIP{}, err
	}
	var mine *floatingip.FIP
	for i, f := range owned {
		if f.Network == netID && (!w.Address.IsValid() || f.Address == w.Address.String()) {
			mine = &owned[i]
			break
		}
	}
	if mine == nil && w.Address.IsValid() {
		named, err := c.list(ctx, floatingips.ListOpts{FloatingIP: w.Address.String(), FloatingNetworkID: netID}, func(floatingip.FIP) bool { return true })
		if err != nil {
			return floatingip.FIP{}, err
		}
		if len(named) == 1 {
			f := named[0]
			if f.Owner != "" && f.Owner != w.Owner || f.Owner == "" && f.PortID != "" {
				who := f.Owner
				if who == "" {
					who = "port " + f.PortID
				}
				return floatingip.FIP{}, fmt.Errorf("%w: floating IP %s is in use by %s", floatingip.ErrInvalid, f.Address, who)
			}
			mine = &f
		}
	}
	port, err := c.portOf(ctx, w.PortID, w.FixedIP)
	if err != nil {
		return floatingip.FIP{}, err
	}
	mark := floatingip.Mark(w.Owner, w.Policy)
	fixed := w.FixedIP.String()
	if mine != nil {
		if mine.PortID == port && mine.FixedIP == fixed && mine.Owner == w.Owner && mine.Policy == w.Policy {
			return *mine, nil
		}
		cc, cancel := c.call(ctx)
		defer cancel()
		f, err := floatingips.Update(cc, c.NC, mine.ID, floatingips.UpdateOpts{PortID: &port, FixedIP: fixed, Description: &mark}).Extract()
		if err != nil {
			return floatingip.FIP{}, classify(fmt.Errorf("associate floating IP %s with %s on port %s: %w", mine.Address, fixed, port, err))
		}
		return floatingip.FIP{ID: f.ID, Address: f.FloatingIP, Network: f.FloatingNetworkID, PortID: f.PortID, FixedIP: f.FixedIP, Owner: w.Owner, Policy: w.Policy}, nil
	}
	opts := floatingips.CreateOpts{FloatingNetworkID: netID, PortID: port, FixedIP: fixed, Description: mark}
	what := "a floating IP"
	if w.Address.IsValid() {
		opts.FloatingIP = w.Address.String()
		what = "floating IP " + opts.FloatingIP
	}
	cc, cancel := c.call(ctx)
	defer cancel()
	f, err := floatingips.Create(cc, c.NC, opts).Extract()
	if err != nil {
		return floatingip.FIP{}, classify(fmt.Errorf("create %s on network %s for %s on port %s: %w", what, w.Network, fixed, port, err))
	}
	return floatingip.FIP{ID: f.ID, Address: f.FloatingIP, Network: f.FloatingNetworkID, PortID: f.PortID, FixedIP: f.FixedIP, Owner: w.Owner, Policy: w.Policy}, nil
}

// portOf is the port that holds fixed as a fixed IP: the node's VM port
// the PodAddress names (fixed-ips mode), or, when it only allows the
// address, the port that reserves it (address-pairs mode: device_id is the
// VM port) or another NIC of the same VM (secondary NICs). Neutron
// associates a floating IP only with a fixed IP of a port.
func (c *FloatingIPs) portOf(ctx context.Context, portID string, fixed netip.Addr) (string, error) {
	cc, cancel := c.call(ctx)
	defer cancel()
	vm, err := ports.Get(cc, c.NC, portID).Extract()
	if err != nil {
		return "", fmt.Errorf("port %s: %w", portID, err)
	}
	for _, f := range vm.FixedIPs {
		if f.IPAddress == fixed.String() {
			return portID, nil
		}
	}
	pages, err := ports.List(c.NC, ports.ListOpts{NetworkID: vm.NetworkID, FixedIPs: []ports.FixedIPOpts{{IPAddress: fixed.String()}}}).AllPages(cc)
	if err != nil {
		return "", fmt.Errorf("the port holding %s: %w", fixed, err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return "", err
	}
	for _, p := range all {
		if p.DeviceID == portID || vm.DeviceID != "" && p.DeviceID == vm.DeviceID {
			return p.ID, nil
		}
	}
	// Not (yet) on the node's ports: the agent may still be adding it.
	return "", fmt.Errorf("no port of node port %s's VM holds %s as a fixed IP (yet)", portID, fixed)
}

// classify marks Neutron's refusals of the request itself (400, 404 of the
// network, 409 address taken) as floatingip.ErrInvalid: retrying cannot
// help, the annotation must change.
func classify(err error) error {
	if d, ok := openstack.DeniedBy(err); ok {
		return fmt.Errorf("%w; %s", err, d.Error())
	}
	for _, code := range []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict} {
		if gophercloud.ResponseCodeIs(err, code) {
			return fmt.Errorf("%w: %w", floatingip.ErrInvalid, err)
		}
	}
	return err
}

// Detach implements floatingip.Cloud: each detach is its own call, before
// any delete.
func (c *FloatingIPs) Detach(ctx context.Context, owner string, keep func(floatingip.FIP) bool) ([]floatingip.FIP, error) {
	owned, err := c.Owned(ctx, owner)
	if err != nil {
		return nil, err
	}
	var done []floatingip.FIP
	var errs []error
	for _, f := range owned {
		if keep != nil && keep(f) || f.PortID == "" && f.Policy == floatingip.Retain {
			continue // wanted, or already detached and kept
		}
		if f.PortID != "" {
			// The detach is its own call, before any delete: it is what
			// must happen before the address leaves the port, and the
			// node's agent holds the address until it has.
			cc, cancel := c.call(ctx)
			_, err := floatingips.Update(cc, c.NC, f.ID, floatingips.UpdateOpts{PortID: new(string)}).Extract()
			cancel()
			if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
				errs = append(errs, fmt.Errorf("detach floating IP %s: %w", f.Address, err))
				continue
			}
		}
		if f.Policy != floatingip.Retain {
			cc, cancel := c.call(ctx)
			err := floatingips.Delete(cc, c.NC, f.ID).ExtractErr()
			cancel()
			if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
				errs = append(errs, fmt.Errorf("release floating IP %s: %w", f.Address, err))
				continue
			}
		}
		done = append(done, f)
	}
	return done, errors.Join(errs...)
}
