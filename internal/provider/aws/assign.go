package aws

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// Assign implements provider.Provider: named addresses first (each on an
// ENI in its subnet, one call per ENI), then Count addresses, by count in
// one call per ENI: the primary ENI until its slots are used, then ENIs of
// vpcni's, then a new ENI (which is created holding its addresses).
func (p *Provider) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	if req.Fam() == family.V6 {
		if !p.serves6() {
			return nil, fmt.Errorf("IPv6 addresses asked for, but ipFamilies has no ipv6 (or this is a PodNetwork's provider): %w", provider.ErrExhausted)
		}
		return p.assignBy(ctx, req, p.assignNamed6s, p.assignCount6, p.lease6)
	}
	return p.assignBy(ctx, req, p.assignNamed, p.assignCount, p.lease)
}

// assignBy is Assign for one family, whose named, count and lease it is
// given: named addresses, then Count, then the records saved.
func (p *Provider) assignBy(ctx context.Context, req provider.AssignRequest,
	named func(context.Context, []netip.Addr) ([]leaseOn, error), count func(context.Context, int) ([]leaseOn, error),
	lease func(*eni, netip.Addr) alloc.Lease) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readIfStale(ctx); err != nil {
		return nil, err
	}
	var got []leaseOn
	var errs []error
	if len(req.Addresses) > 0 {
		more, err := named(ctx, req.Addresses)
		got = append(got, more...)
		errs = append(errs, err)
	}
	if req.Count > 0 {
		more, err := count(ctx, req.Count)
		got = append(got, more...)
		errs = append(errs, err)
	}
	if err := p.rec.save(); err != nil {
		errs = append(errs, fmt.Errorf("save vpcni's address records: %w", err))
	}
	out := make([]alloc.Lease, len(got))
	for i, l := range got {
		out[i] = lease(l.e, l.addr)
	}
	return out, errors.Join(errs...)
}

// usableENI says whether vpcni may put addresses on e: one of the
// provider's own ENIs that is not being removed, or the primary ENI for
// the node's own pods (never a PodNetwork's: its pods have ENIs of their
// own, with its security groups).
func (p *Provider) usableENI(e *eni) bool {
	return (e.id == p.id.eniID && p.network == "" || e.ours) && e.attached && !p.draining[e.id]
}

// room is how many more secondary addresses or prefixes e takes.
func (p *Provider) room(e *eni) int { return max(p.limits.slots()-e.used(), 0) }

// locate finds the attached ENI that holds a, as a secondary address or in
// a prefix (pf valid), as last read.
func (p *Provider) locate(a netip.Addr) (e *eni, pf netip.Prefix) {
	return p.locateIn(a, func(e *eni) ([]netip.Addr, []netip.Prefix) { return e.secondaries, e.prefixes })
}

// locateIn finds the ENI one of whose addresses (of those) is a, or one
// of whose prefixes holds it (pf valid): locate and locate6.
func (p *Provider) locateIn(a netip.Addr, of func(*eni) ([]netip.Addr, []netip.Prefix)) (*eni, netip.Prefix) {
	for _, e := range p.enis {
		addrs, prefixes := of(e)
		if slices.Contains(addrs, a) {
			return e, netip.Prefix{}
		}
		for _, pf := range prefixes {
			if pf.Contains(a) {
				return e, pf
			}
		}
	}
	return nil, netip.Prefix{}
}

// owned says whether a (on e, in pf if valid) is vpcni's.
func (p *Provider) owned(e *eni, a netip.Addr, pf netip.Prefix) bool {
	if e.ours {
		return true
	}
	if pf.IsValid() {
		return p.rec.owns(e.id, pf.String())
	}
	return p.rec.owns(e.id, a.String())
}

