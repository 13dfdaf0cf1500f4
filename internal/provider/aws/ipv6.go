package aws

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// IPv6 (ipFamilies with ipv6). The node's pods take IPv6 addresses on the
// primary ENI, from its subnet's IPv6 block — the ENI whose link is the
// node's own, as aws-vpc-cni does in its IPv6 mode — and, once its slots
// are used, on the ENIs vpcni attached (for IPv4 pods, on a dual-stack
// node) whose subnet has an IPv6 block, by AssignIpv6Addresses on that
// ENI. No ENI is attached for IPv6 alone: in prefix mode one /80 holds
// more addresses than any node has pods, and an IPv6-only node's
// capacity by count is the primary ENI's. A lease on a secondary ENI
// names it (Lease.NIC), as an IPv4 one does: the pod's IPv6 traffic must
// leave by that ENI.
//
//   - prefixMode: true: one /80 prefix (AssignIpv6Addresses
//     {Ipv6PrefixCount: 1}) and its 2^48 addresses. A /80 is never
//     expanded: the records keep, per /80, the next offset not yet handed
//     out and the offsets given back (prefix6Use), so Held and Assign cost
//     what the node's pods number, not what the prefix holds. A /80 whose
//     handed-out addresses all came back leaves the ENI, as a /28 does.
//   - otherwise: addresses by count (AssignIpv6Addresses
//     {Ipv6AddressCount}), up to the type's Ipv6AddressesPerInterface.
//
// Ownership on the primary ENI is recorded as for IPv4 (records.go): an
// intent before each call, the addresses and /80s after.
//
// Gateway: a lease's Gateway stays unset. EC2's VPC router answers on
// the ENI's link from a link-local address that the instance learns
// from its router advertisements; no EC2 API or IMDS path tells it. Pods
// on the primary ENI route through the node (the veth datapath), whose
// own RA-learned default route reaches the router, so no consumer of
// these leases needs it; a mode that must name the next hop refuses a
// lease without one rather than guess.

// prefix6Bits is the length of the IPv6 prefixes EC2 delegates.
const prefix6Bits = 80

// prefix6Use is how far the addresses of one /80 of vpcni's were handed
// out: offsets 1 .. Next-1 (offset 0, the prefix's own address, is never
// given), less those given back (Free); Taken are offsets at or past
// Next handed out by name.
type prefix6Use struct {
	Next  uint64   `json:"next"`
	Free  []uint64 `json:"free,omitempty"`
	Taken []uint64 `json:"taken,omitempty"`
	// Since is when the /80 was first recorded: a record is kept a
	// minute past its /80's absence from a read (EC2's describes may lag
	// its own writes), lest its handed-out addresses be forgotten.
	Since time.Time `json:"since"`
}

// held lists the handed-out addresses of the /80 pf.
func (u *prefix6Use) held(pf netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for off := uint64(1); off < u.Next; off++ {
		if !slices.Contains(u.Free, off) {
			out = append(out, addrAt6(pf, off))
		}
	}
	for _, off := range u.Taken {
		out = append(out, addrAt6(pf, off))
	}
	return out
}

// idle: nothing of the /80 is handed out.
func (u *prefix6Use) idle() bool { return len(u.Taken) == 0 && uint64(len(u.Free)) >= u.Next-1 }

// take hands out n addresses: given-back ones lowest first, then new ones.
func (u *prefix6Use) take(pf netip.Prefix, n int) []netip.Addr {
	var out []netip.Addr
	slices.Sort(u.Free)
	for len(out) < n && len(u.Free) > 0 {
		out = append(out, addrAt6(pf, u.Free[0]))
		u.Free = u.Free[1:]
	}
	limit := uint64(1) << (128 - prefix6Bits)
	for len(out) < n && u.Next < limit {
		if !slices.Contains(u.Taken, u.Next) {
			out = append(out, addrAt6(pf, u.Next))
		} else {
			u.Taken = slices.DeleteFunc(u.Taken, func(o uint64) bool { return o == u.Next })
		}
		u.Next++
	}
	return out
}

