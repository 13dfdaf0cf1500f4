package ec2api

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// IPv6 as EC2 gives it: a subnet may hold an IPv6 block (a /64 on EC2)
// beside its IPv4 CIDR; an ENI in it takes IPv6 addresses and /80
// prefixes from that block with AssignIpv6Addresses, each address and
// each /80 taking one of the type's Ipv6AddressesPerInterface slots
// (AWS-FACTS §2.4: "each prefix … counts as one IP address"). Addresses
// are never scarce in a /64 (2^64), so unlike IPv4 nothing here counts
// free addresses; a /80 must be aligned and wholly free, and a subnet
// without one left answers InsufficientCidrBlocks as for /28s.

// prefix6Bits: EC2 delegates IPv6 prefixes as /80s (2^48 addresses).
const prefix6Bits = 80

// subnet6Bits bound the IPv6 block a lab subnet may hold: EC2 gives
// subnets a /64 (up to a /44 with IPAM); the lab also takes longer ones,
// to /78, so a test can run out of /80s in a few calls.
const subnet6Min, subnet6Max = 44, 78

// add6 is a + n<<shift in 128-bit arithmetic (shift < 64).
func add6(a netip.Addr, n uint64, shift uint) netip.Addr {
	b := a.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	addHi, addLo := uint64(0), n<<shift
	if shift > 0 {
		addHi = n >> (64 - shift)
	}
	nlo := lo + addLo
	if nlo < lo {
		hi++
	}
	hi += addHi
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], nlo)
	return netip.AddrFrom16(b)
}

// last6 is the block's last address.
func last6(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom16(b)
}

// reserved6: EC2 keeps the first four and the last address of a
// subnet's IPv6 block, as of its IPv4 CIDR.
func (sn *subnet) reserved6(a netip.Addr) bool {
	base := sn.cidr6.Addr()
	return a == last6(sn.cidr6) || a == base || a == add6(base, 1, 0) || a == add6(base, 2, 0) || a == add6(base, 3, 0)
}

// holder6 is the ENI holding a, as an address or inside a /80.
func (sn *subnet) holder6(a netip.Addr) (eniID string, inPrefix bool) {
	if id, ok := sn.used6[a]; ok {
		return id, false
	}
	if id, ok := sn.prefixes6[netip.PrefixFrom(a, prefix6Bits).Masked()]; ok {
		return id, true
	}
	return "", false
}

// prefix6Count is how many /80s the subnet's block holds (at most 2^34
// for a /46; a /44 is capped there, which no test reaches).
func (sn *subnet) prefix6Count() uint64 {
	return 1 << min(prefix6Bits-sn.cidr6.Bits(), 34)
}

// pick6 takes the n lowest free addresses of the block, apart from skip.
// The lowest /80 holds the reserved addresses, so no prefix is ever
// given there and addresses stay clear of the prefixes handed out.
func (sn *subnet) pick6(n int, skip []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for a := add6(sn.cidr6.Addr(), 4, 0); len(out) < n && sn.cidr6.Contains(a); {
		id, inPrefix := sn.holder6(a)
		switch {
		case inPrefix: // jump past the held /80
			a = add6(netip.PrefixFrom(a, prefix6Bits).Masked().Addr(), 1, 128-prefix6Bits)
			continue
		case id == "" && !sn.reserved6(a) && !slices.Contains(skip, a):
			out = append(out, a)
		}
		a = add6(a, 1, 0)
	}
	return out
}

// prefix6Free: every address of the /80 p is in the block, not reserved
// and held by nobody.
func (sn *subnet) prefix6Free(p netip.Prefix, busy map[netip.Prefix]bool) bool {
	if !sn.cidr6.Contains(p.Addr()) || sn.cidr6.Bits() > prefix6Bits || busy[p] {
		return false
	}
	_, held := sn.prefixes6[p]
	return !held && !p.Contains(sn.cidr6.Addr()) && !p.Contains(last6(sn.cidr6))
}

// busy6 are the /80s holding an address given out alone.
func (sn *subnet) busy6() map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	for a := range sn.used6 {
		out[netip.PrefixFrom(a, prefix6Bits).Masked()] = true
	}
	return out
}

