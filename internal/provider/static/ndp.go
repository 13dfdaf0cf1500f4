package static

import (
	"encoding/binary"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// IPv6 has no ARP: an IPv6 address is probed as duplicate address
// detection does (RFC 4862 5.4): a neighbour solicitation for it from the
// unspecified address :: to its solicited-node multicast group, with no
// source link-layer option, so no host's neighbour cache learns from it.
// A host holding the address (or proxying it) answers with a neighbour
// advertisement to all nodes (ff02::1), which the packet socket sees. The
// packets are built here rather than sent through the kernel's own DAD
// (adding the address tentatively): that would put each probed address
// on the node's uplink for its length, where the node's stack would
// answer for it and routes would see it.

// solicitation is the IPv6 packet of a DAD neighbour solicitation for a,
// and the Ethernet address of its solicited-node group.
func solicitation(a netip.Addr) (pkt []byte, dst [8]byte) {
	t := a.As16()
	group := [16]byte{0xff, 0x02, 11: 0x01, 12: 0xff, 13: t[13], 14: t[14], 15: t[15]}
	dst = [8]byte{0x33, 0x33, 0xff, t[13], t[14], t[15]}
	icmp := make([]byte, 24)
	icmp[0] = 135 // neighbour solicitation; code, checksum, reserved 0
	copy(icmp[8:], t[:])
	pkt = make([]byte, 40+len(icmp))
	pkt[0] = 0x60
	binary.BigEndian.PutUint16(pkt[4:], uint16(len(icmp)))
	pkt[6], pkt[7] = 58, 255 // ICMPv6, hop limit 255 (RFC 4861 7.1.1)
	// pkt[8:24] source ::
	copy(pkt[24:40], group[:])
	copy(pkt[40:], icmp)
	binary.BigEndian.PutUint16(pkt[42:], icmpv6Checksum(pkt))
	return pkt, dst
}

// icmpv6Checksum is the ICMPv6 checksum of an IPv6 packet with no
// extension headers (its checksum field zero): the pseudo-header's
// addresses, length and next header, then the message.
func icmpv6Checksum(pkt []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(pkt[8:40])
	sum += uint32(len(pkt) - 40)
	sum += 58
	add(pkt[40:])
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// parseNA reads a neighbour advertisement in an IPv6 packet: its target
// and the advertiser's link-layer address (the target link-layer option,
// else the frame's source, from). Another host's DAD solicitation for the
// address (from ::) is not an answer: that host does not hold it yet.
func parseNA(pkt []byte, from net.HardwareAddr) (target netip.Addr, mac net.HardwareAddr, ok bool) {
	if len(pkt) < 40+24 || pkt[0]>>4 != 6 || pkt[6] != 58 || pkt[7] != 255 || pkt[40] != 136 {
		return target, nil, false
	}
	end := min(len(pkt), 40+int(binary.BigEndian.Uint16(pkt[4:])))
	target = netip.AddrFrom16([16]byte(pkt[48:64]))
	mac = from
	for opts := pkt[64:end]; len(opts) >= 8; {
		n := int(opts[1]) * 8
		if n == 0 || n > len(opts) {
			break
		}
		if opts[0] == 2 && n >= 8 { // target link-layer address
			mac = net.HardwareAddr(append([]byte(nil), opts[2:8]...))
		}
		opts = opts[n:]
	}
	return target, mac, true
}

// naFilter is a classic BPF program that passes ICMPv6 neighbour
// advertisements only (next header 58, type 136 right after the fixed
// header; a packet socket of SOCK_DGRAM filters from the IPv6 header).
// One with extension headers is dropped: no host sends NDP so.
func naFilter() *unix.SockFprog {
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 6},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: 58},
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 40},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: 136},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	return &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
}