// takeNamed hands out the address at off; false if it is held already.
func (u *prefix6Use) takeNamed(off uint64) bool {
	switch {
	case off == 0 || slices.Contains(u.Taken, off):
		return false
	case off < u.Next:
		i := slices.Index(u.Free, off)
		if i < 0 {
			return false
		}
		u.Free = slices.Delete(u.Free, i, i+1)
	default:
		u.Taken = append(u.Taken, off)
	}
	return true
}

// give takes the address at off back; false if it was not handed out.
func (u *prefix6Use) give(off uint64) bool {
	if i := slices.Index(u.Taken, off); i >= 0 {
		u.Taken = slices.Delete(u.Taken, i, i+1)
		return true
	}
	if off == 0 || off >= u.Next || slices.Contains(u.Free, off) {
		return false
	}
	u.Free = append(u.Free, off)
	if u.idle() {
		u.Next, u.Free = 1, nil
	}
	return true
}

// addrAt6 is the address at offset off of the /80 pf.
func addrAt6(pf netip.Prefix, off uint64) netip.Addr {
	b := pf.Masked().Addr().As16()
	for i := 15; i >= 10 && off > 0; i-- {
		b[i] |= byte(off)
		off >>= 8
	}
	return netip.AddrFrom16(b)
}

// offset6 is a's offset in the /80 pf.
func offset6(pf netip.Prefix, a netip.Addr) uint64 {
	b := a.As16()
	var off uint64
	for i := 10; i < 16; i++ {
		off = off<<8 | uint64(b[i])
	}
	return off
}

// serves6 says whether the provider gives out IPv6 addresses.
func (p *Provider) serves6() bool { return p.v6 }

// checkIPv6 refuses, at start, IPv6 the node cannot have: an instance
// type without IPv6, or a primary ENI in a subnet without an IPv6 block.
func (p *Provider) checkIPv6() error {
	if p.limits.IPv6PerENI < 1 {
		return fmt.Errorf("ipFamilies has ipv6, but instance type %s takes no IPv6 addresses (EC2 gives it %d per ENI): use a type that does, or drop ipv6 from ipFamilies", p.id.instanceType, p.limits.IPv6PerENI)
	}
	sn := p.subnets[p.id.subnetID]
	if sn == nil {
		return fmt.Errorf("ipFamilies has ipv6, but the primary ENI's subnet %s was not read", p.id.subnetID)
	}
	if !sn.cidr6.IsValid() {
		return fmt.Errorf("ipFamilies has ipv6, but subnet %s (%s) of the primary ENI has no IPv6 CIDR block: give the VPC one (aws ec2 associate-vpc-cidr-block --vpc-id %s --amazon-provided-ipv6-cidr-block) and the subnet a /64 of it (aws ec2 associate-subnet-cidr-block --subnet-id %s --ipv6-cidr-block <block>), or drop ipv6 from ipFamilies", sn.id, sn.cidr, sn.vpc, sn.id)
	}
	return nil
}

// primaryENI is the primary ENI as last read (nil: not read).
func (p *Provider) primaryENI() *eni {
	for _, e := range p.enis {
		if e.id == p.id.eniID {
			return e
		}
	}
	return nil
}

// lease6 says where an IPv6 address of the node lives (Gateway: see the
// package note above).
func (p *Provider) lease6(e *eni, a netip.Addr) alloc.Lease {
	l := alloc.Lease{Address: a, Interface: e.id}
	if sn := p.subnets[e.subnetID]; sn != nil {
		l.Prefix = sn.cidr6
	}
	if e.id != p.id.eniID {
		l.NIC = &alloc.NIC{MAC: e.mac, Address: e.primaryIP}
	}
	return l
}

// owned6 says whether the IPv6 address or /80 what on e is vpcni's.
func (p *Provider) owned6(e *eni, what string) bool { return e.ours || p.rec.owns(e.id, what) }

