package openstack

import (
	"context"
	"fmt"
	"net/http"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
)

// checkPolicy refuses, at start, a mode Neutron's policy will not let this
// project use, rather than failing on the first pod. Under Neutron's
// default policy update_port:fixed_ips and update_port:allowed_address_pairs
// need the network's owner (or admin): on a shared network another project
// owns — a common provider network — a member may do neither, but may
// create ports there and attach them to its own VM, which is what
// passthrough does. Only when the network's project is not the VM port's
// does the provider ask: a no-op PUT of the port's own fixed IPs or pairs
// (the cloud's real policy, not an assumption about it). It says why the
// mode may work, for vpcnictl doctor.
func (p *Provider) checkPolicy(ctx context.Context) (why string, err error) {
	if p.cfg.Mode == "passthrough" {
		return "mode passthrough creates ports of its own and changes nothing on the VM port", nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	n, err := answered(networks.Get(ctx, p.nc, p.port.NetworkID).Extract())
	if err != nil {
		return "", explain(fmt.Errorf("read network %s: %w", p.port.NetworkID, err))
	}
	if n.ProjectID == "" || n.ProjectID == p.port.ProjectID {
		return fmt.Sprintf("network %s belongs to the VM port's project: mode %s may change the port", n.ID, p.cfg.Mode), nil
	}
	opts := ports.UpdateOpts{FixedIPs: p.port.FixedIPs}
	rule := "update_port:fixed_ips"
	if p.cfg.Mode == "address-pairs" {
		pairs := p.port.AllowedAddressPairs
		if pairs == nil {
			pairs = []ports.AddressPair{}
		}
		opts, rule = ports.UpdateOpts{AllowedAddressPairs: &pairs}, "update_port:allowed_address_pairs"
	}
	rev := p.port.RevisionNumber
	opts.RevisionNumber = &rev
	_, err = ports.Update(ctx, p.nc, p.portID, opts).Extract()
	switch {
	case err == nil, gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed):
		// Allowed (a 412 got past the policy check to the revision check).
		p.port = nil // the no-op bumped the revision
		return fmt.Sprintf("network %s is project %s's, and Neutron's policy (%s) lets these credentials change VM port %s", n.ID, n.ProjectID, rule, p.portID), p.refresh(ctx)
	case gophercloud.ResponseCodeIs(err, http.StatusForbidden):
		if d, ok := DeniedBy(err); ok && len(d.Rules) > 0 {
			rule = d.Rule() // what the cloud's policy named, over the default's
			err = fmt.Errorf("%w; %s", err, d.Error())
		}
		shared := ""
		if n.Shared {
			shared = " shared"
		}
		return "", fmt.Errorf("mode %s cannot work here: network %s is a%s network of project %s, not of the VM port's project %s, "+
			"and Neutron's policy (%s) lets only the network's owner or an admin change VM port %s; "+
			"use mode: passthrough, which creates ports of its own on the network and attaches them to the VM through Nova (what a member may do): %w",
			p.cfg.Mode, n.ID, shared, n.ProjectID, p.port.ProjectID, rule, p.portID, err)
	default:
		return "", explain(fmt.Errorf("check Neutron's policy on VM port %s: %w", p.portID, err))
	}
}
