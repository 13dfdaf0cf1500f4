package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/attachinterfaces"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
)

// NICs through Nova: passthrough pods and secondary NICs are Neutron ports
// vpcni creates and attaches to the node's VM with Nova's os-interface API
// (attach is synchronous, ~1.1 s on a real Nova; detach answers 202 and
// Neutron frees the port ~1 s later). The port's name marks it as vpcni's
// NIC of this VM ("vpcni-<kind>-<instance>"): Neutron filters lists by the
// exact name, so after a restart Held finds exactly these ports, and a port
// created but never attached (the agent died between the two calls) is
// found and deleted, never leaked.

// NIC kinds, in the port's name. A PodNetwork's NICs are all of kind
// network, the PodNetwork's name in the description (nicNetworkMark): a
// name may hold dashes, and the name must end with the instance.
const (
	kindPassthrough = "passthrough"
	kindSecondary   = "secondary"
	kindNetwork     = "network"
)

// nicKind is the kind of the NICs that hold this provider's addresses
// past the VM port: a PodNetwork's, or the node's secondary ones.
func (p *Provider) nicKind() string {
	if p.network != "" {
		return kindNetwork
	}
	return kindSecondary
}

// nicNetworkMark names, in a NIC port's description, the PodNetwork whose
// pods it holds.
const nicNetworkMark = "vpcni-network="

// NICTag is on every NIC port vpcni creates (standard-attr-tag): a NIC may
// sit on any network (a PodNetwork's, a listed subnet's), and Neutron
// filters ports by tag across networks but by name only exactly, so the
// leak audit finds the NICs of VMs that are gone by it. Neutron ignores
// tags in a create: the tag is put on right after, and a port that cannot
// be tagged is deleted, never used untagged.
const NICTag = "vpcni-nic"

// nicOwnMark holds a secondary NIC's own address in its port's
// description: Neutron sorts fixed IPs as text, so "the first" would not
// stay the first once pod addresses join it.
const nicOwnMark = "vpcni-nic-address="

// nicPort is a port vpcni made to attach to the VM as a NIC.
type nicPort struct {
	id, mac  string
	deviceID string
	// network is the PodNetwork the NIC serves ("": the node's own).
	network string
	// subnet is the one subnet the port's addresses are on: a NIC's port
	// holds addresses of one subnet only (its own address's), so its
	// leases carry one prefix and gateway and its route table one subnet.
	subnet   string
	own      netip.Addr   // the NIC's own address
	addrs    []netip.Addr // its fixed IPs on the subnet, own included
	revision int
}

// pods are the NIC's addresses other than its own.
func (n nicPort) pods() []netip.Addr {
	return slices.DeleteFunc(slices.Clone(n.addrs), func(a netip.Addr) bool { return a == n.own })
}

func (p *Provider) nicName(kind string) string { return "vpcni-" + kind + "-" + p.instanceID }

// NICOf says whether a port's name makes it one of vpcni's NICs, and of
// which instance (vpcni-controller's leak audit finds the NICs of VMs
// that are gone by it).
func NICOf(name string) (instance string, ok bool) {
	for _, k := range []string{kindSecondary, kindPassthrough, kindNetwork} {
		if inst, found := strings.CutPrefix(name, "vpcni-"+k+"-"); found && inst != "" {
			return inst, true
		}
	}
	return "", false
}

func (p *Provider) nicPortOf(port ports.Port) nicPort {
	n := nicPort{id: port.ID, mac: port.MACAddress, deviceID: port.DeviceID, revision: port.RevisionNumber}
	if _, v, ok := strings.Cut(port.Description, nicNetworkMark); ok {
		if f := strings.Fields(v); len(f) > 0 {
			n.network = strings.TrimSuffix(f[0], "]")
		}
	}
	if _, v, ok := strings.Cut(port.Description, nicOwnMark); ok {
		// A mark someone cut short reads as no mark (the first address).
		if f := strings.Fields(v); len(f) > 0 {
			n.own, _ = netip.ParseAddr(strings.TrimSuffix(f[0], "]"))
		}
	}
	// The port's subnet is its own address's; without a mark, that of its
	// first fixed IP on the pods' subnet, else its first IPv4 fixed IP:
	// on a network with an IPv6 subnet Neutron gives the port an IPv6
	// address too (SLAAC: unasked), and fixed_ips come sorted as text, so
	// the first one may be IPv6 while the NIC serves IPv4.
	for _, f := range port.FixedIPs {
		a, err := netip.ParseAddr(f.IPAddress)
		switch {
		case err != nil:
		case a == n.own:
			n.subnet = f.SubnetID
		case n.subnet == "" && f.SubnetID == p.cfg.SubnetID && !n.own.IsValid():
			n.subnet = f.SubnetID
		}
	}
	if n.subnet == "" {
		for _, f := range port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && a.Is4() {
				n.subnet = f.SubnetID
				break
			}
		}
	}
	if n.subnet == "" && len(port.FixedIPs) > 0 {
		n.subnet = port.FixedIPs[0].SubnetID
	}
	for _, f := range port.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == n.subnet {
			n.addrs = append(n.addrs, a)
		}
	}
	slices.SortFunc(n.addrs, netip.Addr.Compare)
	if !n.own.IsValid() && len(n.addrs) > 0 {
		n.own = n.addrs[0]
	}
	return n
}