// mine6 lists vpcni's IPv6 pod addresses on e, as last read.
func (p *Provider) mine6(e *eni) []netip.Addr {
	if !e.attached || !p.v6 {
		return nil
	}
	var out []netip.Addr
	for _, a := range e.ipv6s {
		if p.owned6(e, a.String()) {
			out = append(out, a)
		}
	}
	for _, pf := range e.prefixes6 {
		if u := p.rec.Prefixes6[pf.String()]; u != nil && p.owned6(e, pf.String()) {
			out = append(out, u.held(pf)...)
		}
	}
	return out
}

// locate6 finds the attached ENI holding a, as an address or in a /80
// (pf valid).
func (p *Provider) locate6(a netip.Addr) (*eni, netip.Prefix) {
	return p.locateIn(a, func(e *eni) ([]netip.Addr, []netip.Prefix) { return e.ipv6s, e.prefixes6 })
}

// use6 is the record of a /80 of vpcni's, made if missing.
func (p *Provider) use6(pf netip.Prefix) *prefix6Use {
	if p.rec.Prefixes6 == nil {
		p.rec.Prefixes6 = map[string]*prefix6Use{}
	}
	u := p.rec.Prefixes6[pf.String()]
	if u == nil {
		u = &prefix6Use{Next: 1, Since: time.Now().UTC()}
		p.rec.Prefixes6[pf.String()] = u
	}
	return u
}

// assignNamed6s gives out IPv6 addresses asked for by name, each as
// assignNamed6 does (Assign for IPv6 then asks for Count on the primary
// ENI and, when its slots are used, on vpcni's other ENIs: enis6). The
// caller holds p.mu.
func (p *Provider) assignNamed6s(ctx context.Context, addrs []netip.Addr) ([]leaseOn, error) {
	var got []leaseOn
	var errs []error
	for _, a := range slices.Compact(sortedAddrs(addrs)) {
		e, err := p.assignNamed6(ctx, a)
		if e != nil {
			got = append(got, leaseOn{e, a})
		}
		errs = append(errs, err)
	}
	return got, errors.Join(errs...)
}

// enis6 are the ENIs IPv6 pod addresses go on, in the order they are
// filled: the primary ENI, then vpcni's attached ENIs (not draining)
// whose subnet has an IPv6 block, oldest first as last read.
func (p *Provider) enis6() []*eni {
	var out []*eni
	if e := p.primaryENI(); e != nil && p.usableENI(e) {
		out = append(out, e)
	}
	for _, e := range p.enis {
		if sn := p.subnets[e.subnetID]; e.id != p.id.eniID && p.usableENI(e) && sn != nil && sn.cidr6.IsValid() {
			out = append(out, e)
		}
	}
	return out
}

// assignNamed6 gives out one IPv6 address asked for by name and says on
// which ENI: one of vpcni's /80s' or already vpcni's as it is, another
// of an ENI's subnet block by AssignIpv6Addresses on the first ENI of
// enis6 in that block with a free slot. The caller holds p.mu.
func (p *Provider) assignNamed6(ctx context.Context, a netip.Addr) (*eni, error) {
	enis := p.enis6()
	holder, pf := p.locate6(a)
	usable := slices.Contains(enis, holder)
	switch {
	case holder != nil && pf.IsValid() && p.owned6(holder, pf.String()):
		if !usable || !p.use6(pf).takeNamed(offset6(pf, a)) {
			return nil, fmt.Errorf("%s is handed out already: %w", a, provider.ErrTaken)
		}
		return holder, nil
	case holder != nil && usable && !pf.IsValid() && p.owned6(holder, a.String()):
		return holder, nil // vpcni's already: handed out as it is
	case holder != nil:
		return nil, fmt.Errorf("%s is on ENI %s but was not put there by vpcni: %w", a, holder.id, provider.ErrTaken)
	}
	var blocks []string
	full := false
	for _, e := range enis {
		sn := p.subnets[e.subnetID]
		if sn == nil || !sn.cidr6.Contains(a) {
			if sn != nil && sn.cidr6.IsValid() && !slices.Contains(blocks, sn.cidr6.String()) {
				blocks = append(blocks, sn.cidr6.String())
			}
			continue
		}
		if p.room6(e) < 1 {
			full = true
			continue
		}
		addrs, _, err := p.assignOn6(ctx, e, []netip.Addr{a}, 0, false)
		if !slices.Contains(addrs, a) {
			return nil, err
		}
		return e, err
	}
	if full {
		return nil, fmt.Errorf("%s: the ENIs in its IPv6 block hold the %d IPv6 addresses and prefixes instance type %s allows each: %w", a, p.limits.IPv6PerENI, p.id.instanceType, provider.ErrExhausted)
	}
	return nil, fmt.Errorf("%s is in none of the IPv6 blocks %v of the ENIs vpcni uses: %w", a, blocks, provider.ErrOutside)
}