// assignNamed assigns addresses asked for by name: one already vpcni's is
// handed out as it is, one on the instance that is not vpcni's is
// ErrTaken, one outside the ENIs' subnets ErrOutside. The caller holds
// p.mu.
func (p *Provider) assignNamed(ctx context.Context, addrs []netip.Addr) ([]leaseOn, error) {
	var out []leaseOn
	var errs []error
	plan := map[string][]netip.Addr{} // ENI → addresses to assign on it
	for _, a := range slices.Compact(sortedAddrs(addrs)) {
		e, pf := p.locate(a)
		switch {
		case e != nil && p.owned(e, a, pf):
			if p.rec.isIdle(a) {
				p.rec.setIdle([]netip.Addr{a}, false)
			}
			out = append(out, leaseOn{e, a})
			continue
		case e != nil:
			errs = append(errs, fmt.Errorf("%s is on ENI %s but was not put there by vpcni: %w", a, e.id, provider.ErrTaken))
			continue
		}
		e, err := p.eniForNamed(ctx, a, plan)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		plan[e.id] = append(plan[e.id], a)
	}
	for _, e := range slices.Clone(p.enis) {
		want := plan[e.id]
		if len(want) == 0 {
			continue
		}
		got, err := p.assignOn(ctx, e, want, 0)
		for _, a := range got {
			out = append(out, leaseOn{e, a})
		}
		if err != nil && errors.Is(err, provider.ErrTaken) && len(want) > 1 {
			// One of several is held elsewhere and EC2 refused them all:
			// ask one by one to tell which.
			err = nil
			for _, a := range want {
				if slices.Contains(got, a) {
					continue
				}
				one, err1 := p.assignOn(ctx, e, []netip.Addr{a}, 0)
				if len(one) > 0 {
					out = append(out, leaseOn{e, a})
				}
				errs = append(errs, err1)
			}
		}
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// eniForNamed picks the ENI a named address goes on: one vpcni may write
// whose subnet holds it and that has room beyond what plan puts there
// already, or a new ENI in that subnet. The caller holds p.mu.
func (p *Provider) eniForNamed(ctx context.Context, a netip.Addr, plan map[string][]netip.Addr) (*eni, error) {
	var sn *subnet
	for _, e := range p.enis {
		s := p.subnets[e.subnetID]
		if !p.usableENI(e) || s == nil || !s.cidr.Contains(a) {
			continue
		}
		sn = s
		if p.room(e) > len(plan[e.id]) {
			if !s.usable(a) {
				return nil, fmt.Errorf("%s is one of the addresses EC2 reserves in subnet %s (%s): %w", a, s.id, s.cidr, provider.ErrOutside)
			}
			return e, nil
		}
	}
	for _, id := range p.eniSubnets {
		if s := p.subnets[id]; s != nil && s.cidr.Contains(a) {
			sn = s
		}
	}
	if sn == nil {
		var cidrs []string
		for _, id := range p.eniSubnets {
			if s := p.subnets[id]; s != nil {
				cidrs = append(cidrs, s.cidr.String())
			}
		}
		if s := p.subnets[p.id.subnetID]; s != nil && p.network == "" && !slices.Contains(cidrs, s.cidr.String()) {
			cidrs = append(cidrs, s.cidr.String())
		}
		whose := "the node's subnets"
		if p.network != "" {
			whose = "PodNetwork " + p.network + "'s subnets"
		}
		return nil, fmt.Errorf("%s is in none of %s (%s): %w", a, whose, strings.Join(cidrs, ", "), provider.ErrOutside)
	}
	if !slices.Contains(p.eniSubnets, sn.id) || p.attachedOnCard() >= p.maxENIs {
		return nil, fmt.Errorf("%s: no ENI in subnet %s (%s) has room for it, and %s: %w", a, sn.id, sn.cidr, p.noMoreENIs(), provider.ErrExhausted)
	}
	return p.createENI(ctx, sn, 0)
}

// noMoreENIs says why no ENI can be added.
func (p *Provider) noMoreENIs() string {
	if p.attachedOnCard() >= p.maxENIs {
		return fmt.Sprintf("the instance has its %d ENIs (%s)", p.maxENIs, p.Info().CapacityReason)
	}
	if p.network != "" {
		return fmt.Sprintf("the subnet is not one of PodNetwork %s's subnetIDs", p.network)
	}
	return "new ENIs go to other subnets (subnets/subnetTags)"
}

// assignCount assigns n addresses of EC2's choosing. The caller holds
// p.mu.
func (p *Provider) assignCount(ctx context.Context, n int) ([]leaseOn, error) {
	var out []leaseOn
	if p.cfg.PrefixMode {
		out = p.takeIdle(n)
		n -= len(out)
	}
	var reasons []string
	var errs []error
	full := map[string]bool{}    // subnets found full during this call
	fullENI := map[string]bool{} // ENIs EC2 found full although the copy had room
	for round := 0; n > 0; round++ {
		if round > 16 {
			errs = append(errs, fmt.Errorf("still %d addresses short after %d calls: %w", n, round, provider.ErrUnavailable))
			break
		}
		e := p.eniWithRoom(full, fullENI)
		if e == nil {
			more, why, err := p.spill(ctx, n, full)
			out = append(out, more...)
			n -= len(more)
			if why != "" {
				reasons = append(reasons, why)
			}
			if err != nil {
				errs = append(errs, err)
			}
			if len(more) == 0 && (why != "" || err != nil) {
				break
			}
			continue // a new ENI that came with too few addresses has room
		}
		ask := min(n, p.room(e))
		if p.cfg.PrefixMode {
			ask = min((n+prefixSize-1)/prefixSize, p.room(e))
		}
		got, err := p.assignOn(ctx, e, nil, ask)
		switch {
		case err == nil:
		case isCode(err, codeNoSubnetIPs):
			// EC2 assigns all or nothing: ask for what the subnet has.
			rerr := p.readSubnets(ctx, []string{e.subnetID})
			sn := p.subnets[e.subnetID] // as read now
			if rerr == nil && !p.cfg.PrefixMode && sn.free > 0 && sn.free < ask {
				got, err = p.assignOn(ctx, e, nil, sn.free)
			}
			if err != nil || len(got) < ask {
				full[sn.id] = true
				reasons = append(reasons, fmt.Sprintf("subnet %s (%s) has no free address left", sn.id, sn.cidr))
			}
		case isCode(err, codeNoCIDRBlocks):
			p.cidrBackoff[e.subnetID] = backoff{until: time.Now().Add(p.cfg.CIDRBackoff.Duration), err: err}
			full[e.subnetID] = true
			reasons = append(reasons, err.Error())
		case isCode(err, codeIPLimit):
			// The copy of the ENI was stale (a person added addresses):
			// read it again; EC2 said it is full.
			fullENI[e.id] = true
			if rerr := p.readENIs(ctx); rerr != nil {
				errs = append(errs, rerr)
				n = 0
			}
			continue
		default:
			errs = append(errs, err)
			n = 0
		}
		if p.cfg.PrefixMode {
			var pfx []netip.Prefix
			for _, a := range got {
				pfx = append(pfx, netip.PrefixFrom(a, 28))
			}
			more := p.spread(e, pfx, n)
			out = append(out, more...)
			n -= len(more)
			continue
		}
		for _, a := range got {
			out = append(out, leaseOn{e, a})
		}
		n -= len(got)
	}
	if n > 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%d of the addresses asked for: %s: %w", n, strings.Join(reasons, "; "), provider.ErrExhausted))
	}
	return out, errors.Join(errs...)
}

// eniWithRoom is the first ENI vpcni may write that has a free slot, in a
// subnet not found full (nor backing off for prefixes). The caller holds
// p.mu.
func (p *Provider) eniWithRoom(full, fullENI map[string]bool) *eni {
	for _, e := range p.enis {
		if p.usableENI(e) && !fullENI[e.id] && p.room(e) > 0 && !full[e.subnetID] && !p.backingOff(e.subnetID) {
			return e
		}
	}
	return nil
}

// spill creates a new ENI holding up to n addresses (or the prefixes for
// them) in the ENI subnet with the most free addresses; why says what
// stopped it, if something did. The caller holds p.mu.
func (p *Provider) spill(ctx context.Context, n int, full map[string]bool) (out []leaseOn, why string, err error) {
	if p.attachedOnCard() >= p.maxENIs {
		return nil, fmt.Sprintf("every ENI's slots are used: %s", p.Info().CapacityReason), nil
	}
	for {
		sn, err := p.subnetForENI(ctx, full)
		if err != nil {
			return nil, "", err
		}
		if sn == nil {
			why := "no subnet for a new ENI has free addresses"
			for id, b := range p.cidrBackoff {
				if p.backingOff(id) {
					why += fmt.Sprintf("; subnet %s is not asked for prefixes until %s: %v", id, b.until.Format(time.TimeOnly), b.err)
				}
			}
			return nil, why, nil
		}
		ask := min(n, p.limits.slots())
		if p.cfg.PrefixMode {
			ask = min((n+prefixSize-1)/prefixSize, p.limits.slots())
		}
		e, err := p.createENI(ctx, sn, ask)
		switch {
		case err == nil:
		case isCode(err, codeNoSubnetIPs):
			full[sn.id] = true
			continue
		case isCode(err, codeNoCIDRBlocks):
			p.cidrBackoff[sn.id] = backoff{until: time.Now().Add(p.cfg.CIDRBackoff.Duration), err: err}
			continue
		default:
			return nil, "", err
		}
		if p.cfg.PrefixMode {
			return p.spread(e, e.prefixes, n), "", nil
		}
		got := p.keepUsable(ctx, e, e.secondaries)
		for _, a := range got[:min(n, len(got))] {
			out = append(out, leaseOn{e, a})
		}
		return out, "", nil
	}
}

// assignOn assigns on one ENI the named addresses, or count addresses (or
// prefixes, in prefix mode) of EC2's choosing, and returns the new
// addresses (the prefixes' base addresses). On an ENI vpcni did not create
// an intent is recorded first (records.go). The caller holds p.mu.
func (p *Provider) assignOn(ctx context.Context, e *eni, named []netip.Addr, count int) (_ []netip.Addr, err error) {
	prefixes := p.cfg.PrefixMode && len(named) == 0
	ctx, done, err := p.beginAssign(ctx, e, !prefixes && p.answers != answersExact, count+len(named), false)
	if err != nil {
		return nil, err
	}
	defer done(&err)
	input := &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &e.id}
	switch {
	case len(named) > 0:
		for _, a := range named {
			input.PrivateIpAddresses = append(input.PrivateIpAddresses, a.String())
		}
	case prefixes:
		input.Ipv4PrefixCount = aws.Int32(int32(count))
	default:
		input.SecondaryPrivateIpAddressCount = aws.Int32(int32(count))
	}
	out, err := p.ec2.AssignPrivateIpAddresses(ctx, input)
	if err != nil {
		return nil, explain(fmt.Errorf("assign addresses on ENI %s: %w", e.id, err))
	}
	var got []netip.Addr
	if prefixes {
		// New prefixes: those not on the ENI before (the answer may list
		// them all).
		for _, x := range out.AssignedIpv4Prefixes {
			pf, err := netip.ParsePrefix(aws.ToString(x.Ipv4Prefix))
			if err == nil && !slices.Contains(e.prefixes, pf) {
				e.prefixes = append(e.prefixes, pf)
				got = append(got, pf.Addr())
			}
		}
		if !e.ours {
			var recs []string
			for _, a := range got {
				recs = append(recs, netip.PrefixFrom(a, 28).String())
			}
			p.rec.own(e.id, recs, time.Now().UTC())
		}
		return got, nil
	}
	// New addresses: EC2 answers with those the call assigned; moto with
	// every address of the ENI, so take those the ENI did not hold.
	p.answers = answersExact
	for _, x := range out.AssignedPrivateIpAddresses {
		a, err := netip.ParseAddr(aws.ToString(x.PrivateIpAddress))
		if a == e.primaryIP {
			p.answers = answersListing
		}
		if err == nil && a != e.primaryIP && !slices.Contains(e.secondaries, a) && !slices.Contains(got, a) {
			got = append(got, a)
		}
	}
	e.secondaries = append(e.secondaries, got...)
	if !e.ours {
		p.rec.own(e.id, addrStrings(got), time.Now().UTC())
	}
	if len(named) > 0 {
		return got, nil
	}
	return p.keepUsable(ctx, e, got), nil
}

