package openstack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
)

// Address-pairs mode: each pod address is reserved by a port of its own
// (device_owner network:vpcni, device_id = the VM port's ID — that is the
// ownership mark) and allowed on the VM port as an allowed address pair.
// Reservations are created in one bulk POST; the pairs are written like
// fixed IPs: read fresh, If-Match, read back. A pair without a vpcni
// reservation behind it is someone else's and never touched. Neutron allows
// at most max_allowed_address_pair (10) pairs per port: the provider says
// so before it asks for more.

// reservations lists this node's reservation ports: address -> port ID.
func (p *Provider) reservations(ctx context.Context) (map[netip.Addr]string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	pages, err := ports.List(p.nc, ports.ListOpts{DeviceOwner: p.cfg.DeviceOwner, DeviceID: p.portID}).AllPages(ctx)
	if err != nil {
		return nil, explain(fmt.Errorf("list reservation ports: %w", err))
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]string{}
	for _, port := range all {
		for _, f := range port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == p.cfg.SubnetID {
				out[a] = port.ID
			}
		}
	}
	return out, nil
}

// paired returns this node's reservations that have their pair on the VM
// port. A reservation without one is left by a write cut short (its pair
// failed or was removed by hand): it holds an address port security would
// drop, so it is deleted. The caller holds p.mu, so no write of this
// provider is in flight.
func (p *Provider) paired(ctx context.Context) (map[netip.Addr]string, error) {
	res, err := p.reservations(ctx)
	if err != nil {
		return nil, err
	}
	pairs := p.pairs()
	unpaired := map[netip.Addr]string{}
	for a, id := range res {
		if !pairs[a] {
			unpaired[a] = id
			delete(res, a)
		}
	}
	if len(unpaired) > 0 {
		if err := p.unreserve(ctx, unpaired); err != nil {
			return nil, err
		}
		for a := range unpaired {
			delete(p.used, a)
		}
	}
	return res, nil
}

func (p *Provider) heldPairs(ctx context.Context) ([]netip.Addr, error) {
	res, err := p.paired(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(res))
	for a := range res {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// pairs reads the VM port's allowed address pairs as addresses, whatever
// their MAC.
func (p *Provider) pairs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, ap := range p.port.AllowedAddressPairs {
		if a, err := netip.ParseAddr(ap.IPAddress); err == nil {
			out[a] = true
		}
	}
	return out
}

// addressPairs: pod addresses are reserved by ports of their own and
// allowed on the VM port; ours when reserved by this node.
type addressPairs struct{ p *Provider }

func (m addressPairs) view(ctx context.Context) (portView, error) {
	p := m.p
	res, err := p.paired(ctx)
	if err != nil {
		return portView{}, err
	}
	_, _, on, err := p.state()
	if err != nil {
		return portView{}, err
	}
	v := portView{ours: map[netip.Addr]bool{}, taken: on}
	for a := range res {
		v.ours[a] = true
	}
	// Every pair that is not ours counts against the limit, CIDRs too.
	foreign := 0
	for _, ap := range p.port.AllowedAddressPairs {
		a, err := netip.ParseAddr(ap.IPAddress)
		if err != nil || !v.ours[a] {
			foreign++
			if err == nil {
				v.taken[a] = true
			}
		}
	}
	v.room = max(p.cfg.MaxAddressPairs-foreign-len(res), 0)
	v.limit = func(added int) string {
		return fmt.Sprintf("VM port %s reached Neutron's limit of %d allowed address pairs (%d by vpcni, %d by others)",
			p.portID, p.cfg.MaxAddressPairs, len(res)+added, foreign)
	}
	return v, nil
}

// write reserves the addresses in one bulk POST, then allows them on the
// VM port; without the pair a reservation is useless, so it is undone.
func (m addressPairs) write(ctx context.Context, v portView, add map[netip.Addr]bool) error {
	p := m.p
	created, err := p.reserve(ctx, add)
	if err != nil {
		return err
	}
	if err := p.applyPairs(ctx, v.ours, add, nil); err != nil {
		_ = p.unreserve(ctx, created)
		if isNeutronError(err, http.StatusBadRequest, "AllowedAddressPairExhausted", nil) {
			return fmt.Errorf("%w (Neutron's max_allowed_address_pair is lower than maxAddressPairs %d): %w", err, p.cfg.MaxAddressPairs, provider.ErrExhausted)
		}
		return err
	}
	return nil
}

// reserve creates one reservation port per address in a single bulk POST
// (all or nothing) and returns address -> port ID.
func (p *Provider) reserve(ctx context.Context, addrs map[netip.Addr]bool) (map[netip.Addr]string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	var body struct {
		Ports []map[string]any `json:"ports"`
	}
	for a := range addrs {
		body.Ports = append(body.Ports, map[string]any{
			"network_id":            p.port.NetworkID,
			"name":                  "vpcni-" + a.String(),
			"device_owner":          p.cfg.DeviceOwner,
			"device_id":             p.portID,
			"fixed_ips":             []map[string]string{{"subnet_id": p.cfg.SubnetID, "ip_address": a.String()}},
			"port_security_enabled": false,
		})
	}
	var resp struct {
		Ports []ports.Port `json:"ports"`
	}
	_, err := p.nc.Post(ctx, p.nc.ServiceURL("ports"), body, &resp, &gophercloud.RequestOpts{OkCodes: []int{http.StatusCreated}})
	if err != nil {
		return nil, explain(fmt.Errorf("reserve %d addresses: %w", len(addrs), err))
	}
	out := map[netip.Addr]string{}
	for _, port := range resp.Ports {
		for _, f := range port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				out[a] = port.ID
			}
		}
	}
	return out, nil
}