// pickPrefixes6 takes the n lowest wholly free aligned /80s.
func (sn *subnet) pickPrefixes6(n int) ([]netip.Prefix, *apiError) {
	busy := sn.busy6()
	var out []netip.Prefix
	for i := uint64(0); i < sn.prefix6Count() && len(out) < n; i++ {
		if p := netip.PrefixFrom(add6(sn.cidr6.Addr(), i, 128-prefix6Bits), prefix6Bits); sn.prefix6Free(p, busy) {
			out = append(out, p)
		}
	}
	if len(out) < n {
		return nil, errorf(400, "InsufficientCidrBlocks", "There are not enough free cidr blocks in the specified subnet to satisfy the request.")
	}
	return out, nil
}

// errNoIPv6 answers an IPv6 request on a subnet without an IPv6 block.
// The code EC2 gives was not verified; moto fails with a 500 here
// (AWS-FACTS V63).
func errNoIPv6(subnetID string) *apiError {
	return invalidValue("The subnet '%s' has no IPv6 CIDR block: associate one with the subnet first.", subnetID)
}

func errIPv6Limit() *apiError {
	return errorf(400, "PrivateIpAddressLimitExceeded", "You've reached the limit on the number of IPv6 addresses that you can assign to the specified network interface for that type of instance.")
}

// checkFree6: a may be given to a new holder.
func checkFree6(sn *subnet, raw string) (netip.Addr, *apiError) {
	a, err := netip.ParseAddr(raw)
	switch {
	case err != nil || !a.Is6() || a.Is4In6():
		return netip.Addr{}, invalidValue("Invalid IPv6 address %q", raw)
	case !sn.cidr6.Contains(a):
		return netip.Addr{}, invalidValue("Address %s does not fall within the subnet's IPv6 address range", a)
	case sn.reserved6(a):
		return netip.Addr{}, invalidValue("Address %s is in subnet's reserved address range", a)
	}
	if id, _ := sn.holder6(a); id != "" {
		return netip.Addr{}, errAddressInUse(a)
	}
	return a, nil
}

// checkPrefix6: raw is an aligned /80 of the block, wholly free.
func checkPrefix6(sn *subnet, raw string) (netip.Prefix, *apiError) {
	p, err := netip.ParsePrefix(raw)
	if err != nil || !p.Addr().Is6() || p.Bits() != prefix6Bits || p.Masked() != p {
		return netip.Prefix{}, invalidValue("Prefix %s is not an aligned IPv6 /%d", raw, prefix6Bits)
	}
	if !sn.prefix6Free(p, sn.busy6()) {
		if !sn.cidr6.Contains(p.Addr()) {
			return netip.Prefix{}, invalidValue("Prefix %s does not fall within the subnet's IPv6 address range", p)
		}
		return netip.Prefix{}, invalidValue("Prefix %s overlaps addresses in use or reserved", p)
	}
	return p, nil
}

// take6 gives IPv6 addresses and prefixes to e.
func (s *Server) take6(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	s.holdingOf(e, true).give(e.ID, ips, prefixes)
}

// release6 takes IPv6 addresses and prefixes back from e.
func (s *Server) release6(e *ENI, ips []netip.Addr, prefixes []netip.Prefix) {
	s.holdingOf(e, true).drop(ips, prefixes)
}

// slots6: each IPv6 address and each /80 take one.
func slots6(e *ENI) int { return len(e.IPv6s) + len(e.IPv6Prefixes) }

// v6Request is what an IPv6 assignment asks for: a count of addresses,
// given addresses, a count of /80s or given /80s.
type v6Request struct {
	count, pcount       int
	addrs               []netip.Addr
	prefixes            []netip.Prefix
	hasCount, hasPCount bool
}

// resolve checks the request against the subnet and e's limit, then picks
// what it counts; nothing is taken yet.
func (s *Server) resolve6(e *ENI, r *v6Request) *apiError {
	sn := s.subnets[e.SubnetID]
	if !sn.cidr6.IsValid() {
		return errNoIPv6(sn.id)
	}
	if e.attached() {
		if lim := s.types[s.instances[e.InstanceID].typ].IPv6PerENI; slots6(e)+r.count+r.pcount+len(r.addrs)+len(r.prefixes) > lim {
			return errIPv6Limit()
		}
	}
	if r.count > 0 {
		r.addrs = append(r.addrs, sn.pick6(r.count, r.addrs)...)
	}
	if r.pcount > 0 {
		ps, aerr := sn.pickPrefixes6(r.pcount)
		if aerr != nil {
			return aerr
		}
		r.prefixes = append(r.prefixes, ps...)
	}
	return nil
}