// beginAssign readies an assignment on e, of either family: an intent
// still pending on e is settled by a fresh read first (settled later,
// together, one intent would count the other's addresses as its own
// gain, claim none of them, and leave vpcni's addresses looking like a
// person's); otherwise, with reread, e is read so that what the call adds
// can be told from what e held just before. On an ENI vpcni did not
// create it records an intent for count addresses (records.go). The
// caller makes its EC2 call with the returned context and defers done
// with its error. The caller holds p.mu.
func (p *Provider) beginAssign(ctx context.Context, e *eni, reread bool, count int, v6 bool) (_ context.Context, done func(*error), _ error) {
	switch {
	case !e.ours && p.rec.pendingOn(e.id):
		if err := p.settleNow(ctx, e); err != nil {
			return ctx, nil, err
		}
	case reread:
		if err := p.rereadENI(ctx, e); err != nil {
			return ctx, nil, err
		}
	}
	var in intent
	if !e.ours {
		in = intent{ENI: e.id, Before: e.holds(), Count: count, At: time.Now().UTC(), V6: v6}
		if err := p.rec.begin(in); err != nil {
			return ctx, nil, err
		}
	}
	ctx, attempts := countAttempts(ctx)
	return ctx, func(err *error) {
		if e.ours {
			return
		}
		// A call EC2 refused (a 4xx answer) at its only attempt did not
		// assign. One without an answer may have, and so may one answered
		// with a server error (EC2 may have acted before it failed) or an
		// attempt before a retry (its reply lost): the intent stays, for
		// all the attempts, until a read of the ENI settles it.
		switch {
		case attempts.Load() > 1:
			p.rec.Pending[slices.IndexFunc(p.rec.Pending, func(x intent) bool { return x.ENI == in.ENI && x.At.Equal(in.At) })].Count *= int(attempts.Load())
			if *err == nil {
				*err = p.settleNow(ctx, e)
			}
		case *err == nil || refused(*err):
			p.rec.end(in)
		}
	}, nil
}

