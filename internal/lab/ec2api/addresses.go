package ec2api

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
)

// prefixBits: EC2 delegates IPv4 prefixes as /28s (16 addresses), each
// taking one of the ENI's Ipv4AddressesPerInterface slots.
const prefixBits = 28

func (sn *subnet) size() int { return 1 << (32 - sn.cidr.Bits()) }

func offset(p netip.Prefix, a netip.Addr) int {
	b, n := p.Addr().As4(), a.As4()
	return int(binary.BigEndian.Uint32(n[:]) - binary.BigEndian.Uint32(b[:]))
}

func nth(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], binary.BigEndian.Uint32(b[:])+uint32(i))
	return netip.AddrFrom4(out)
}

// reserved: EC2 keeps the first four addresses of every subnet (network,
// router, DNS, future use) and the last (broadcast) for itself.
func (sn *subnet) reserved(a netip.Addr) bool {
	off := offset(sn.cidr, a)
	return off < 4 || off == sn.size()-1
}

// available is AvailableIpAddressCount: a prefix holds all 16 of its
// addresses. It cannot go below zero: nothing is handed out that is not
// free.
func (sn *subnet) available() int {
	return sn.size() - 5 - len(sn.used) - (1<<(32-prefixBits))*len(sn.prefixes)
}

// holder is the ENI holding a, as an address or inside a prefix.
func (sn *subnet) holder(a netip.Addr) (eniID string, inPrefix bool) {
	if id, ok := sn.used[a]; ok {
		return id, false
	}
	if id, ok := sn.prefixes[netip.PrefixFrom(a, prefixBits).Masked()]; ok {
		return id, true
	}
	return "", false
}

func (sn *subnet) free(a netip.Addr) bool {
	id, _ := sn.holder(a)
	return sn.cidr.Contains(a) && !sn.reserved(a) && id == ""
}

// pick takes the n lowest free addresses, apart from those in skip.
func (sn *subnet) pick(n int, skip ...netip.Addr) ([]netip.Addr, *apiError) {
	var out []netip.Addr
	for i := 4; i < sn.size()-1 && len(out) < n; i++ {
		if a := nth(sn.cidr, i); sn.free(a) && !slices.Contains(skip, a) {
			out = append(out, a)
		}
	}
	if len(out) < n {
		return nil, errorf(400, "InsufficientFreeAddressesInSubnet", "The specified subnet does not contain enough free private IP addresses to fulfill your request.")
	}
	return out, nil
}

// prefixFree: every address of p is in the subnet, not reserved and held
// by nobody.
func (sn *subnet) prefixFree(p netip.Prefix) bool {
	if !sn.cidr.Contains(p.Addr()) || sn.cidr.Bits() > prefixBits {
		return false
	}
	for i := range 1 << (32 - prefixBits) {
		if !sn.free(nth(p, i)) {
			return false
		}
	}
	return true
}

// pickPrefixes takes the n lowest aligned /28s that are wholly free. A
// subnet with free addresses scattered over every /28 has none: that is
// EC2's InsufficientCidrBlocks (its text from the EKS best-practices
// guide), fixed there with a subnet CIDR reservation.
func (sn *subnet) pickPrefixes(n int) ([]netip.Prefix, *apiError) {
	var out []netip.Prefix
	if sn.cidr.Bits() <= prefixBits {
		for i := 0; i < sn.size() && len(out) < n; i += 1 << (32 - prefixBits) {
			if p := netip.PrefixFrom(nth(sn.cidr, i), prefixBits); sn.prefixFree(p) {
				out = append(out, p)
			}
		}
	}
	if len(out) < n {
		return nil, errorf(400, "InsufficientCidrBlocks", "There are not enough free cidr blocks in the specified subnet to satisfy the request.")
	}
	return out, nil
}

// checkAddr: a is a usable address of the subnet. Outside addresses and
// reserved ones are InvalidParameterValue: the errors page names no code
// of their own.
func checkAddr(sn *subnet, a netip.Addr) *apiError {
	if !a.Is4() || !sn.cidr.Contains(a) {
		return invalidValue("Address %s does not fall within the subnet's address range", a)
	}
	if sn.reserved(a) {
		return invalidValue("Address %s is in subnet's reserved address range", a)
	}
	return nil
}

// checkFree: a may be given to a new holder.
func checkFree(sn *subnet, a netip.Addr) *apiError {
	if err := checkAddr(sn, a); err != nil {
		return err
	}
	if id, _ := sn.holder(a); id != "" {
		return errAddressInUse(a)
	}
	return nil
}

