package openstack

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
)

// Own MACs. In some datapath modes (macvlan, bridge) each pod sends from a
// MAC of its own, alloc.AddressMAC(address), not the VM port's. Neutron's
// port security lets a frame through only with a (MAC, IP) the port
// allows: its own MAC with its fixed IPs, and each allowed address pair's
// MAC with the pair's address. A fixed IP cannot carry another MAC, so:
// in address-pairs mode every pair of vpcni's carries its pod's MAC; in
// fixed-ips mode the node's port must have port security off, or the
// provider refuses to start and says what works instead.

// matchMACs is called once, before any other use, with whether the
// datapath sends each pod's traffic from its own MAC.
func (p *Provider) matchMACs(ctx context.Context, podMACs bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Mode == "address-pairs" {
		p.podMACs = podMACs
		return p.fixPairMACs(ctx)
	}
	if !podMACs {
		return nil
	}
	on, err := p.portSecurity(ctx)
	if err != nil {
		return err
	}
	if on {
		return fmt.Errorf("the datapath gives each pod a MAC of its own, and port security on VM port %s lets through only the port's MAC with a fixed IP (mode %s cannot allow another MAC): set provider.openstack.mode: address-pairs (each pair allows one pod's address with its MAC, at most maxAddressPairs, %d, per node), or disable port security on the node's port, or choose a datapath whose pods share the node's MAC (veth, ipvlan)",
			p.portID, p.cfg.Mode, p.cfg.MaxAddressPairs)
	}
	return nil
}

// portSecurity reads whether port security is on for the VM port.
func (p *Provider) portSecurity(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	var port struct {
		ports.Port
		portsecurity.PortSecurityExt
	}
	if err := ports.Get(ctx, p.nc, p.portID).ExtractInto(&port); err != nil {
		return false, explain(fmt.Errorf("read VM port %s: %w", p.portID, err))
	}
	return port.PortSecurityEnabled, nil
}

// pairMAC is the MAC a pair of vpcni's carries for address a: the pod's
// own, or "" (Neutron fills in the port's).
func (p *Provider) pairMAC(a netip.Addr) string {
	if p.podMACs {
		return alloc.AddressMAC(a)
	}
	return ""
}

// pairFits says whether pair ap allows address a with the MAC the
// datapath sends it from.
func (p *Provider) pairFits(ap ports.AddressPair, a netip.Addr) bool {
	want := p.pairMAC(a)
	if want == "" {
		want = p.port.MACAddress
	}
	return ap.MACAddress == "" && !p.podMACs || strings.EqualFold(ap.MACAddress, want)
}

// allowedPairs reads the VM port's pairs as the addresses they allow with
// the MAC the datapath needs.
func (p *Provider) allowedPairs() map[netip.Addr]bool { return p.allowedPairsOf(p.port) }

// allowedPairsOf reads a copy of the VM port as allowedPairs does.
func (p *Provider) allowedPairsOf(port *ports.Port) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, ap := range port.AllowedAddressPairs {
		if a, err := netip.ParseAddr(ap.IPAddress); err == nil && p.pairFits(ap, a) {
			out[a] = true
		}
	}
	return out
}

// hasPairOn says whether a copy of the VM port carries pair ap (an empty
// MAC is the port's).
func hasPairOn(port *ports.Port, ap ports.AddressPair) bool {
	mac := ap.MACAddress
	if mac == "" {
		mac = port.MACAddress
	}
	for _, have := range port.AllowedAddressPairs {
		hm := have.MACAddress
		if hm == "" {
			hm = port.MACAddress
		}
		if have.IPAddress == ap.IPAddress && strings.EqualFold(hm, mac) {
			return true
		}
	}
	return false
}

// fixPairMACs rewrites vpcni's pairs that carry another MAC than the
// datapath sends from (the node ran another datapath mode before), in one
// write. A pair vpcni did not make is left as it is.
func (p *Provider) fixPairMACs(ctx context.Context) error {
	return p.replanned(ctx, func() error { return p.fixPairMACsOnce(ctx) })
}

func (p *Provider) fixPairMACsOnce(ctx context.Context) error {
	if err := p.refresh(ctx); err != nil {
		return err
	}
	res, err := p.paired(ctx)
	if err != nil {
		return err
	}
	fits := p.allowedPairs()
	wrong := map[netip.Addr]bool{}
	for a := range res {
		if !fits[a] {
			wrong[a] = true
		}
	}
	if len(wrong) == 0 {
		return nil
	}
	return p.applyPairs(ctx, keys(res), wrong, nil)
}