// How the endpoint answers AssignPrivateIpAddresses: EC2 lists the
// addresses the call assigned (the API reference), moto every address of
// the ENI, its primary included. Until an answer shows which, and from
// then on for a listing endpoint, the ENI is read just before each call:
// with a listing answer, an address someone added since the provider's
// last read would otherwise look like one of the call's. Against EC2 that
// costs one read in the provider's life.
type answerStyle int

const (
	answersUnknown answerStyle = iota
	answersExact
	answersListing
)

// settleNow reads an ENI of someone else's again and settles the intents
// on it: the provider claims what its calls without an answer, or retried,
// assigned. The caller holds p.mu.
func (p *Provider) settleNow(ctx context.Context, e *eni) error {
	if err := p.rereadENI(ctx, e); err != nil {
		return err
	}
	claimed, unclaimed := p.rec.settle(e.id, e.holds())
	if len(claimed) > 0 {
		p.log.Info("an assign without an answer, or retried, had landed; its addresses are vpcni's", "eni", e.id, "addresses", claimed)
	}
	if len(unclaimed) > 0 {
		p.notice("retried_assign", fmt.Sprintf("ENI %s gained %v during a retried assign of vpcni's, more than its attempts asked for: someone else wrote at the same moment, so vpcni claims none of them", e.id, unclaimed), "eni", e.id, "addresses", unclaimed)
	}
	return nil
}