// room6 is how many more IPv6 addresses or /80s e takes.
func (p *Provider) room6(e *eni) int { return max(p.limits.IPv6PerENI-e.used6(), 0) }

// used6 is how many IPv6 slots e uses.
func (e *eni) used6() int { return len(e.ipv6s) + len(e.prefixes6) }

// assignCount6 gives out n IPv6 addresses on the ENIs of enis6, in their
// order: with prefixMode from vpcni's /80s first, then from a new /80 on
// the first ENI with a free slot; otherwise by count on each ENI until
// its slots are used. The caller holds p.mu.
func (p *Provider) assignCount6(ctx context.Context, n int) ([]leaseOn, error) {
	var out []leaseOn
	add := func(e *eni, addrs []netip.Addr) {
		for _, a := range addrs {
			out = append(out, leaseOn{e, a})
		}
	}
	enis := p.enis6()
	if p.cfg.PrefixMode {
		for _, e := range enis {
			for _, pf := range e.prefixes6 {
				if len(out) < n && p.owned6(e, pf.String()) {
					add(e, p.use6(pf).take(pf, n-len(out)))
				}
			}
		}
		for _, e := range enis {
			if len(out) == n {
				return out, nil
			}
			if p.room6(e) < 1 {
				continue
			}
			_, prefixes, err := p.assignOn6(ctx, e, nil, 1, true)
			for _, pf := range prefixes {
				add(e, p.use6(pf).take(pf, n-len(out)))
			}
			if err != nil {
				return out, err
			}
		}
	} else {
		for _, e := range enis {
			ask := min(n-len(out), p.room6(e))
			if ask < 1 {
				continue
			}
			got, _, err := p.assignOn6(ctx, e, nil, ask, false)
			add(e, got)
			if err != nil {
				return out, err
			}
		}
	}
	if len(out) == n {
		return out, nil
	}
	how := "prefixMode gives a /80 of 2^48 in one slot"
	if p.cfg.PrefixMode {
		how = "and vpcni's /80s on them are handed out"
	}
	return out, fmt.Errorf("%d IPv6 addresses short: the primary ENI and vpcni's %d other ENIs with an IPv6 block hold the %d IPv6 addresses and prefixes instance type %s allows each (%s; ENIs are attached for IPv4 pods only): %w",
		n-len(out), max(len(enis)-1, 0), p.limits.IPv6PerENI, p.id.instanceType, how, provider.ErrExhausted)
}

