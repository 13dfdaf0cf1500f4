package aws

import (
	"net/netip"
	"slices"
)

// Prefix mode (prefixMode: true). An ENI slot holds a /28 prefix — 16
// addresses, every one of them a pod's to use — instead of one secondary
// address, so the node holds 16 times the pods per ENI and a refill of up
// to 16 addresses is one AssignPrivateIpAddresses{Ipv4PrefixCount} call.
//
// The agent's pool asks for and gives back single addresses; a prefix
// comes and goes whole. So a prefix's addresses the agent did not ask for
// yet, and those it gave back, are idle: kept on the ENI, not listed by
// Held, handed out first by the next Assign (no EC2 call). The agent gives
// an address back only once it is free and cooled, so a prefix whose 16
// addresses are all idle is free and cooled as a whole: then, and only
// then, it is unassigned. The idle set is kept with the ownership records
// (records.go), so a restart neither lists idle addresses as held nor
// forgets that a prefix is free.
//
// A prefix must be an aligned, free /28 of the subnet. A subnet fragmented
// by single addresses has none although it has free addresses, and EC2
// answers InsufficientCidrBlocks; retrying cannot help until addresses
// are freed, so the subnet is not asked again for cidrBackoff, and the
// error names the fix: a subnet CIDR reservation of type prefix.

// expand lists the addresses of a prefix.
func expand(p netip.Prefix) []netip.Addr {
	p = p.Masked()
	n := 1 << (32 - p.Bits())
	out := make([]netip.Addr, 0, n)
	for a := p.Addr(); len(out) < n && p.Contains(a); a = a.Next() {
		out = append(out, a)
	}
	return out
}

// takeIdle hands out up to n idle addresses of vpcni's prefixes, lowest
// first, marking them held again (records not saved). The caller holds
// p.mu.
func (p *Provider) takeIdle(n int) (out []leaseOn) {
	for _, e := range p.enis {
		if p.draining[e.id] {
			continue
		}
		for _, pf := range e.prefixes {
			if !e.ours && !p.rec.owns(e.id, pf.String()) {
				continue
			}
			for _, a := range expand(pf) {
				if len(out) < n && p.rec.isIdle(a) {
					out = append(out, leaseOn{e, a})
				}
			}
		}
	}
	taken := make([]netip.Addr, len(out))
	for i, l := range out {
		taken[i] = l.addr
	}
	p.rec.setIdle(taken, false)
	return out
}

// leaseOn is an address on one ENI.
type leaseOn struct {
	e    *eni
	addr netip.Addr
}

// spread hands out n addresses of new prefixes on e and sets the rest
// idle (records not saved).
func (p *Provider) spread(e *eni, prefixes []netip.Prefix, n int) (out []leaseOn) {
	var rest []netip.Addr
	for _, pf := range prefixes {
		for _, a := range expand(pf) {
			if len(out) < n {
				out = append(out, leaseOn{e, a})
			} else {
				rest = append(rest, a)
			}
		}
	}
	p.rec.setIdle(rest, true)
	return out
}

// freePrefixes are e's prefixes of vpcni's whose 16 addresses are all
// idle.
func (p *Provider) freePrefixes(e *eni) []netip.Prefix {
	var out []netip.Prefix
	for _, pf := range e.prefixes {
		if !e.ours && !p.rec.owns(e.id, pf.String()) {
			continue
		}
		if !slices.ContainsFunc(expand(pf), func(a netip.Addr) bool { return !p.rec.isIdle(a) }) {
			out = append(out, pf)
		}
	}
	return out
}