// listNICs reads vpcni's ports of one kind for this VM from Neutron.
func (p *Provider) listNICs(ctx context.Context, kind string) ([]nicPort, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	// By name alone: it names this VM, and secondary NICs may sit on
	// other networks than the VM port's (subnets, subnetTags).
	pages, err := ports.List(p.nc, ports.ListOpts{Name: p.nicName(kind)}).AllPages(ctx)
	if err != nil {
		return nil, explain(fmt.Errorf("list vpcni's %s NIC ports: %w", kind, err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, err
	}
	out := make([]nicPort, 0, len(all))
	for _, port := range all {
		n := p.nicPortOf(port)
		if n.network != p.network {
			// Another PodNetwork's: its own provider lists (and cleans) it.
			continue
		}
		if n.subnet == "" {
			// No address at all: nothing to lease, and nothing to read.
			out = append(out, n)
			continue
		}
		if _, err := p.subnetInfo(ctx, n.subnet); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// attachedNICs lists this VM's NICs of one kind; a port of the kind that
// is attached nowhere is a leftover of an assign or release cut short, and
// is deleted. The caller holds p.mu, so no attach of this provider is in
// flight.
func (p *Provider) attachedNICs(ctx context.Context, kind string) ([]nicPort, error) {
	all, err := p.listNICs(ctx, kind)
	if err != nil {
		return nil, err
	}
	var out []nicPort
	var errs []error
	for _, n := range all {
		switch n.deviceID {
		case p.instanceID:
			out = append(out, n)
		case "":
			errs = append(errs, p.deletePort(ctx, n.id))
		}
	}
	p.ownNICs.Store(int64(len(out)))
	return out, errors.Join(errs...)
}

// nicRoom is how many more NICs the VM may take: maxNICs less what Nova
// lists on it now (the primary NIC and any a person attached count too).
func (p *Provider) nicRoom(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	pages, err := attachinterfaces.List(p.cc, p.instanceID).AllPages(ctx)
	if err != nil {
		return 0, p.novaErr(fmt.Errorf("list the NICs of instance %s: %w", p.instanceID, err))
	}
	ifs, err := attachinterfaces.ExtractInterfaces(pages)
	if err != nil {
		return 0, err
	}
	room := max(p.cfg.MaxNICs-len(ifs), 0)
	p.slotsFree.Store(int64(room) + 1) // +1: zero means not counted yet
	return room, nil
}

// freeSlots is the VM's free NIC slots as last counted (ok false: never).
func (p *Provider) freeSlots() (int, bool) {
	n := p.slotsFree.Load()
	return int(n - 1), n > 0
}

// createNICPorts creates one port per entry of fixed (each entry is the
// port's fixed IPs) in one bulk POST, all or nothing. A member of a project
// may create ports on a shared network with Neutron picking the address
// ({subnet_id} only) — the way passthrough serves such networks.
func (p *Provider) createNICPorts(ctx context.Context, kind, networkID string, fixed [][]ports.IP, desc func(i int) string) ([]nicPort, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	var body struct {
		Ports []map[string]any `json:"ports"`
	}
	for i, f := range fixed {
		port := map[string]any{
			"network_id": networkID, "name": p.nicName(kind), "description": desc(i), "fixed_ips": f,
		}
		if len(p.groups) > 0 {
			// A PodNetwork's security groups: Neutron filters the pods on
			// this port by them, as it would a VM's.
			port["security_groups"] = p.groups
		}
		body.Ports = append(body.Ports, port)
	}
	var resp struct {
		Ports []ports.Port `json:"ports"`
	}
	_, err := p.nc.Post(ctx, p.nc.ServiceURL("ports"), body, &resp, &gophercloud.RequestOpts{OkCodes: []int{http.StatusCreated}})
	if err != nil {
		return nil, explain(fmt.Errorf("create %d %s NIC ports: %w", len(fixed), kind, err))
	}
	out := make([]nicPort, len(resp.Ports))
	for i, port := range resp.Ports {
		out[i] = p.nicPortOf(port)
	}
	for _, n := range out {
		if err := attributestags.Add(ctx, p.nc, "ports", n.id, NICTag).ExtractErr(); err != nil {
			var errs []error
			for _, m := range out {
				errs = append(errs, p.deletePort(ctx, m.id))
			}
			return nil, errors.Join(explain(fmt.Errorf("tag %s NIC port %s %s: %w", kind, n.id, NICTag, err)), errors.Join(errs...))
		}
	}
	return out, nil
}

// deletePort deletes a port; one already gone is fine.
func (p *Provider) deletePort(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	if err := ports.Delete(ctx, p.nc, id).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return explain(fmt.Errorf("delete port %s: %w", id, err))
	}
	return nil
}

// attach attaches a port to the VM and waits until Nova lists it. A
// conflict (Nova busy with another interface of the instance) is retried
// until AttachTimeout. A failed attach may leave the port half-claimed
// (device_id set, binding failed; seen on a real Nova): the caller gives
// it up with dropNIC.
func (p *Provider) attach(ctx context.Context, portID string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AttachTimeout.Duration)
	defer cancel()
	for n := 0; ; n++ {
		_, err := attachinterfaces.Create(ctx, p.cc, p.instanceID, attachinterfaces.CreateOpts{PortID: portID}).Extract()
		if err == nil {
			break
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusConflict) || ctx.Err() != nil {
			return p.novaErr(fmt.Errorf("attach port %s to instance %s: %w", portID, p.instanceID, err))
		}
		backoff(ctx, n)
	}
	for n := 0; ; n++ {
		_, err := attachinterfaces.Get(ctx, p.cc, p.instanceID, portID).Extract()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("port %s attached to instance %s but Nova did not list it within %s (attachTimeout): %w",
				portID, p.instanceID, p.cfg.AttachTimeout, provider.ErrUnavailable)
		}
		backoff(ctx, min(n, 3))
	}
}

// detach takes a port off the VM and waits until Neutron shows it free
// (Nova's detach answers 202 and finishes in the background). A port not
// attached, or gone, is fine.
func (p *Provider) detach(ctx context.Context, portID string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AttachTimeout.Duration)
	defer cancel()
	err := attachinterfaces.Delete(ctx, p.cc, p.instanceID, portID).ExtractErr()
	if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return p.novaErr(fmt.Errorf("detach port %s from instance %s: %w", portID, p.instanceID, err))
	}
	for n := 0; ; n++ {
		port, err := answered(ports.Get(ctx, p.nc, portID).Extract())
		switch {
		case gophercloud.ResponseCodeIs(err, http.StatusNotFound):
			return nil
		case err == nil && port.DeviceID != p.instanceID:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("port %s still on instance %s %s after the detach (attachTimeout): %w",
				portID, p.instanceID, p.cfg.AttachTimeout, provider.ErrUnavailable)
		}
		backoff(ctx, min(n, 3))
	}
}