// assignOn6 assigns on e the named IPv6 addresses, count addresses, or
// (prefix) count /80s of EC2's choosing, and returns what is new; the
// intent on an ENI vpcni did not create is beginAssign's, as for IPv4.
// The caller holds p.mu.
func (p *Provider) assignOn6(ctx context.Context, e *eni, named []netip.Addr, count int, prefix bool) (_ []netip.Addr, _ []netip.Prefix, err error) {
	// moto's answer lists every address of the ENI (AWS-FACTS V61): until
	// the answers are known to be EC2's, the ENI is read before the call.
	ctx, done, err := p.beginAssign(ctx, e, p.answers6 != answersExact, count+len(named), true)
	if err != nil {
		return nil, nil, err
	}
	defer done(&err)
	input := &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: &e.id}
	switch {
	case len(named) > 0:
		input.Ipv6Addresses = addrStrings(named)
	case prefix:
		input.Ipv6PrefixCount = aws.Int32(int32(count))
	default:
		input.Ipv6AddressCount = aws.Int32(int32(count))
	}
	out, err := p.ec2.AssignIpv6Addresses(ctx, input)
	if err != nil {
		return nil, nil, explain6(fmt.Errorf("assign IPv6 addresses on ENI %s: %w", e.id, err))
	}
	// EC2 answers with what the call assigned, moto with every IPv6
	// address of the ENI. An answer naming an address the ENI held before,
	// or more than were asked for, is a listing; one that names none of a
	// non-empty before-set is EC2's. Until then the ENI is read before
	// each call, and the new addresses are those it did not hold.
	var got []netip.Addr
	listing := !prefix && len(out.AssignedIpv6Addresses) > count+len(named)
	for _, s := range out.AssignedIpv6Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if slices.Contains(e.ipv6s, a) {
			listing = true
			continue
		}
		if !slices.Contains(got, a) {
			got = append(got, a)
		}
	}
	switch {
	case listing:
		p.answers6 = answersListing
	case len(e.ipv6s) > 0 && p.answers6 == answersUnknown:
		p.answers6 = answersExact
	}
	var pfx []netip.Prefix
	for _, s := range out.AssignedIpv6Prefixes {
		if pf, err := netip.ParsePrefix(s); err == nil && !slices.Contains(e.prefixes6, pf) && !slices.Contains(pfx, pf) {
			pfx = append(pfx, pf)
		}
	}
	e.ipv6s, e.prefixes6 = append(e.ipv6s, got...), append(e.prefixes6, pfx...)
	if !e.ours {
		now := time.Now().UTC()
		p.rec.own(e.id, addrStrings(got), now)
		p.rec.own(e.id, prefixStrings(pfx), now)
	}
	for _, pf := range pfx {
		p.use6(pf)
	}
	if prefix && len(pfx) == 0 {
		// moto ignores Ipv6PrefixCount (AWS-FACTS V62); EC2 never answers
		// a prefix count with nothing.
		return got, nil, fmt.Errorf("EC2 answered AssignIpv6Addresses{Ipv6PrefixCount} on ENI %s with no /80 prefix (an endpoint without IPv6 prefixes?): turn prefixMode off for IPv6 addresses by count: %w", e.id, provider.ErrUnavailable)
	}
	return got, pfx, nil
}

// explain6 is explain with the hints of the IPv6 calls.
func explain6(err error) error {
	if isCode(err, codeNoCIDRBlocks) {
		return fmt.Errorf("%w (no free /80 in the subnet's IPv6 block): %w", err, provider.ErrExhausted)
	}
	return explain(err)
}

// release6 is Release for IPv6 addresses: one of a /80 is given back to
// its record, one assigned alone leaves its ENI (one call per ENI), and a
// /80 of vpcni's with nothing handed out leaves too. It returns the
// addresses vpcni did not put there. The caller holds p.mu.
func (p *Provider) release6(ctx context.Context, addrs []netip.Addr) (foreign []string, _ error) {
	drop := map[string][]netip.Addr{}
	for _, a := range addrs {
		e, pf := p.locate6(a)
		switch {
		case e == nil:
		case pf.IsValid() && p.owned6(e, pf.String()):
			if u := p.rec.Prefixes6[pf.String()]; u != nil {
				u.give(offset6(pf, a))
			}
		case !pf.IsValid() && p.owned6(e, a.String()):
			drop[e.id] = append(drop[e.id], a)
		default:
			foreign = append(foreign, fmt.Sprintf("%s (ENI %s)", a, e.id))
		}
	}
	var errs []error
	for _, e := range slices.Clone(p.enis) {
		var idle []netip.Prefix
		for _, pf := range e.prefixes6 {
			// A /80 of vpcni's without a record (claimed from a call whose
			// reply was lost) has handed nothing out.
			if p.owned6(e, pf.String()) && p.use6(pf).idle() {
				idle = append(idle, pf)
			}
		}
		if len(drop[e.id]) == 0 && len(idle) == 0 {
			continue
		}
		if err := p.unassignOn6(ctx, e, drop[e.id], idle); err != nil {
			errs = append(errs, err)
		}
	}
	return foreign, errors.Join(errs...)
}

