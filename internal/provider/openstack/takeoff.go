package openstack

import (
	"context"
	"fmt"
	"net/netip"

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
	return p.releaseFixed(ctx, addrs)
}
