// Package neutronapi is the lab's Neutron-compatible endpoint: networks,
// subnets and ports (fixed IPs, allowed address pairs, revision numbers
// with If-Match) held in memory, served with Neutron's JSON and errors. It
// must pass the same provider contract as the real neutron-server; unlike
// it, every write is one atomic step.
package neutronapi

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Network is a Neutron network.
type Network struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	ProjectID string   `json:"project_id"`
	TenantID  string   `json:"tenant_id"`
	Subnets   []string `json:"subnets"`
	Status    string   `json:"status"`
	AdminUp   bool     `json:"admin_state_up"`
	Revision  int      `json:"revision_number"`
}

// Pool is an allocation pool.
type Pool struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// Subnet is a Neutron subnet, IPv4 or IPv6.
type Subnet struct {
	ID              string `json:"id"`
	NetworkID       string `json:"network_id"`
	Name            string `json:"name"`
	CIDR            string `json:"cidr"`
	GatewayIP       string `json:"gateway_ip"`
	IPVersion       int    `json:"ip_version"`
	AllocationPools []Pool `json:"allocation_pools"`
	// IPv6AddressMode and IPv6RAMode are an IPv6 subnet's modes (null
	// for IPv4, and for an IPv6 subnet whose addresses only Neutron
	// hands out): slaac, dhcpv6-stateful or dhcpv6-stateless.
	IPv6AddressMode *string `json:"ipv6_address_mode"`
	IPv6RAMode      *string `json:"ipv6_ra_mode"`
	ProjectID       string  `json:"project_id"`
	TenantID        string  `json:"tenant_id"`
	Revision        int     `json:"revision_number"`

	prefix netip.Prefix
	pools  [][2]netip.Addr
	used   map[netip.Addr]string // address -> port ID
}

// FixedIP is one address of a port.
type FixedIP struct {
	SubnetID  string `json:"subnet_id"`
	IPAddress string `json:"ip_address"`
}

// Pair is an allowed address pair.
type Pair struct {
	IPAddress  string `json:"ip_address"`
	MACAddress string `json:"mac_address"`
}

// Port is a Neutron port.
type Port struct {
	ID           string    `json:"id"`
	NetworkID    string    `json:"network_id"`
	Name         string    `json:"name"`
	Description  string    `json:"description"`
	DeviceOwner  string    `json:"device_owner"`
	DeviceID     string    `json:"device_id"`
	MACAddress   string    `json:"mac_address"`
	FixedIPs     []FixedIP `json:"fixed_ips"`
	Pairs        []Pair    `json:"allowed_address_pairs"`
	PortSecurity bool      `json:"port_security_enabled"`
	AdminUp      bool      `json:"admin_state_up"`
	Status       string    `json:"status"`
	ProjectID    string    `json:"project_id"`
	TenantID     string    `json:"tenant_id"`
	Revision     int       `json:"revision_number"`
	// Tags are the port's (standard-attr-tag), set one by one with PUT
	// /ports/{id}/tags/{tag} as Neutron ignores tags in a create.
	Tags []string `json:"tags"`
}

// apiError is a Neutron error answer.
type apiError struct {
	status int
	typ    string
	msg    string
}

func (e *apiError) Error() string { return e.typ + ": " + e.msg }

func errorf(status int, typ, format string, args ...any) *apiError {
	return &apiError{status: status, typ: typ, msg: fmt.Sprintf(format, args...)}
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func newMAC() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", b[0], b[1], b[2])
}

