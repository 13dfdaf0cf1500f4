package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
)

// TakeOff removes pod addresses from another node's VM port, as that
// node's own Release would: only addresses vpcni marked there, the fixed
// IPs and the marks in one PUT with If-Match on the port's
// revision, retried on a conflict. vpcni-controller uses it to free a
// StatefulSet pod's reserved address from a dead node, so the node its
// pod starts on next can take it; the dead node, if it returns, finds the
// address gone from its port and no longer claims it.
func TakeOff(ctx context.Context, cfg Config, portID string, addrs []netip.Addr) error {
	if cfg.Mode != "fixed-ips" {
		// address-pairs keeps reservation ports per node and passthrough a
		// NIC per pod: neither is taken over yet.
		return fmt.Errorf("mode %s: taking a pod's address off a dead node is built for mode fixed-ips only", cfg.Mode)
	}
	rt, err := cfg.roundTripper(nil)
	if err != nil {
		return err
	}
	calls := &callCounter{next: rt}
	nc, _, err := clients(ctx, cfg, calls)
	if err != nil {
		return err
	}
	return takeOff(ctx, nc, calls, cfg, portID, addrs)
}

// TakeOffWith is TakeOff through a Neutron client the caller already has
// (vpcni-controller's leak collector, releasing the marked fixed IPs of a
// port whose node is gone). The addresses being marked is what makes
// them vpcni's, whatever the mode the config names.
func TakeOffWith(ctx context.Context, nc *gophercloud.ServiceClient, cfg Config, portID string, addrs []netip.Addr) error {
	cfg.Mode = "fixed-ips"
	return takeOff(ctx, nc, &callCounter{}, cfg, portID, addrs)
}

func takeOff(ctx context.Context, nc *gophercloud.ServiceClient, calls *callCounter, cfg Config, portID string, addrs []netip.Addr) error {
	p := &Provider{nc: nc, cfg: cfg, calls: calls, portID: portID}
	c, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	sn, err := answered(subnets.Get(c, nc, cfg.SubnetID).Extract())
	cancel()
	if err != nil {
		return explain(fmt.Errorf("subnet %s: %w", cfg.SubnetID, err))
	}
	if p.subnet, err = netip.ParsePrefix(sn.CIDR); err != nil || !p.subnet.Addr().Is4() {
		return fmt.Errorf("subnet %s has CIDR %q: vpcni needs an IPv4 subnet", cfg.SubnetID, sn.CIDR)
	}
	p.used = map[netip.Addr]bool{}
	p.mu.Lock()
	defer p.mu.Unlock()
	v4, v6 := byFamily(addrs)
	var err4, err6 error
	if len(v4) > 0 {
		err4 = p.releaseFixed(ctx, v4)
	}
	if len(v6) > 0 {
		if err6 = p.takeOffSideV6(ctx, v6); err6 == nil && p.v6 != nil {
			err6 = p.releaseV6(ctx, v6)
		}
	}
	return errors.Join(err4, err6)
}

// takeOffSideV6 readies the IPv6 side (p.v6) for taking v6 off the port.
// Its subnet is that of the port's fixed IPs holding them — subnetIDv6
// may be unset, the node having found its subnet itself — and a node's
// IPv6 pod addresses are all on one. None of them on the port leaves
// p.v6 nil: nothing is held in Neutron, and a mark left for an address
// the port no longer has holds nothing either.
func (p *Provider) takeOffSideV6(ctx context.Context, v6 []netip.Addr) error {
	if err := p.refresh(ctx); err != nil {
		return err
	}
	subnetID := ""
	for _, f := range p.port.FixedIPs {
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil || !slices.Contains(v6, a) {
			continue
		}
		if subnetID != "" && f.SubnetID != subnetID {
			return fmt.Errorf("port %s holds %v on two IPv6 subnets (%s, %s): a node's IPv6 pod addresses are on one; take them off by hand", p.portID, v6, subnetID, f.SubnetID)
		}
		subnetID = f.SubnetID
	}
	if subnetID == "" {
		return nil
	}
	q := &Provider{nc: p.nc, cfg: p.cfg, calls: p.calls, portID: p.portID, parent: p, used: map[netip.Addr]bool{}}
	q.cfg.SubnetID = subnetID
	c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	sn, err := answered(subnets.Get(c, p.nc, subnetID).Extract())
	cancel()
	if err != nil {
		return explain(fmt.Errorf("IPv6 subnet %s of port %s: %w", subnetID, p.portID, err))
	}
	if q.subnet, err = netip.ParsePrefix(sn.CIDR); err != nil || !q.subnet.Addr().Is6() {
		return fmt.Errorf("subnet %s has CIDR %q: the addresses %v are IPv6", subnetID, sn.CIDR, v6)
	}
	q.subnet = q.subnet.Masked()
	p.v6 = q
	return nil
}