// unreserve deletes reservation ports; best effort (a leftover is found by
// Held and given back later).
func (p *Provider) unreserve(ctx context.Context, res map[netip.Addr]string) error {
	var errs []error
	for a, id := range res {
		c, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
		err := ports.Delete(c, p.nc, id).ExtractErr()
		cancel()
		if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			errs = append(errs, fmt.Errorf("delete reservation of %s: %w", a, explain(err)))
		}
	}
	return errors.Join(errs...)
}

// releasePairs takes vpcni's pairs off the VM port and deletes their
// reservations, planning again when its copy of the port was stale (see
// refreshIfMissing).
func (p *Provider) releasePairs(ctx context.Context, addrs []netip.Addr) error {
	return p.replanned(ctx, func() error { return p.releasePairsOnce(ctx, addrs) })
}

func (p *Provider) releasePairsOnce(ctx context.Context, addrs []netip.Addr) error {
	if err := p.refreshIfMissing(ctx); err != nil {
		return err
	}
	res, err := p.reservations(ctx)
	if err != nil {
		return err
	}
	drop := map[netip.Addr]bool{}
	dropRes := map[netip.Addr]string{}
	var foreign []netip.Addr
	pairs := p.pairs()
	_, _, on, err := p.state()
	if err != nil {
		return err
	}
	for _, a := range addrs {
		switch id, ours := res[a]; {
		case ours:
			drop[a], dropRes[a] = true, id
		case pairs[a] || on[a]:
			foreign = append(foreign, a)
		}
	}
	// A floating IP on a reservation port would be detached by Neutron
	// with the port, but the policy (release or retain) is the
	// controller's to apply first; see withFloatingIPs.
	byPort := map[string][]netip.Addr{}
	for a, id := range dropRes {
		byPort[id] = append(byPort[id], a)
	}
	keep, err := p.withFloatingIPs(ctx, byPort)
	if err != nil {
		return err
	}
	for a := range keep {
		delete(drop, a)
		delete(dropRes, a)
	}
	if len(drop) > 0 {
		if err := p.applyPairs(ctx, keys(res), nil, drop); err != nil {
			return err
		}
		if err := p.unreserve(ctx, dropRes); err != nil {
			return err
		}
		for a := range drop {
			delete(p.used, a)
		}
	}
	if len(foreign) > 0 {
		err = fmt.Errorf("left %v on port %s: vpcni did not put them there", foreign, p.portID)
	}
	return errors.Join(err, floatingErr(keep, "its reservation port"))
}