// read6 reads the given addresses and prefixes of a request (keys differ
// between AssignIpv6Addresses and CreateNetworkInterface).
func read6(sn *subnet, rawAddrs, rawPrefixes []string, r *v6Request) *apiError {
	if (len(rawAddrs) > 0 || len(rawPrefixes) > 0) && !sn.cidr6.IsValid() {
		return errNoIPv6(sn.id)
	}
	for _, raw := range rawAddrs {
		a, aerr := checkFree6(sn, raw)
		if aerr != nil {
			return aerr
		}
		if slices.Contains(r.addrs, a) {
			return invalidValue("Address %s is given twice", a)
		}
		r.addrs = append(r.addrs, a)
	}
	for _, raw := range rawPrefixes {
		p, aerr := checkPrefix6(sn, raw)
		if aerr != nil {
			return aerr
		}
		if slices.Contains(r.prefixes, p) {
			return invalidValue("Prefix %s is given twice", p)
		}
		r.prefixes = append(r.prefixes, p)
	}
	return nil
}

func (s *Server) assignIPv6(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	var r v6Request
	if r.count, r.hasCount, aerr = f.integer("Ipv6AddressCount"); aerr != nil {
		return nil, aerr
	}
	if r.pcount, r.hasPCount, aerr = f.integer("Ipv6PrefixCount"); aerr != nil {
		return nil, aerr
	}
	rawAddrs, rawPrefixes := f.list("Ipv6Addresses"), f.list("Ipv6Prefix")
	if aerr := checkOneWay(ways6, r.hasCount, r.count, len(rawAddrs), r.hasPCount, r.pcount, len(rawPrefixes)); aerr != nil {
		return nil, aerr
	}
	sn := s.subnets[e.SubnetID]
	if aerr := read6(sn, rawAddrs, rawPrefixes, &r); aerr != nil {
		return nil, aerr
	}
	if aerr := s.resolve6(e, &r); aerr != nil {
		return nil, aerr
	}
	s.take6(e, r.addrs, r.prefixes)
	s.changed()
	// Only what this call assigned, as the SDK documents it ("existing
	// IPv6 addresses … are not included"); moto lists every address of the
	// ENI (AWS-FACTS V61).
	out := &assign6Result{ENI: e.ID}
	for _, a := range r.addrs {
		out.IPs = append(out.IPs, a.String())
	}
	for _, p := range r.prefixes {
		out.Prefixes = append(out.Prefixes, p.String())
	}
	return out, nil
}

func (s *Server) unassignIPv6(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	rawAddrs, rawPrefixes := f.list("Ipv6Addresses"), f.list("Ipv6Prefix")
	if len(rawAddrs) == 0 && len(rawPrefixes) == 0 {
		return nil, errorf(400, "MissingParameter", "Either IPv6 addresses or IPv6 prefixes must be specified.")
	}
	var addrs []netip.Addr
	for _, raw := range rawAddrs {
		a, err := netip.ParseAddr(raw)
		if err != nil || !slices.Contains(e.IPv6s, a) {
			return nil, invalidValue("Some of the specified addresses are not assigned to interface %s", e.ID)
		}
		addrs = append(addrs, a)
	}
	prefixes, aerr := assignedPrefixes(rawPrefixes, e.IPv6Prefixes, e.ID)
	if aerr != nil {
		return nil, aerr
	}
	s.release6(e, addrs, prefixes)
	s.changed()
	out := &unassign6Result{ENI: e.ID}
	for _, a := range addrs {
		out.IPs = append(out.IPs, a.String())
	}
	for _, p := range prefixes {
		out.Prefixes = append(out.Prefixes, p.String())
	}
	return out, nil
}

