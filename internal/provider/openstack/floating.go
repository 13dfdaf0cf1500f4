package openstack

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
)

// withFloatingIPs keeps back, of the addresses about to leave a port, those
// a floating IP still points at: Neutron does not detach a floating IP
// when its fixed IP leaves a port that stays (only when the port is
// deleted), and the L3 agent keeps its DNAT to the address — which would
// reach whichever pod or VM gets the address next. vpcni-controller
// detaches a pod's floating IP when the pod goes; until it has, the agent
// keeps the address on the port and retries (requested addresses every
// tick; a surplus address stays in the pool). The check is one list call
// per port; the agent's credential needs get_floatingip (a project
// member's by default). A Neutron without the L3 extension (404) has no
// floating IPs; a policy that hides them (403) cannot be checked, and the
// release goes ahead as before.
//
// byPort maps a port ID to the addresses that would leave it; what comes
// back is every address to keep, with the reason.
func (p *Provider) withFloatingIPs(ctx context.Context, byPort map[string][]netip.Addr) (keep map[netip.Addr]string, err error) {
	keep = map[netip.Addr]string{}
	for portID, addrs := range byPort {
		if len(addrs) == 0 {
			continue
		}
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		pages, err := floatingips.List(p.nc, floatingips.ListOpts{PortID: portID}).AllPages(c)
		cancel()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) || gophercloud.ResponseCodeIs(err, http.StatusForbidden) {
			return keep, nil
		}
		if err != nil {
			return nil, explain(fmt.Errorf("list the floating IPs of port %s before taking addresses off it: %w", portID, err))
		}
		fips, err := floatingips.ExtractFloatingIPs(pages)
		if err != nil {
			return nil, err
		}
		for _, f := range fips {
			if a, err := netip.ParseAddr(f.FixedIP); err == nil && slices.Contains(addrs, a) {
				keep[a] = f.FloatingIP
			}
		}
	}
	return keep, nil
}

// floatingErr names the addresses kept back and why.
func floatingErr(keep map[netip.Addr]string, portID string) error {
	if len(keep) == 0 {
		return nil
	}
	var list []string
	for a, fip := range keep {
		list = append(list, fmt.Sprintf("%s (floating IP %s)", a, fip))
	}
	slices.Sort(list)
	return fmt.Errorf("left %s on port %s: a floating IP still points at each, and Neutron would keep it there for the address's next holder; "+
		"vpcni-controller detaches it when the pod goes (or detach it by hand), then the address is released", strings.Join(list, ", "), portID)
}