// rereadENI reads one ENI again into e (its addresses and prefixes).
func (p *Provider) rereadENI(ctx context.Context, e *eni) error {
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{e.id}})
	if err != nil {
		return explain(fmt.Errorf("read ENI %s: %w", e.id, err))
	}
	if len(out.NetworkInterfaces) != 1 {
		return fmt.Errorf("read ENI %s: EC2 listed %d ENIs", e.id, len(out.NetworkInterfaces))
	}
	n := p.parseENI(out.NetworkInterfaces[0])
	e.secondaries, e.prefixes, e.ipv6s, e.prefixes6 = n.secondaries, n.prefixes, n.ipv6s, n.prefixes6
	return nil
}

// keepUsable gives back at once what EC2 never hands out but an emulator
// does (moto picks at random over the whole CIDR, AWS-FACTS EX2, EX4): an
// address EC2 reserves in the subnet — a pod on the router's address
// would never reach it — or one another ENI of the instance holds. It
// returns the rest.
func (p *Provider) keepUsable(ctx context.Context, e *eni, got []netip.Addr) []netip.Addr {
	sn := p.subnets[e.subnetID]
	if sn == nil {
		return got
	}
	var bad []netip.Addr
	good := slices.DeleteFunc(slices.Clone(got), func(a netip.Addr) bool {
		held := slices.ContainsFunc(p.enis, func(o *eni) bool {
			return o.id != e.id && (o.primaryIP == a || slices.Contains(o.secondaries, a))
		})
		if !sn.usable(a) || held {
			bad = append(bad, a)
			return true
		}
		return false
	})
	if len(bad) > 0 {
		p.log.Warn("EC2 handed out addresses that are reserved in the subnet or held by another ENI of the instance; giving them back", "eni", e.id, "subnet", sn.cidr, "addresses", bad)
		if err := p.unassignOn(ctx, e, bad, nil); err != nil {
			p.log.Warn("giving reserved addresses back failed; they stay on the ENI, unused", "eni", e.id, "err", err)
		}
	}
	return good
}