// newSubnet validates and indexes a subnet.
func newSubnet(sn *Subnet) *apiError {
	p, err := netip.ParsePrefix(sn.CIDR)
	if err != nil || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return errorf(400, "InvalidInput", "Invalid input for cidr: %q is not a CIDR", sn.CIDR)
	}
	version := 4
	if p.Addr().Is6() {
		version = 6
	}
	if sn.IPVersion != 0 && sn.IPVersion != version {
		return errorf(400, "InvalidInput", "Invalid input for operation: cidr %s is not an IPv%d CIDR.", sn.CIDR, sn.IPVersion)
	}
	sn.prefix, sn.IPVersion, sn.CIDR = p.Masked(), version, p.Masked().String()
	for _, m := range []*string{sn.IPv6AddressMode, sn.IPv6RAMode} {
		switch {
		case m == nil:
		case version == 4:
			return errorf(400, "InvalidInput", "Invalid input for operation: ipv6_ra_mode or ipv6_address_mode cannot be set when enable_dhcp is set to False or ip_version is 4.")
		case *m != "slaac" && *m != "dhcpv6-stateful" && *m != "dhcpv6-stateless":
			return errorf(400, "InvalidInput", "Invalid input for ipv6 mode: %q is not in [slaac, dhcpv6-stateful, dhcpv6-stateless]", *m)
		}
	}
	if sn.auto() && p.Bits() != 64 {
		return errorf(400, "InvalidInput", "Invalid input for operation: Invalid CIDR %s for IPv6 address mode. OpenStack uses the EUI-64 address format, which requires the prefix to be /64.", sn.CIDR)
	}
	if sn.GatewayIP == "" {
		sn.GatewayIP = sn.prefix.Addr().Next().String()
	}
	gw, err := netip.ParseAddr(sn.GatewayIP)
	if err != nil || !sn.prefix.Contains(gw) {
		return errorf(400, "InvalidInput", "Invalid input for gateway_ip: %q", sn.GatewayIP)
	}
	if len(sn.AllocationPools) == 0 {
		last := lastAddr(sn.prefix)
		start := sn.prefix.Addr().Next()
		if start == gw {
			start = start.Next()
		}
		if version == 4 {
			last = last.Prev() // the broadcast address
		}
		sn.AllocationPools = []Pool{{Start: start.String(), End: last.String()}}
	}
	for _, pl := range sn.AllocationPools {
		lo, err1 := netip.ParseAddr(pl.Start)
		hi, err2 := netip.ParseAddr(pl.End)
		if err1 != nil || err2 != nil || !sn.prefix.Contains(lo) || !sn.prefix.Contains(hi) || hi.Less(lo) {
			return errorf(400, "InvalidAllocationPool", "The allocation pool %s-%s is not valid.", pl.Start, pl.End)
		}
		sn.pools = append(sn.pools, [2]netip.Addr{lo, hi})
	}
	sn.used = map[netip.Addr]string{}
	return nil
}

// lastAddr is the prefix's highest address: every host bit set.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// auto: an IPv6 subnet whose addresses hosts make from their MACs
// (SLAAC, or DHCPv6 for options only): Neutron gives every port of its
// network the EUI-64 address and refuses any other.
func (sn *Subnet) auto() bool {
	for _, m := range []*string{sn.IPv6AddressMode, sn.IPv6RAMode} {
		if m != nil && (*m == "slaac" || *m == "dhcpv6-stateless") {
			return true
		}
	}
	return false
}

// eui64 is the address a host with mac makes on a /64 subnet: the prefix,
// then the MAC with its universal/local bit flipped and ff:fe in the
// middle.
func eui64(prefix netip.Prefix, mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return netip.Addr{}, false
	}
	b := prefix.Masked().Addr().As16()
	copy(b[8:], []byte{hw[0] ^ 0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]})
	return netip.AddrFrom16(b), true
}

func (sn *Subnet) inPools(a netip.Addr) bool {
	for _, pl := range sn.pools {
		if pl[0].Compare(a) <= 0 && a.Compare(pl[1]) <= 0 {
			return true
		}
	}
	return false
}

// firstFree is the lowest pool address nobody holds.
func (sn *Subnet) firstFree(taken map[netip.Addr]bool) (netip.Addr, bool) {
	for _, pl := range sn.pools {
		for a := pl[0]; a.Compare(pl[1]) <= 0; a = a.Next() {
			if _, used := sn.used[a]; !used && !taken[a] && a.String() != sn.GatewayIP {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

// matches applies Neutron's list filters to a port.
func (p *Port) matches(q map[string][]string) bool {
	for key, values := range q {
		switch key {
		case "network_id", "device_owner", "device_id", "name", "id":
			field := map[string]string{"network_id": p.NetworkID, "device_owner": p.DeviceOwner, "device_id": p.DeviceID, "name": p.Name, "id": p.ID}[key]
			if !slices.Contains(values, field) {
				return false
			}
		case "tags":
			// Neutron's tags filter: every tag listed, comma-separated.
			for _, v := range values {
				for _, tag := range strings.Split(v, ",") {
					if !slices.Contains(p.Tags, tag) {
						return false
					}
				}
			}
		case "fixed_ips":
			for _, v := range values {
				k, want, _ := strings.Cut(v, "=")
				if !slices.ContainsFunc(p.FixedIPs, func(f FixedIP) bool {
					return k == "ip_address" && f.IPAddress == want || k == "subnet_id" && f.SubnetID == want
				}) {
					return false
				}
			}
		}
	}
	return true
}