// createENI6 gives a new ENI the IPv6 addresses and prefixes that
// CreateNetworkInterface asks for (Ipv6AddressCount, Ipv6Addresses.N,
// Ipv6PrefixCount, Ipv6Prefix.N).
func (s *Server) createENI6(f form, e *ENI) *apiError {
	var r v6Request
	var aerr *apiError
	if r.count, r.hasCount, aerr = f.integer("Ipv6AddressCount"); aerr != nil {
		return aerr
	}
	if r.pcount, r.hasPCount, aerr = f.integer("Ipv6PrefixCount"); aerr != nil {
		return aerr
	}
	var rawAddrs, rawPrefixes []string
	for _, m := range f.members("Ipv6Addresses") {
		rawAddrs = append(rawAddrs, f.str(m+".Ipv6Address"))
	}
	for _, m := range f.members("Ipv6Prefix") {
		rawPrefixes = append(rawPrefixes, f.str(m+".Ipv6Prefix"))
	}
	switch {
	case r.count < 0 || r.pcount < 0:
		return invalidValue("A count may not be negative.")
	case r.count > 0 && len(rawAddrs) > 0:
		return errorf(400, "InvalidParameterCombination", "Ipv6AddressCount and Ipv6Addresses may not be specified together.")
	case r.pcount > 0 && len(rawPrefixes) > 0:
		return errorf(400, "InvalidParameterCombination", "Ipv6PrefixCount and Ipv6Prefixes may not be specified together.")
	case r.count == 0 && r.pcount == 0 && len(rawAddrs) == 0 && len(rawPrefixes) == 0:
		return nil
	}
	sn := s.subnets[e.SubnetID]
	if aerr := read6(sn, rawAddrs, rawPrefixes, &r); aerr != nil {
		return aerr
	}
	if aerr := s.resolve6(e, &r); aerr != nil {
		return aerr
	}
	s.take6(e, r.addrs, r.prefixes)
	return nil
}

// AddVPCIPv6 gives a VPC an IPv6 block (EC2 gives a /56).
func (s *Server) AddVPCIPv6(vpcID string, cidr netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vpcs[vpcID]
	switch {
	case !ok:
		return fmt.Errorf("vpc %s: %w", vpcID, errVPCNotFound(vpcID))
	case !cidr.Addr().Is6() || cidr.Addr().Is4In6() || cidr.Bits() < 40 || cidr.Bits() > 64:
		return fmt.Errorf("VPC IPv6 block %s: an IPv6 /40 to /64 is needed", cidr)
	case v.cidr6.IsValid():
		return fmt.Errorf("vpc %s already holds the IPv6 block %s", vpcID, v.cidr6)
	}
	v.cidr6, v.assoc6 = cidr.Masked(), newID("vpc-cidr-assoc-")
	return nil
}

// AddSubnetIPv6 associates an IPv6 block with a subnet, as EC2's
// AssociateSubnetCidrBlock: a /64 on EC2 (the lab takes /44 to /78), inside
// the VPC's IPv6 block if it has one, overlapping no other subnet's. ENIs
// already in the subnet may then take IPv6 addresses.
func (s *Server) AddSubnetIPv6(subnetID string, cidr netip.Prefix) error {
	defer s.runHooks()
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.subnets[subnetID]
	if !ok {
		return errSubnetNotFound(subnetID)
	}
	cidr = cidr.Masked()
	v := s.vpcs[sn.vpcID]
	switch {
	case !cidr.Addr().Is6() || cidr.Addr().Is4In6() || cidr.Bits() < subnet6Min || cidr.Bits() > subnet6Max:
		return fmt.Errorf("subnet IPv6 block %s: an IPv6 /%d to /%d is needed", cidr, subnet6Min, subnet6Max)
	case sn.cidr6.IsValid():
		return fmt.Errorf("subnet %s already holds the IPv6 block %s", subnetID, sn.cidr6)
	case v.cidr6.IsValid() && (!v.cidr6.Contains(cidr.Addr()) || v.cidr6.Bits() > cidr.Bits()):
		return fmt.Errorf("subnet IPv6 block %s is not inside the VPC's %s", cidr, v.cidr6)
	}
	for _, o := range s.subnets {
		if o.cidr6.IsValid() && o.cidr6.Overlaps(cidr) {
			return fmt.Errorf("subnet IPv6 block %s overlaps %s (%s)", cidr, o.id, o.cidr6)
		}
	}
	sn.cidr6, sn.assoc6 = cidr, newID("subnet-cidr-assoc-")
	for _, e := range s.enis {
		if e.SubnetID == sn.id {
			e.SubnetCIDR6 = cidr
		}
	}
	s.changed()
	return nil
}
