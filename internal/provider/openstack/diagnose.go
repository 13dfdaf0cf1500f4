package openstack

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
)

// Step is one stage of what the provider does at start, as vpcnictl
// doctor reports it: its name, what it found, and its error (nil: passed).
type Step struct {
	Name   string
	Detail string
	Err    error
	// Warn: passed, but something needs a look (no room left).
	Warn bool
}

// Diagnose runs the provider's start-up steps one by one, as New does —
// log in, read the subnet, find the VM port, check Neutron's policy for
// the mode — and then reads how much room the limits leave, changing
// nothing but what checkPolicy's no-op PUT changes (the port's revision).
// Its requests go through rt. It returns the steps in order; after a
// failed one the rest were not tried.
func Diagnose(ctx context.Context, cfg Config, nodeIP netip.Addr, rt http.RoundTripper) (steps []Step) {
	step := func(name, detail string, err error) bool {
		steps = append(steps, Step{Name: name, Detail: detail, Err: err})
		return err == nil
	}
	login := "no Keystone: endpoint " + cfg.Endpoint
	if cfg.Endpoint == "" {
		login = "Keystone " + cfg.Auth.AuthURL + " accepted the credentials"
	}
	p, err := connect(ctx, cfg, rt)
	if !step("login", login, err) {
		return steps
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	networkID, err := p.readSubnet(ctx)
	if !step("subnet", fmt.Sprintf("Neutron answers; subnet %s is %s", cfg.SubnetID, p.subnet), err) {
		return steps
	}
	err = p.findPort(ctx, networkID, nodeIP)
	if err == nil {
		err = p.findInstance()
	}
	if !step("port", fmt.Sprintf("VM port %s (by %s)", p.portID, cfg.PortLookup), err) {
		return steps
	}
	why, err := p.checkPolicy(ctx)
	if !step("policy", why, err) {
		return steps
	}
	return append(steps, p.room())
}

// room says how much of what bounds the node's addresses is used, from
// the VM port as last read.
func (p *Provider) room() Step {
	s := Step{Name: "limits"}
	info := p.Info()
	used, limit := 0, 0
	switch {
	case p.cfg.Mode == "address-pairs":
		// Every pair counts against Neutron's limit, vpcni's or not.
		used, limit = len(p.port.AllowedAddressPairs), p.cfg.MaxAddressPairs
		s.Detail = fmt.Sprintf("%d of %d allowed address pairs on VM port %s (maxAddressPairs)", used, limit, p.portID)
	case p.cfg.Mode == "passthrough":
		s.Detail = fmt.Sprintf("up to %d pods: %s", info.Capacity, info.CapacityReason)
		return s
	default:
		_, marked, on, err := p.state()
		if err != nil {
			s.Err = err
			return s
		}
		for a := range marked {
			if on[a] {
				used++
			}
		}
		why := info.CapacityReason
		limit = info.Capacity
		if p.cfg.SecondaryNICs > 0 {
			// Only the VM port's share is counted here; the rest spills
			// onto secondary NICs.
			limit, why = min(p.cfg.MaxAddresses, marksFit(p.subnet)), "maxAddresses on the VM port, then secondary NICs"
		}
		s.Detail = fmt.Sprintf("%d of %d pod addresses on VM port %s (%d fixed IPs in all; bound: %s)", used, limit, p.portID, len(p.port.FixedIPs), why)
	}
	if used >= limit {
		s.Warn = true
		s.Detail += ": no room for another pod address on this node"
	}
	return s
}
