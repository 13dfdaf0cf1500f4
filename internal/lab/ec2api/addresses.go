package ec2api

import (
	"encoding/binary"
	"net/netip"
	"slices"
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

// take gives addresses and prefixes to e; the first address of an ENI
// without one becomes its primary.
func (s *Server) take(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	sn := s.subnets[e.SubnetID]
	for _, a := range ips {
		sn.used[a] = e.ID
		if !e.PrimaryIP.IsValid() {
			e.PrimaryIP = a
		}
		e.PrivateIPs = append(e.PrivateIPs, a)
	}
	for _, p := range prefixes {
		sn.prefixes[p] = e.ID
		e.Prefixes = append(e.Prefixes, p)
	}
}

// release takes addresses and prefixes back from e.
func (s *Server) release(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	sn := s.subnets[e.SubnetID]
	for _, a := range ips {
		delete(sn.used, a)
		e.PrivateIPs = slices.DeleteFunc(e.PrivateIPs, func(x netip.Addr) bool { return x == a })
	}
	for _, p := range prefixes {
		delete(sn.prefixes, p)
		e.Prefixes = slices.DeleteFunc(e.Prefixes, func(x netip.Prefix) bool { return x == p })
	}
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
	given := 0
	for _, b := range []bool{hasCount, len(addrs) > 0, hasPCount, len(rawPrefixes) > 0} {
		if b {
			given++
		}
	}
	switch {
	case given == 0:
		return nil, errorf(400, "MissingParameter", "Either a secondary private IP address count, private IP addresses, an IPv4 prefix count or IPv4 prefixes must be specified.")
	case given > 1:
		return nil, errorf(400, "InvalidParameterCombination", "Only one of the secondary private IP address count, private IP addresses, the IPv4 prefix count and IPv4 prefixes may be specified.")
	case hasCount && count < 1, hasPCount && pcount < 1:
		return nil, invalidValue("The count must be at least 1.")
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
	var prefixes []netip.Prefix
	for _, r := range raw {
		p, err := netip.ParsePrefix(r)
		if err != nil || !slices.Contains(e.Prefixes, p) {
			return nil, invalidValue("Some of the specified prefixes are not assigned to interface %s", e.ID)
		}
		prefixes = append(prefixes, p)
	}
	s.release(e, addrs, prefixes)
	s.changed()
	return ok(), nil
}