// unassignOn6 takes IPv6 addresses and /80s off an ENI in one call and
// forgets them. An ENI that is gone holds nothing any more.
func (p *Provider) unassignOn6(ctx context.Context, e *eni, addrs []netip.Addr, prefixes []netip.Prefix) error {
	_, err := p.ec2.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: &e.id,
		Ipv6Addresses: nonEmpty(addrStrings(addrs)), Ipv6Prefixes: prefixStrings(prefixes)})
	if err != nil && !isCode(err, codeENINotFound) {
		return explain(fmt.Errorf("unassign IPv6 %v %v from ENI %s: %w", addrs, prefixes, e.id, err))
	}
	e.ipv6s = slices.DeleteFunc(e.ipv6s, func(a netip.Addr) bool { return slices.Contains(addrs, a) })
	e.prefixes6 = slices.DeleteFunc(e.prefixes6, func(pf netip.Prefix) bool { return slices.Contains(prefixes, pf) })
	p.rec.disown(e.id, addrStrings(addrs))
	p.rec.disown(e.id, prefixStrings(prefixes))
	for _, pf := range prefixes {
		delete(p.rec.Prefixes6, pf.String())
	}
	return nil
}

// forgetPrefixes6 drops the records of /80s no ENI holds any more (and
// none made in the last minute); it says whether any went.
func (p *Provider) forgetPrefixes6() bool {
	changed := false
	for k, u := range p.rec.Prefixes6 {
		pf, err := netip.ParsePrefix(k)
		if err == nil && (time.Since(u.Since) < time.Minute || slices.ContainsFunc(p.enis, func(e *eni) bool { return slices.Contains(e.prefixes6, pf) })) {
			continue
		}
		delete(p.rec.Prefixes6, k)
		changed = true
	}
	return changed
}

// capacity6 is the node's IPv6 capacity: by count, the primary ENI's
// IPv6 slots — and, on a dual-stack node, those of every ENI vpcni may
// attach (each IPv4 pod's ENI then carries IPv6 too); with /80s no bound
// the node reaches (0: the kubelet's max pods bounds it).
func (p *Provider) capacity6() provider.Capacity {
	if p.cfg.PrefixMode {
		return provider.Capacity{Reason: fmt.Sprintf("/80 prefixes of 2^48 addresses on the primary ENI (up to %d, instance type %s): no bound short of the node's pod limit", p.limits.IPv6PerENI, p.id.instanceType)}
	}
	if p.dual && p.maxENIs > 1 {
		return provider.Capacity{Max: p.maxENIs * p.limits.IPv6PerENI, Reason: fmt.Sprintf("%d ENIs × %d IPv6 addresses (instance type %s; prefixMode gives a /80 per slot)", p.maxENIs, p.limits.IPv6PerENI, p.id.instanceType)}
	}
	return provider.Capacity{Max: p.limits.IPv6PerENI, Reason: fmt.Sprintf("%d IPv6 addresses on the primary ENI (instance type %s; prefixMode gives a /80 per slot)", p.limits.IPv6PerENI, p.id.instanceType)}
}

func prefixStrings(ps []netip.Prefix) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps))
	for i, pf := range ps {
		out[i] = pf.String()
	}
	return out
}

// nonEmpty is nil for an empty list, which the SDK then leaves out of the
// request.
func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// wantsV6 says whether the node's families include IPv6.
func wantsV6(fams []family.Family) bool { return family.Has(fams, family.V6) }
