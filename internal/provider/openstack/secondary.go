package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// Secondary NICs (fixed-ips mode, secondaryNICs > 0): once the VM port
// holds maxAddresses pod addresses, further ones go on ports vpcni creates
// and attaches to the VM, maxAddresses each. Such a port is vpcni's alone,
// so every fixed IP on it but the NIC's own address is a pod address; the
// own address is the one Neutron gave the port at creation, recorded in
// its description with the first pod addresses. Leases name the port and
// its NIC (MAC, own address): the datapath gives each secondary NIC its own
// route table, so a pod's replies leave by the NIC whose port security
// allows its address. A NIC emptied of pod addresses by Release is
// detached and its port deleted at once — a NIC costs an attach (~1 s),
// but a kept empty one would hold one of the VM's few NIC slots and an
// address for nothing.

// heldSecondary lists the pod addresses on this VM's secondary NICs. The
// caller holds p.mu.
func (p *Provider) heldSecondary(ctx context.Context) ([]alloc.Lease, error) {
	nics, err := p.attachedNICs(ctx, p.nicKind())
	var out []alloc.Lease
	for _, n := range nics {
		for _, a := range n.pods() {
			out = append(out, p.nicLease(a, n))
		}
	}
	return out, err
}

// assignSpill fills the VM port up to maxAddresses, then secondary NICs.
func (p *Provider) assignSpill(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	nics, err := p.attachedNICs(ctx, p.nicKind())
	if err != nil {
		return nil, err
	}
	var out []alloc.Lease
	onNIC := map[netip.Addr]nicPort{}
	for _, n := range nics {
		for _, a := range n.pods() {
			onNIC[a] = n
		}
	}
	if err := p.refreshIfStale(ctx); err != nil {
		return nil, err
	}
	_, marked, on, err := p.state()
	if err != nil {
		return nil, err
	}
	ours := 0
	for a := range marked {
		if on[a] {
			ours++
		}
	}
	room := max(p.cfg.MaxAddresses-ours, 0)
	var primary, spill []netip.Addr
	for _, a := range req.Addresses {
		switch n, ok := onNIC[a]; {
		case ok:
			out = append(out, p.nicLease(a, n))
		case marked[a] && on[a] || room > 0 && !on[a]:
			if !on[a] {
				room--
			}
			primary = append(primary, a)
		case on[a]:
			primary = append(primary, a) // the primary path says whose it is
		default:
			spill = append(spill, a)
		}
	}
	count := max(req.Count, 0)
	onPrimary := min(count, room)
	got, err := p.assignLocked(ctx, provider.AssignRequest{Count: onPrimary, Addresses: primary})
	out = append(out, p.leases(got)...)
	if err != nil {
		return out, err
	}
	if count-onPrimary > 0 || len(spill) > 0 {
		more, err := p.assignOnNICs(ctx, nics, spill, count-onPrimary)
		out = append(out, more...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// assignOnNICs puts addresses on secondary NICs with room, attaching new
// ones up to secondaryNICs. A NIC's addresses come from its own subnet; a
// subnet found full is left for the rest of the call and the next NIC goes
// on another (see nicSubnets). The caller holds p.mu.
func (p *Provider) assignOnNICs(ctx context.Context, nics []nicPort, explicit []netip.Addr, count int) (out []alloc.Lease, err error) {
	var errs []error
	// A NIC attached here that ends up holding no pod address (a write
	// after its attach failed, or its subnet filled meanwhile) would hold
	// one of the VM's few NIC slots and an address for nothing, and no
	// lease would ever release it.
	created := map[string]bool{}
	defer func() {
		for _, n := range nics {
			if created[n.id] && len(n.pods()) == 0 {
				if derr := p.dropNIC(ctx, n); derr != nil {
					err = errors.Join(err, fmt.Errorf("give back the empty secondary NIC %s: %w", n.id, derr))
				}
			}
		}
	}()
	skip := map[netip.Addr]bool{}
	full := map[string]bool{}  // subnets found full during this call
	fresh := map[string]bool{} // subnets whose used addresses were listed during this call
	for conflicts := 0; count > 0 || len(explicit) > 0; {
		// A named address goes on a NIC of its subnet; others on any NIC
		// whose subnet has room.
		var want netip.Addr
		if len(explicit) > 0 {
			want = explicit[0]
		}
		i := slices.IndexFunc(nics, func(n nicPort) bool {
			s := p.nets[n.subnet]
			return len(n.pods()) < p.cfg.MaxAddresses && s != nil &&
				(want.IsValid() && s.prefix.Contains(want) || !want.IsValid() && !full[n.subnet])
		})
		if i < 0 {
			if len(nics) >= p.cfg.SecondaryNICs {
				held := fmt.Sprintf("VM port %s and its %d secondary NICs", p.portID, len(nics))
				if p.network != "" {
					held = fmt.Sprintf("the %d NICs of pod network %s", len(nics), p.network)
				}
				errs = append(errs, fmt.Errorf("%s hold maxAddresses %d each, or their subnets are full: %w", held, p.cfg.MaxAddresses, provider.ErrExhausted))
				break
			}
			n, err := p.newSecondary(ctx, full, want)
			if errors.Is(err, provider.ErrOutside) && want.IsValid() {
				errs = append(errs, err)
				explicit = explicit[1:]
				continue
			}
			if err != nil {
				errs = append(errs, err)
				break
			}
			created[n.id] = true
			nics, i = append(nics, n), len(nics)
		}
		n := &nics[i]
		s := p.nets[n.subnet]
		room := p.cfg.MaxAddresses - len(n.pods())
		var take []netip.Addr
		for _, a := range explicit {
			if len(take) < room && s.prefix.Contains(a) {
				take = append(take, a)
			}
		}
		used, err := p.usedOn(ctx, s, false)
		if err != nil {
			errs = append(errs, err)
			break
		}
		avoid := map[netip.Addr]bool{}
		for _, m := range nics {
			for _, a := range m.addrs {
				avoid[a] = true
			}
		}
		also := map[netip.Addr]bool{}
		for _, a := range explicit {
			also[a] = true
		}
		picked := pickOn(s, used, min(count, room-len(take)), avoid, skip, also)
		if len(picked) < min(count, room-len(take)) && !fresh[s.id] {
			// Too few free as last listed: others may have given some
			// back since. List again before calling the subnet full.
			fresh[s.id] = true
			p.forget(s)
			continue
		}
		add := append(slices.Clone(take), picked...)
		if len(add) == 0 {
			full[s.id] = true // the next NIC goes on another subnet
			continue
		}
		var taken netip.Addr
		err = p.addToNIC(ctx, n, add)
		switch {
		case err == nil:
		case isNeutronError(err, http.StatusConflict, "IpAddressAlreadyAllocated", &taken) && taken.IsValid() && conflicts < 4*p.cfg.Retries:
			conflicts++
			if slices.Contains(explicit, taken) {
				errs = append(errs, fmt.Errorf("%s: %w", taken, provider.ErrTaken))
				explicit = slices.DeleteFunc(explicit, func(a netip.Addr) bool { return a == taken })
			}
			skip[taken] = true
			p.forget(s)
			continue
		default:
			errs = append(errs, err)
			return out, errors.Join(errs...)
		}
		for _, a := range add {
			out = append(out, p.nicLease(a, *n))
			if used != nil {
				used[a] = true
			}
		}
		explicit = slices.DeleteFunc(explicit, func(a netip.Addr) bool { return slices.Contains(take, a) })
		count -= len(picked)
	}
	return out, errors.Join(errs...)
}

// newSecondary creates a port (Neutron picks its own address) on the
// subnet with the most free addresses that is not full (on want's subnet
// when want is valid), with the PodNetwork's security groups if the
// provider serves one, and attaches it; one that does not attach is
// deleted. A subnet Neutron finds full is marked so and the next tried.
func (p *Provider) newSecondary(ctx context.Context, full map[string]bool, want netip.Addr) (nicPort, error) {
	// The node's own provider and each PodNetwork's attach NICs to the
	// same VM, each under its own lock: the VM's free slot is counted and
	// taken under one lock of the instance's, or two would take the last.
	unlock := lockInstance(p.instanceID)
	defer unlock()
	room, err := p.nicRoom(ctx)
	if err != nil {
		return nicPort{}, err
	}
	if room < 1 {
		return nicPort{}, fmt.Errorf("instance %s has no room for another %s (maxNICs %d): %w", p.instanceID, p.nicWhat(), p.cfg.MaxNICs, provider.ErrExhausted)
	}
	cands, free, err := p.nicSubnets(ctx)
	if err != nil {
		return nicPort{}, err
	}
	var tried []string
	for i, s := range cands {
		switch {
		case want.IsValid() && !s.prefix.Contains(want):
			continue
		case !want.IsValid() && (full[s.id] || free[i] < 2):
			// A NIC takes one address of its own and a pod's at least.
			full[s.id] = true
			tried = append(tried, fmt.Sprintf("%s (%s): %d free", s.id, s.prefix, free[i]))
			continue
		}
		made, err := p.createNICPorts(ctx, p.nicKind(), s.networkID, [][]ports.IP{{{SubnetID: s.id}}},
			func(int) string { return p.nicDesc(netip.Addr{}) })
		if isNeutronError(err, http.StatusConflict, "IpAddressGenerationFailure", nil) {
			full[s.id] = true
			tried = append(tried, fmt.Sprintf("%s (%s): full", s.id, s.prefix))
			continue
		}
		if err != nil {
			return nicPort{}, err
		}
		n := made[0]
		if err := p.attach(ctx, n.id); err != nil {
			return nicPort{}, errors.Join(err, p.abandon(ctx, n))
		}
		n.deviceID = p.instanceID
		p.slotsFree.Store(int64(room-1) + 1) // the slot counted above is taken
		p.ownNICs.Add(1)
		return n, nil
	}
	if want.IsValid() && len(tried) == 0 {
		return nicPort{}, fmt.Errorf("%s is on no subnet a secondary NIC may go on: %w", want, provider.ErrOutside)
	}
	return nicPort{}, fmt.Errorf("no subnet has room for another %s (%s): %w", p.nicWhat(), strings.Join(tried, "; "), provider.ErrExhausted)
}

// nicWhat names the NICs this provider attaches, for errors.
func (p *Provider) nicWhat() string {
	if p.network != "" {
		return "NIC for pod network " + p.network
	}
	return "secondary NIC"
}

// nicDesc is a secondary NIC port's description: whose NIC it is, the
// PodNetwork it serves (if any), and its own address once known.
func (p *Provider) nicDesc(own netip.Addr) string {
	d := "vpcni secondary NIC of instance " + p.instanceID
	if p.network != "" {
		d = fmt.Sprintf("vpcni NIC of instance %s for pod network %s [%s%s]", p.instanceID, p.network, nicNetworkMark, p.network)
	}
	if own.IsValid() {
		d += fmt.Sprintf(" [%s%s]", nicOwnMark, own)
	}
	return d
}

// instanceLocks serialise, per VM, counting its free NIC slots and taking
// one, across the providers of one agent.
var instanceLocks sync.Map // instance ID -> *sync.Mutex

func lockInstance(id string) (unlock func()) {
	mu, _ := instanceLocks.LoadOrStore(id, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// setNICAddrs makes a secondary NIC's port hold its own address and pods,
// with the own-address mark, under If-Match, retrying a 412 on a fresh
// read, and reads it back.
func (p *Provider) setNICAddrs(ctx context.Context, n *nicPort, pods []netip.Addr) error {
	fixed := []ports.IP{{SubnetID: n.subnet, IPAddress: n.own.String()}}
	for _, a := range pods {
		fixed = append(fixed, ports.IP{SubnetID: n.subnet, IPAddress: a.String()})
	}
	desc := p.nicDesc(n.own)
	want := sorted(slices.Clone(pods))
	for attempt := 0; attempt < p.cfg.Retries; attempt++ {
		if attempt > 0 {
			backoff(ctx, attempt)
			if err := p.rereadNIC(ctx, n); err != nil {
				return err
			}
		}
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		rev := n.revision
		_, err := ports.Update(c, p.nc, n.id, ports.UpdateOpts{FixedIPs: fixed, Description: &desc, RevisionNumber: &rev}).Extract()
		cancel()
		if err != nil {
			if retryable(err) {
				continue
			}
			return explain(fmt.Errorf("update secondary NIC port %s: %w", n.id, err))
		}
		if err := p.rereadNIC(ctx, n); err != nil {
			return err
		}
		if slices.Equal(n.pods(), want) {
			return nil
		}
	}
	return fmt.Errorf("secondary NIC port %s: its addresses did not hold after %d attempts: %w", n.id, p.cfg.Retries, provider.ErrUnavailable)
}

// rereadNIC reads a NIC's port again.
func (p *Provider) rereadNIC(ctx context.Context, n *nicPort) error {
	c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	port, err := answered(ports.Get(c, p.nc, n.id).Extract())
	if err != nil {
		return explain(fmt.Errorf("read secondary NIC port %s: %w", n.id, err))
	}
	dev := n.deviceID
	*n = p.nicPortOf(*port)
	n.deviceID = dev
	return nil
}

func (p *Provider) addToNIC(ctx context.Context, n *nicPort, add []netip.Addr) error {
	return p.setNICAddrs(ctx, n, append(n.pods(), add...))
}

// releaseSecondary takes addresses off the secondary NICs; a NIC left
// without pod addresses is detached and its port deleted. The caller
// holds p.mu.
func (p *Provider) releaseSecondary(ctx context.Context, addrs []netip.Addr) error {
	nics, err := p.attachedNICs(ctx, p.nicKind())
	if err != nil {
		return err
	}
	var errs []error
	for i := range nics {
		n := &nics[i]
		pods := n.pods()
		keep := slices.DeleteFunc(slices.Clone(pods), func(a netip.Addr) bool { return slices.Contains(addrs, a) })
		// An empty NIC goes too, whatever was asked: one left empty by an
		// earlier failure is given back here at the latest.
		switch {
		case len(keep) == 0:
			if err := p.dropNIC(ctx, *n); err != nil {
				errs = append(errs, fmt.Errorf("give back secondary NIC %s: %w", n.id, err))
			}
		case len(keep) < len(pods):
			errs = append(errs, p.setNICAddrs(ctx, n, keep))
		}
	}
	return errors.Join(errs...)
}
