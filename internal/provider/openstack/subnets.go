package openstack

import (
	"context"
	"fmt"
	"net/netip"
)

// Subnet discovery: with no subnetID, a node's pods take addresses from
// the subnet of its own VM port's fixed IP — the one the port was found
// by (portLookup ip), or the port's first IPv4 fixed IP (portLookup
// instance). One config then serves nodes that sit in different subnets,
// each node on its own.

// discoverSubnet settles the pods' subnet from the VM port findPort found
// on any network, and reads it.
func (p *Provider) discoverSubnet(ctx context.Context) error {
	id, addr, err := p.portSubnet()
	if err != nil {
		return err
	}
	p.cfg.SubnetID = id
	p.subnetHow = fmt.Sprintf("discovered: the subnet of VM port %s's fixed IP %s", p.portID, addr)
	_, err = p.readSubnet(ctx)
	return err
}

// portSubnet picks the VM port's fixed IP whose subnet serves the pods.
func (p *Provider) portSubnet() (subnetID string, addr netip.Addr, err error) {
	for _, f := range p.port.FixedIPs {
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil || f.SubnetID == "" {
			continue
		}
		switch {
		case p.cfg.PortLookup == "ip" && a == p.nodeIP:
			return f.SubnetID, a, nil
		case p.cfg.PortLookup != "ip" && a.Is4():
			return f.SubnetID, a, nil
		}
	}
	if p.cfg.PortLookup == "ip" {
		return "", netip.Addr{}, fmt.Errorf("VM port %s does not list %s among its fixed IPs: set subnetID", p.portID, p.nodeIP)
	}
	return "", netip.Addr{}, fmt.Errorf("VM port %s has no IPv4 fixed IP to take the pods' subnet from: set subnetID", p.portID)
}

// SubnetSource says which subnet serves the pods and how it was settled
// (configured, or discovered from the VM port).
func (p *Provider) SubnetSource() string {
	return fmt.Sprintf("subnet %s (%s), %s", p.cfg.SubnetID, p.subnet, p.subnetHow)
}