// applyPairs makes the VM port allow add (with the MAC the datapath sends
// each from) and no longer allow remove, leaving other pairs as they are
// (see untilHeld). ours are the addresses vpcni holds reservations for:
// their pairs, should a racing write take one off, are put back; a pair of
// someone else's never is. A pair of an added address with another MAC is
// replaced.
func (p *Provider) applyPairs(ctx context.Context, ours, add, remove map[netip.Addr]bool) error {
	restore := map[netip.Addr]bool{} // vpcni's pairs a racing write took off
	return p.untilHeld(ctx, "the allowed address pairs", func() (bool, error) {
		have := p.allowedPairs()
		need := map[netip.Addr]bool{}
		maps.Copy(need, add)
		maps.Copy(need, restore)
		for a := range remove {
			delete(need, a)
		}
		var list []ports.AddressPair
		for _, ap := range p.port.AllowedAddressPairs {
			if a, err := netip.ParseAddr(ap.IPAddress); err == nil && (remove[a] || need[a] && !p.pairFits(ap, a)) {
				continue
			}
			list = append(list, ap)
		}
		for a := range need {
			if !have[a] {
				list = append(list, ports.AddressPair{IPAddress: a.String(), MACAddress: p.pairMAC(a)})
			}
		}
		if !anyIn(need, have, false) && !anyIn(remove, p.pairs(), true) {
			return true, nil
		}
		before := p.port
		if err := p.putPairs(ctx, list); err != nil {
			return false, err
		}
		written := p.port
		if err := p.refresh(ctx); err != nil {
			return false, err
		}
		mine := maps.Clone(ours)
		maps.Copy(mine, need)
		for a := range remove {
			delete(mine, a)
		}
		// Someone else's pair the answer holds and the read-back lacks was
		// removed after vpcni's write: left as it is.
		var dropped []string
		for _, ap := range list {
			if a, err := netip.ParseAddr(ap.IPAddress); (err != nil || !mine[a]) && !hasPairOn(written, ap) {
				dropped = append(dropped, ap.IPAddress)
			}
		}
		wrote, now := p.allowedPairsOf(written), p.allowedPairs()
		held := true
		var knocked []netip.Addr
		for a := range mine {
			if now[a] {
				continue
			}
			held = false
			restore[a] = true
			if wrote[a] {
				knocked = append(knocked, a)
			}
		}
		nowAny := p.pairs()
		for a := range remove {
			held = held && !nowAny[a]
		}
		p.raced("allowed address pairs", before, written, revisionMoves(true, false), dropped, knocked)
		return held, nil
	})
}

// keys is the set of a map's keys.
func keys[V any](m map[netip.Addr]V) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(m))
	for a := range m {
		out[a] = true
	}
	return out
}

// anyIn says whether some address of set is (want=true) or is not
// (want=false) in have.
func anyIn(set, have map[netip.Addr]bool, want bool) bool {
	for a := range set {
		if have[a] == want {
			return true
		}
	}
	return false
}

func (p *Provider) putPairs(ctx context.Context, list []ports.AddressPair) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	rev := p.port.RevisionNumber
	if list == nil {
		list = []ports.AddressPair{}
	}
	updated, err := answered(ports.Update(ctx, p.nc, p.portID, ports.UpdateOpts{AllowedAddressPairs: &list, RevisionNumber: &rev}).Extract())
	if err != nil {
		return explain(fmt.Errorf("update allowed address pairs of VM port %s: %w", p.portID, err))
	}
	p.port = updated
	return nil
}