// checkPrefix: p is an aligned /28 of the subnet, wholly free.
func checkPrefix(sn *subnet, raw string) (netip.Prefix, *apiError) {
	p, err := netip.ParsePrefix(raw)
	if err != nil || !p.Addr().Is4() || p.Bits() != prefixBits || p.Masked() != p {
		return netip.Prefix{}, invalidValue("Prefix %s is not an aligned IPv4 /%d", raw, prefixBits)
	}
	if !sn.cidr.Contains(p.Addr()) || sn.cidr.Bits() > prefixBits {
		return netip.Prefix{}, invalidValue("Prefix %s does not fall within the subnet's address range", p)
	}
	if !sn.prefixFree(p) {
		return netip.Prefix{}, invalidValue("Prefix %s overlaps addresses in use or reserved", p)
	}
	return p, nil
}

// holding is one family's addresses and prefixes as a subnet and an ENI
// keep them: the subnet's maps (who holds each) and the ENI's lists.
type holding struct {
	used     map[netip.Addr]string
	prefixes map[netip.Prefix]string
	ips      *[]netip.Addr
	pfx      *[]netip.Prefix
}

// holdingOf is e's holding of IPv4 or (v6) IPv6, with its subnet's.
func (s *Server) holdingOf(e *ENI, v6 bool) holding {
	sn := s.subnets[e.SubnetID]
	if v6 {
		return holding{sn.used6, sn.prefixes6, &e.IPv6s, &e.IPv6Prefixes}
	}
	return holding{sn.used, sn.prefixes, &e.PrivateIPs, &e.Prefixes}
}

// give records addresses and prefixes as eniID's.
func (h holding) give(eniID string, ips []netip.Addr, prefixes []netip.Prefix) {
	for _, a := range ips {
		h.used[a] = eniID
		*h.ips = append(*h.ips, a)
	}
	for _, p := range prefixes {
		h.prefixes[p] = eniID
		*h.pfx = append(*h.pfx, p)
	}
}

// drop forgets addresses and prefixes.
func (h holding) drop(ips []netip.Addr, prefixes []netip.Prefix) {
	for _, a := range ips {
		delete(h.used, a)
		*h.ips = slices.DeleteFunc(*h.ips, func(x netip.Addr) bool { return x == a })
	}
	for _, p := range prefixes {
		delete(h.prefixes, p)
		*h.pfx = slices.DeleteFunc(*h.pfx, func(x netip.Prefix) bool { return x == p })
	}
}

// take gives IPv4 addresses and prefixes to e; the first address of an
// ENI without one becomes its primary.
func (s *Server) take(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	s.holdingOf(e, false).give(e.ID, ips, prefixes)
	if !e.PrimaryIP.IsValid() && len(ips) > 0 {
		e.PrimaryIP = ips[0]
	}
}

// release takes IPv4 addresses and prefixes back from e.
func (s *Server) release(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	s.holdingOf(e, false).drop(ips, prefixes)
}

// askWays name a call's four ways to ask for addresses (by count, by
// address, prefixes by count, by prefix), for its errors.
type askWays struct{ count, addrs, pcount, prefixes string }

var (
	ways4 = askWays{"secondary private IP address count", "private IP addresses", "IPv4 prefix count", "IPv4 prefixes"}
	ways6 = askWays{"IPv6 address count", "IPv6 addresses", "IPv6 prefix count", "IPv6 prefixes"}
)

// checkOneWay: a request asks exactly one way (an address or prefix list
// is given when non-empty), and a count it gives is at least 1.
func checkOneWay(w askWays, hasCount bool, count, addrs int, hasPCount bool, pcount, prefixes int) *apiError {
	given := 0
	for _, b := range []bool{hasCount, addrs > 0, hasPCount, prefixes > 0} {
		if b {
			given++
		}
	}
	an := func(s string) string {
		if strings.IndexAny(s[:1], "AEIOU") == 0 {
			return "an " + s
		}
		return "a " + s
	}
	switch {
	case given == 0:
		return errorf(400, "MissingParameter", "Either %s, %s, %s or %s must be specified.", an(w.count), w.addrs, an(w.pcount), w.prefixes)
	case given > 1:
		return errorf(400, "InvalidParameterCombination", "Only one of the %s, %s, the %s and %s may be specified.", w.count, w.addrs, w.pcount, w.prefixes)
	case hasCount && count < 1, hasPCount && pcount < 1:
		return invalidValue("The count must be at least 1.")
	}
	return nil
}

// assignedPrefixes parses the prefixes an unassign names, each one e
// holds (on).
func assignedPrefixes(raw []string, on []netip.Prefix, eniID string) ([]netip.Prefix, *apiError) {
	var out []netip.Prefix
	for _, r := range raw {
		p, err := netip.ParsePrefix(r)
		if err != nil || !slices.Contains(on, p) {
			return nil, invalidValue("Some of the specified prefixes are not assigned to interface %s", eniID)
		}
		out = append(out, p)
	}
	return out, nil
}

