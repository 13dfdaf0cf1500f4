package veth

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

// The CNI result: one IPConfig per address in lease order, each alone,
// and one default route per family via its link-local gateway; an
// IPv6-only pod has nothing of IPv4.
func TestWiringFamilies(t *testing.T) {
	v4, v6 := alloc.Lease{Address: netip.MustParseAddr("10.1.0.5")}, alloc.Lease{Address: netip.MustParseAddr("fd00::5")}
	for _, c := range []struct {
		name   string
		a      alloc.Allocation
		want   string
		routes string
	}{
		{"ipv4", alloc.Allocation{Lease: v4}, "[10.1.0.5/32 via 169.254.1.1]", "[0.0.0.0/0 via 169.254.1.1]"},
		{"ipv6", alloc.Allocation{Lease: v6}, "[fd00::5/128 via fe80::1]", "[::/0 via fe80::1]"},
		{"dual", alloc.Allocation{Lease: v4, Others: []alloc.Lease{v6}}, "[10.1.0.5/32 via 169.254.1.1 fd00::5/128 via fe80::1]", "[0.0.0.0/0 via 169.254.1.1 ::/0 via fe80::1]"},
		{"dual v6 first", alloc.Allocation{Lease: v6, Others: []alloc.Lease{v4}}, "[fd00::5/128 via fe80::1 10.1.0.5/32 via 169.254.1.1]", "[::/0 via fe80::1 0.0.0.0/0 via 169.254.1.1]"},
	} {
		c.a.ContainerID, c.a.IfName = "c", "eth0"
		w := wiring(&c.a)
		var ips, routes []string
		for _, ip := range w.IPs {
			if ip.Interface != 1 {
				t.Errorf("%s: address %s on interface %d, want the pod's (1)", c.name, ip.Address, ip.Interface)
			}
			ips = append(ips, ip.Address.String()+" via "+ip.Gateway.String())
		}
		for _, r := range w.Routes {
			routes = append(routes, r.Dst.String()+" via "+r.GW.String())
		}
		if got := fmt.Sprint(ips); got != c.want {
			t.Errorf("%s: IPs %s, want %s", c.name, got, c.want)
		}
		if got := fmt.Sprint(routes); got != c.routes {
			t.Errorf("%s: routes %s, want %s", c.name, got, c.routes)
		}
	}
}

// The node's sysctls per family, in the order they must be written: an
// uplink that takes router advertisements keeps them (accept_ra=2)
// before forwarding goes on, which would drop its default route.
func TestNodeSysctls(t *testing.T) {
	keys := func(list []datapath.Sysctl) string {
		var out []string
		for _, s := range list {
			out = append(out, s.Key+"="+s.Value)
		}
		return strings.Join(out, " ")
	}
	if got := keys(nodeSysctls("up0", nil)); got != "net/ipv4/ip_forward=1 net/ipv4/neigh/up0/proxy_delay=0" {
		t.Errorf("IPv4 node: %s", got)
	}
	const v6 = "net/ipv6/conf/all/disable_ipv6=0 net/ipv6/conf/up0/disable_ipv6=0 net/ipv6/conf/up0/accept_ra=2 net/ipv6/conf/all/forwarding=1 net/ipv6/conf/up0/proxy_ndp=1 net/ipv6/neigh/up0/proxy_delay=0"
	if got := keys(ipv6SysctlsFor("up0", "1")); got != v6 {
		t.Errorf("IPv6 uplink taking RAs:\n got %s\nwant %s", got, v6)
	}
	if got := keys(ipv6SysctlsFor("up0", "0")); strings.Contains(got, "accept_ra") {
		t.Errorf("an uplink taking no RAs is told to take them: %s", got)
	}
	// An IPv6-only node needs nothing of IPv4's.
	if got := keys(nodeSysctls("vpcni-no-such-link", []family.Family{family.V6})); strings.Contains(got, "ipv4") || !strings.Contains(got, "net/ipv6/conf/all/forwarding=1") {
		t.Errorf("IPv6-only node: %s", got)
	}
	if got := keys(nodeSysctls("vpcni-no-such-link", []family.Family{family.V4, family.V6})); !strings.HasPrefix(got, "net/ipv4/ip_forward=1") || !strings.Contains(got, "proxy_ndp=1") {
		t.Errorf("dual-stack node: %s", got)
	}
}

// The unsolicited neighbour advertisement, field by field, and a checksum
// that verifies (the sum over pseudo-header and message, checksum
// included, is all ones).
func TestUnsolicitedNA(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	ip := netip.MustParseAddr("fd00:77::104")
	f := nlutil.UnsolicitedNA(mac, ip)
	if len(f) != 14+40+32 {
		t.Fatalf("frame of %d bytes, want 86", len(f))
	}
	eth, ip6, icmp := f[:14], f[14:54], f[54:]
	if net.HardwareAddr(eth[:6]).String() != "33:33:00:00:00:01" || net.HardwareAddr(eth[6:12]).String() != mac.String() || binary.BigEndian.Uint16(eth[12:]) != 0x86dd {
		t.Errorf("ethernet header % x", eth)
	}
	src, _ := netip.AddrFromSlice(ip6[8:24])
	dst, _ := netip.AddrFromSlice(ip6[24:40])
	if ip6[0]>>4 != 6 || binary.BigEndian.Uint16(ip6[4:]) != 32 || ip6[6] != 58 || ip6[7] != 255 || src != ip || dst.String() != "ff02::1" {
		t.Errorf("IPv6 header % x", ip6)
	}
	target, _ := netip.AddrFromSlice(icmp[8:24])
	if icmp[0] != 136 || icmp[1] != 0 || icmp[4] != 0x20 || target != ip || icmp[24] != 2 || icmp[25] != 1 || net.HardwareAddr(icmp[26:32]).String() != mac.String() {
		t.Errorf("advertisement % x: want type 136, O set alone, target %s, option 2 with %s", icmp, ip, mac)
	}
	var sum uint32
	add := func(b []byte) {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	add(ip6[8:40])
	add([]byte{0, 0, 0, 32, 0, 0, 0, 58})
	add(icmp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff {
		t.Errorf("checksum %#04x does not verify (sum %#x)", binary.BigEndian.Uint16(icmp[2:]), sum)
	}
}

// What mode veth refuses before making anything: an address of a family
// the node was not prepared for, a passthrough lease among a pod's other
// addresses.
func TestLeaseError(t *testing.T) {
	six := alloc.Lease{Address: netip.MustParseAddr("fd00::5")}
	nic := &alloc.NIC{MAC: "fa:16:3e:00:00:01", Address: netip.MustParseAddr("fd00::9")}
	v6node := &Veth{families: []family.Family{family.V4, family.V6}}
	for _, c := range []struct {
		v    *Veth
		a    alloc.Allocation
		want string
	}{
		{&Veth{}, alloc.Allocation{Lease: six}, "not prepared for ipv6"},
		{&Veth{families: []family.Family{family.V6}}, alloc.Allocation{Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")}}, "not prepared for ipv4"},
		{v6node, alloc.Allocation{Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")},
			Others: []alloc.Lease{{Address: netip.MustParseAddr("fd00::9"), NIC: nic}}}, "lives on a NIC of its own"},
	} {
		err := c.v.leaseError(&c.a)
		var se *SetupError
		if !errors.As(err, &se) || se.Step != "lease" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want a lease error naming %q", c.a.Leases(), err, c.want)
		}
	}
	if err := v6node.leaseError(&alloc.Allocation{Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")}, Others: []alloc.Lease{six}}); err != nil {
		t.Errorf("a dual-stack lease refused: %v", err)
	}
}
