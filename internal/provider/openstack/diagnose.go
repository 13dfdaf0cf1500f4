package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/quotas"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider"
)

// Diagnose is the provider's provider.Doctor: it runs the start-up steps
// one by one, as New does — log in, read the subnet, find the VM port,
// check Neutron's policy for the mode — and then reads how much room the
// limits leave, changing nothing but what checkPolicy's no-op PUT changes
// (the port's revision). Its requests go through node.Transport. It
// returns the steps in order, each not passed with its fix; after a
// failed one the rest were not tried.
func Diagnose(ctx context.Context, cfg Config, node provider.DoctorNode) (steps []provider.Step) {
	defer func() {
		for i := range steps {
			steps[i].Fix = fix(steps[i], cfg.Mode, node.ConfigFile)
		}
	}()
	step := func(name, detail string, err error) bool {
		steps = append(steps, provider.Step{Name: name, Detail: detail, Err: err})
		return err == nil
	}
	login := "no Keystone: endpoint " + cfg.Endpoint
	if cfg.Endpoint == "" {
		login = "Keystone " + cfg.Auth.AuthURL + " accepted the credentials"
	}
	rt := node.Transport
	if node.Wrap != nil {
		base, err := cfg.roundTripper(nil)
		if !step("login", login, err) {
			return steps
		}
		rt = node.Wrap(base)
	}
	p, err := connect(ctx, cfg, rt)
	if !step("login", login, err) {
		return steps
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	if cfg.SubnetID != "" {
		networkID, err := p.readSubnet(ctx)
		if !step("subnet", fmt.Sprintf("Neutron answers; %s", p.SubnetSource()), err) {
			return steps
		}
		err = p.findPort(ctx, networkID, node.IP)
		if err == nil {
			err = p.findInstance()
		}
		if !step("port", fmt.Sprintf("VM port %s (by %s)", p.portID, cfg.PortLookup), err) {
			return steps
		}
	} else {
		// No subnetID: the VM port first, then the subnet of its address.
		err := p.findPort(ctx, "", node.IP)
		if err == nil {
			err = p.findInstance()
		}
		if !step("port", fmt.Sprintf("Neutron answers; VM port %s (by %s)", p.portID, cfg.PortLookup), err) {
			return steps
		}
		err = p.discoverSubnet(ctx)
		if !step("subnet", p.SubnetSource(), err) {
			return steps
		}
	}
	why, err := p.checkPolicy(ctx)
	if !step("policy", why, err) {
		return steps
	}
	if st, ok := p.ipv6Step(ctx); ok {
		steps = append(steps, st)
	}
	steps = append(steps, p.room())
	if p.cfg.Mode != "fixed-ips" || p.cfg.SecondaryNICs > 0 {
		steps = append(steps, p.portQuota(ctx))
	}
	return steps
}

// ipv6Step reports the IPv6 subnet pods would take addresses on —
// subnetIDv6, else those of the VM port's IPv6 fixed IPs — with its
// address modes and whether Neutron takes named fixed IPs there (no step
// for a node with neither). It warns when a configured subnetIDv6 is an
// auto-address one and modeV6 is not prefix-pair: vpcnid refuses it.
func (p *Provider) ipv6Step(ctx context.Context) (provider.Step, bool) {
	s := provider.Step{Name: "ipv6"}
	ids := []string{}
	if p.cfg.SubnetIDv6 != "" {
		ids = append(ids, p.cfg.SubnetIDv6)
	} else {
		for _, f := range p.port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && a.Is6() && f.SubnetID != "" && !slices.Contains(ids, f.SubnetID) {
				ids = append(ids, f.SubnetID)
			}
		}
	}
	if len(ids) == 0 {
		return s, false
	}
	var parts []string
	for _, id := range ids {
		sn, err := answered(subnets.Get(ctx, p.nc, id).Extract())
		if err != nil {
			s.Warn = true
			parts = append(parts, fmt.Sprintf("subnet %s: cannot read it (%v)", id, err))
			continue
		}
		named := "takes named fixed IPs (modeV6 fixed-ips)"
		if autoAddress(sn) != "" {
			named = "auto-address: Neutron refuses named fixed IPs there (modeV6 prefix-pair only)"
			if p.cfg.SubnetIDv6 != "" && p.cfg.ModeV6 != "prefix-pair" {
				s.Warn = true
			}
		}
		parts = append(parts, fmt.Sprintf("subnet %s (%s): ipv6_address_mode %q, ipv6_ra_mode %q: %s", sn.ID, sn.CIDR, sn.IPv6AddressMode, sn.IPv6RAMode, named))
	}
	how := "the VM port's IPv6 subnets"
	if p.cfg.SubnetIDv6 != "" {
		how = "subnetIDv6"
	}
	s.Detail = how + ": " + strings.Join(parts, "; ")
	return s, true
}