// slotLimit is Ipv4AddressesPerInterface of the instance e is attached to.
// A detached ENI has no instance type to hold it to; attaching checks it.
func (s *Server) slotLimit(e *ENI) (int, bool) {
	if !e.attached() {
		return 0, false
	}
	return s.types[s.instances[e.InstanceID].typ].IPv4PerENI, true
}

// slots: the primary, each secondary and each prefix take one.
func slots(e *ENI) int { return len(e.PrivateIPs) + len(e.Prefixes) }

func errIPLimit() *apiError {
	return errorf(400, "PrivateIpAddressLimitExceeded", "You've reached the limit on the number of private IP addresses that you can assign to the specified network interface for that type of instance.")
}

func (s *Server) assignPrivateIPs(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	count, hasCount, aerr := f.integer("SecondaryPrivateIpAddressCount")
	if aerr != nil {
		return nil, aerr
	}
	pcount, hasPCount, aerr := f.integer("Ipv4PrefixCount")
	if aerr != nil {
		return nil, aerr
	}
	addrs, aerr := f.addrs("PrivateIpAddress")
	if aerr != nil {
		return nil, aerr
	}
	rawPrefixes := f.list("Ipv4Prefix")
	reassign, aerr := f.boolean("AllowReassignment")
	if aerr != nil {
		return nil, aerr
	}
	if aerr := checkOneWay(ways4, hasCount, count, len(addrs), hasPCount, pcount, len(rawPrefixes)); aerr != nil {
		return nil, aerr
	}
	sn := s.subnets[e.SubnetID]
	out := &assignResult{ENI: e.ID}
	var ips, already []netip.Addr
	var prefixes []netip.Prefix
	moves := map[*ENI][]netip.Addr{}
	switch {
	case hasCount, hasPCount:
		// picked below, once the limit is checked
	case len(rawPrefixes) > 0:
		for _, raw := range rawPrefixes {
			p, aerr := checkPrefix(sn, raw)
			if aerr != nil {
				return nil, aerr
			}
			if slices.Contains(prefixes, p) {
				return nil, invalidValue("Prefix %s is given twice", p)
			}
			prefixes = append(prefixes, p)
		}
	default:
		for _, a := range addrs {
			if slices.Contains(ips, a) || slices.Contains(already, a) {
				return nil, invalidValue("Address %s is given twice", a)
			}
			if aerr := checkAddr(sn, a); aerr != nil {
				return nil, aerr
			}
			id, inPrefix := sn.holder(a)
			switch other := s.enis[id]; {
			case id == "":
				ips = append(ips, a)
			case !reassign || inPrefix || other.PrimaryIP == a:
				// A primary address or one inside a prefix never moves.
				return nil, errAddressInUse(a)
			case id == e.ID:
				already = append(already, a)
			default:
				moves[other] = append(moves[other], a)
				ips = append(ips, a)
			}
		}
	}
	if lim, ok := s.slotLimit(e); ok && slots(e)+max(count, 0)+max(pcount, 0)+len(ips)+len(prefixes) > lim {
		return nil, errIPLimit()
	}
	if hasCount {
		if ips, aerr = sn.pick(count); aerr != nil {
			return nil, aerr
		}
	}
	if hasPCount {
		if prefixes, aerr = sn.pickPrefixes(pcount); aerr != nil {
			return nil, aerr
		}
	}
	for other, moved := range moves {
		s.release(other, moved, nil)
	}
	s.take(e, ips, prefixes)
	s.changed()
	// EC2 answers with the addresses this call assigned (moto lists every
	// address of the ENI).
	for _, a := range append(already, ips...) {
		out.IPs = append(out.IPs, xmlAssigned{IP: a.String()})
	}
	for _, p := range prefixes {
		out.Prefixes = append(out.Prefixes, xmlPrefix{Prefix: p.String()})
	}
	return out, nil
}

func (s *Server) unassignPrivateIPs(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	addrs, aerr := f.addrs("PrivateIpAddress")
	if aerr != nil {
		return nil, aerr
	}
	raw := f.list("Ipv4Prefix")
	if len(addrs) == 0 && len(raw) == 0 {
		return nil, errorf(400, "MissingParameter", "Either private IP addresses or IPv4 prefixes must be specified.")
	}
	for _, a := range addrs {
		if a == e.PrimaryIP {
			return nil, invalidValue("The primary IP address %s of an interface cannot be unassigned.", a)
		}
		if !slices.Contains(e.PrivateIPs, a) {
			return nil, invalidValue("Some of the specified addresses are not assigned to interface %s", e.ID)
		}
	}
	prefixes, aerr := assignedPrefixes(raw, e.Prefixes, e.ID)
	if aerr != nil {
		return nil, aerr
	}
	s.release(e, addrs, prefixes)
	s.changed()
	return ok(), nil
}
