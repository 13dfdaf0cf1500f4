package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// Passthrough mode: each pod address is a Neutron port of its own,
// attached to the VM as a NIC, which the datapath finds by its MAC and
// moves into the pod whole. The VM port is never written, so this mode
// also serves a shared network owned by another project, where Neutron's
// policy lets a member create ports (Neutron picking the address) but not
// change fixed_ips or allowed_address_pairs. The VM's NIC limit (maxNICs)
// is the node's capacity.

// nicLease is the lease of an address on a NIC of its own.
// It carries the prefix and gateway of the NIC's own subnet (listNICs
// read it); a NIC on the pods' subnet has the VM port's.
func (p *Provider) nicLease(a netip.Addr, n nicPort) alloc.Lease {
	prefix, gw := p.subnet, p.gateway
	if s := p.nets[n.subnet]; s != nil {
		prefix, gw = s.prefix, s.gateway
	}
	return alloc.Lease{Address: a, Prefix: prefix, Gateway: gw, Interface: n.id,
		NIC: &alloc.NIC{MAC: n.mac, Address: n.own}}
}

func (p *Provider) heldPassthrough(ctx context.Context) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	nics, err := p.attachedNICs(ctx, kindPassthrough)
	var out []alloc.Lease
	for _, n := range nics {
		if n.own.IsValid() {
			out = append(out, p.nicLease(n.own, n))
		}
	}
	slices.SortFunc(out, func(a, b alloc.Lease) int { return a.Address.Compare(b.Address) })
	return out, err
}

// assignPassthrough creates the ports in one bulk POST (one by one if the
// bulk fails for want of addresses, to take what there is), then attaches
// them one after another: Nova locks the instance for each attach. A port
// that does not attach is detached if half-claimed and deleted.
func (p *Provider) assignPassthrough(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []alloc.Lease
	var errs []error
	nics, err := p.attachedNICs(ctx, kindPassthrough)
	if err != nil {
		return nil, err
	}
	have := map[netip.Addr]nicPort{}
	for _, n := range nics {
		have[n.own] = n
	}
	var specs [][]ports.IP
	for _, a := range req.Addresses {
		switch n, ok := have[a]; {
		case ok:
			out = append(out, p.nicLease(a, n))
		case !p.subnet.Contains(a):
			errs = append(errs, fmt.Errorf("%s is outside subnet %s: %w", a, p.subnet, provider.ErrOutside))
		default:
			specs = append(specs, []ports.IP{{SubnetID: p.cfg.SubnetID, IPAddress: a.String()}})
		}
	}
	for range max(req.Count, 0) {
		specs = append(specs, []ports.IP{{SubnetID: p.cfg.SubnetID}})
	}
	if len(specs) == 0 {
		return out, errors.Join(errs...)
	}
	room, err := p.nicRoom(ctx)
	if err != nil {
		return out, errors.Join(append(errs, err)...)
	}
	if len(specs) > room {
		errs = append(errs, fmt.Errorf("instance %s has room for %d more NICs (maxNICs %d, one NIC per passthrough pod), not %d: %w",
			p.instanceID, room, p.cfg.MaxNICs, len(specs), provider.ErrExhausted))
		specs = specs[:room]
	}
	made, err := p.createEach(ctx, kindPassthrough, specs, func(int) string { return "vpcni passthrough NIC of instance " + p.instanceID })
	errs = append(errs, err)
	for _, n := range made {
		if err := p.attach(ctx, n.id); err != nil {
			errs = append(errs, err, p.abandon(ctx, n))
			continue
		}
		n.deviceID = p.instanceID
		out = append(out, p.nicLease(n.own, n))
	}
	slices.SortFunc(out, func(a, b alloc.Lease) int { return a.Address.Compare(b.Address) })
	return out, errors.Join(errs...)
}

// createEach creates ports in one bulk POST; if that fails on an address
// (taken, or the subnet full) it creates them one at a time and takes
// what it can, each failure named.
func (p *Provider) createEach(ctx context.Context, kind string, specs [][]ports.IP, desc func(int) string) ([]nicPort, error) {
	made, err := p.createNICPorts(ctx, kind, p.port.NetworkID, specs, desc)
	if err == nil {
		return made, nil
	}
	if !isNeutronError(err, http.StatusConflict, "IpAddressAlreadyAllocated", nil) && !isNeutronError(err, http.StatusConflict, "IpAddressGenerationFailure", nil) {
		return nil, err
	}
	var errs []error
	for i, s := range specs {
		one, err := p.createNICPorts(ctx, kind, p.port.NetworkID, [][]ports.IP{s}, func(int) string { return desc(i) })
		switch {
		case err == nil:
			made = append(made, one...)
		case isNeutronError(err, http.StatusConflict, "IpAddressAlreadyAllocated", nil):
			errs = append(errs, fmt.Errorf("%s: %w", s[0].IPAddress, provider.ErrTaken))
		case isNeutronError(err, http.StatusConflict, "IpAddressGenerationFailure", nil):
			return made, errors.Join(append(errs, fmt.Errorf("subnet %s is full: %w", p.subnet, provider.ErrExhausted))...)
		default:
			return made, errors.Join(append(errs, err)...)
		}
	}
	return made, errors.Join(errs...)
}

// releasePassthrough detaches and deletes the ports of the addresses;
// an address without a port is already given back.
func (p *Provider) releasePassthrough(ctx context.Context, addrs []netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	nics, err := p.listNICs(ctx, kindPassthrough)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nics {
		if n.own.IsValid() && slices.Contains(addrs, n.own) && (n.deviceID == "" || n.deviceID == p.instanceID) {
			if err := p.dropNIC(ctx, n); err != nil {
				errs = append(errs, fmt.Errorf("release %s: %w", n.own, err))
			}
		}
	}
	return errors.Join(errs...)
}