// portQuota reads how many ports the VM port's project may still create:
// the mode creates one per pod address (address-pairs' reservations,
// passthrough's NICs) or per secondary NIC. A quota these credentials may
// not read (or a Neutron without the quota details) is said, not failed.
func (p *Provider) portQuota(ctx context.Context) provider.Step {
	s := provider.Step{Name: "quota"}
	q, err := quotas.GetDetail(ctx, p.nc, p.port.ProjectID).Extract()
	if err != nil {
		s.Warn, s.Detail = true, fmt.Sprintf("cannot read the port quota of project %s (%v): mode %s creates ports against it", p.port.ProjectID, err, p.cfg.Mode)
		return s
	}
	used := q.Port.Used + q.Port.Reserved
	if q.Port.Limit < 0 {
		s.Detail = fmt.Sprintf("project %s: %d ports, no port quota", p.port.ProjectID, used)
		return s
	}
	s.Detail = fmt.Sprintf("project %s: %d of %d ports in its quota", p.port.ProjectID, used, q.Port.Limit)
	if used >= q.Port.Limit {
		s.Warn = true
		s.Detail += fmt.Sprintf(": mode %s can create no more", p.cfg.Mode)
	}
	return s
}

// room says how much of what bounds the node's addresses is used, from
// the VM port as last read.
func (p *Provider) room() provider.Step {
	s := provider.Step{Name: "limits"}
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

// fix says what to do about a step that failed or warns ("" for one that
// passed); configFile is the agent's config.
func fix(s provider.Step, mode, configFile string) string {
	switch {
	case s.Err == nil && !s.Warn:
		return ""
	case s.Err == nil && s.Name == "ipv6":
		return "set provider.openstack.subnetIDv6 in " + configFile + " to an IPv6 subnet whose ipv6_address_mode is dhcpv6-stateful or unset (and ipv6_ra_mode not slaac or dhcpv6-stateless), or modeV6: prefix-pair"
	case s.Err == nil && s.Name == "quota":
		return "ask the cloud's admin for a larger port quota (openstack quota set --ports), or let these credentials read it"
	case s.Err == nil:
		return "raise maxAddresses (fixed-ips) or maxAddressPairs (Neutron's max_allowed_address_pair) in " + configFile + ", or add nodes"
	case errors.Is(s.Err, provider.ErrUnavailable):
		return "check that this node reaches the cloud's endpoints (Keystone, Neutron): routes, DNS, security groups, proxies"
	}
	switch s.Name {
	case "login":
		return "check provider.openstack.auth or credentialsFile in " + configFile + ": an application credential with the member role in the VM port's project"
	case "subnet":
		return "check provider.openstack.subnetID in " + configFile + " (openstack subnet show); left empty, the VM port's own IPv4 subnet is used"
	case "port":
		return "set provider.openstack.nodeIP in " + configFile + " to this node's address on the pods' network, or portLookup: instance with instanceID (the Nova server)"
	case "policy":
		if mode != "passthrough" {
			return "use provider.openstack.mode: passthrough with datapath passthrough: it creates ports of its own and attaches them to the VM through Nova, which a member may do; or have the network's owner (or an admin) run vpcni's credentials"
		}
	}
	return "see the detail; vpcnid fails at start the same way"
}