// dropNIC detaches a port if it is (even half) attached and deletes it.
func (p *Provider) dropNIC(ctx context.Context, n nicPort) error {
	if n.deviceID != "" {
		if err := p.detach(ctx, n.id); err != nil {
			return err
		}
	}
	return p.deletePort(ctx, n.id)
}

// abandon gives up a port whose attach failed: a failed attach may leave
// it half-claimed (device_id set, binding failed) with a detach that
// never completes (seen on a real Nova), so the detach is asked for but
// not waited on, and the port is deleted — Neutron deletes a claimed port
// too, and Nova drops an interface whose port is gone.
func (p *Provider) abandon(ctx context.Context, n nicPort) error {
	c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	_ = attachinterfaces.Delete(c, p.cc, p.instanceID, n.id).ExtractErr()
	cancel()
	return p.deletePort(ctx, n.id)
}

// novaErr adds what a person can do about a Nova failure, and marks
// failures to reach Nova as provider.ErrUnavailable.
func (p *Provider) novaErr(err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		switch {
		case code.Actual == http.StatusUnauthorized:
			return fmt.Errorf("%w (Keystone refused the credentials for Nova)", err)
		case code.Actual == http.StatusForbidden:
			return explainDenied(err)
		case code.Actual == http.StatusNotFound && strings.Contains(string(code.Body), p.instanceID):
			return fmt.Errorf("%w (no such instance: is instanceID, or the VM port's device_id, this node's Nova server?)", err)
		case code.Actual >= 500:
			return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
		}
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if e := explainTLS(err); e != nil {
		return e
	}
	return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
}