// Release implements provider.Provider: vpcni's secondary addresses leave
// their ENIs in one call per ENI; an address of a prefix turns idle, and a
// prefix whose addresses are all idle leaves its ENI. An address vpcni did
// not put there is left alone and named in the error. IPv6 addresses go
// the same way (release6).
func (p *Provider) Release(ctx context.Context, addrs []netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readIfStale(ctx); err != nil {
		return err
	}
	var v6 []netip.Addr
	addrs = slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool {
		if family.Of(a) == family.V6 {
			v6 = append(v6, a)
			return true
		}
		return false
	})
	drop := map[string][]netip.Addr{}
	var foreign []string
	var errs []error
	if len(v6) > 0 {
		var err error
		foreign, err = p.release6(ctx, v6)
		errs = append(errs, err)
	}
	for _, a := range addrs {
		e, pf := p.locate(a)
		switch {
		case e == nil:
		case !p.owned(e, a, pf):
			foreign = append(foreign, fmt.Sprintf("%s (ENI %s)", a, e.id))
		case pf.IsValid():
			p.rec.setIdle([]netip.Addr{a}, true)
		default:
			drop[e.id] = append(drop[e.id], a)
		}
	}
	emptied := false
	for _, e := range slices.Clone(p.enis) {
		free := p.freePrefixes(e)
		if len(drop[e.id]) == 0 && len(free) == 0 {
			continue
		}
		err := p.unassignOn(ctx, e, drop[e.id], free)
		if err != nil && !errors.Is(err, errGone) {
			errs = append(errs, err)
			continue
		}
		emptied = emptied || e.ours && e.used() == 0
	}
	if err := p.rec.save(); err != nil {
		errs = append(errs, fmt.Errorf("save vpcni's address records: %w", err))
	}
	if emptied {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	if len(foreign) > 0 {
		errs = append(errs, fmt.Errorf("left %s: vpcni did not put them there", strings.Join(foreign, ", ")))
	}
	return errors.Join(errs...)
}

// unassignOn takes addresses and prefixes off an ENI (one call each) and
// forgets them. An ENI that is gone holds nothing any more. The caller
// holds p.mu.
func (p *Provider) unassignOn(ctx context.Context, e *eni, addrs []netip.Addr, prefixes []netip.Prefix) error {
	if len(addrs) > 0 {
		_, err := p.ec2.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &e.id, PrivateIpAddresses: addrStrings(addrs)})
		if err != nil && !isCode(err, codeENINotFound) {
			return explain(fmt.Errorf("unassign %v from ENI %s: %w", addrs, e.id, err))
		}
		e.secondaries = slices.DeleteFunc(e.secondaries, func(a netip.Addr) bool { return slices.Contains(addrs, a) })
		p.rec.disown(e.id, addrStrings(addrs))
	}
	if len(prefixes) > 0 {
		var ps []string
		for _, pf := range prefixes {
			ps = append(ps, pf.String())
		}
		_, err := p.ec2.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &e.id, Ipv4Prefixes: ps})
		if err != nil && !isCode(err, codeENINotFound) {
			return explain(fmt.Errorf("unassign prefixes %v from ENI %s: %w", ps, e.id, err))
		}
		e.prefixes = slices.DeleteFunc(e.prefixes, func(pf netip.Prefix) bool { return slices.Contains(prefixes, pf) })
		p.rec.disown(e.id, ps)
		for _, pf := range prefixes {
			p.rec.setIdle(expand(pf), false)
		}
	}
	return nil
}

func addrStrings(addrs []netip.Addr) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}
