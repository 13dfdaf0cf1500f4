package nlutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// Announcer tells a link's neighbours that a pod's address is now at the
// link's MAC: a gratuitous ARP for an IPv4 address, an unsolicited
// Neighbour Advertisement for an IPv6 one. It sends from one long-lived
// packet socket: closing a packet socket waits for an RCU grace period
// (~9 ms here), far too long to pay on every pod ADD.
type Announcer struct {
	fd      int
	linkIdx int
	mac     net.HardwareAddr
}

func NewAnnouncer(linkIdx int, mac net.HardwareAddr) (*Announcer, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("announcing pod addresses needs an Ethernet link, not MAC %q", mac)
	}
	// Protocol 0: the socket only sends and receives nothing.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	return &Announcer{fd: fd, linkIdx: linkIdx, mac: mac}, nil
}

// Announce sends the announcement of ip's family.
func (s *Announcer) Announce(ip netip.Addr) error {
	ip = ip.Unmap()
	if ip.Is4() {
		return s.send(garpFrame(s.mac, ip), unix.ETH_P_ARP, [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "gratuitous ARP", ip)
	}
	return s.send(UnsolicitedNA(s.mac, ip), unix.ETH_P_IPV6, [8]byte{0x33, 0x33, 0, 0, 0, 1}, "unsolicited neighbour advertisement", ip)
}

func (s *Announcer) send(frame []byte, proto uint16, to [8]byte, what string, ip netip.Addr) error {
	sa := &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: s.linkIdx, Halen: 6, Addr: to}
	if err := unix.Sendto(s.fd, frame, 0, sa); err != nil {
		return fmt.Errorf("send %s for %s: %w", what, ip, err)
	}
	return nil
}

// garpFrame is an ARP request for ip from ip at mac, broadcast, so
// neighbours update stale entries at once.
func garpFrame(mac net.HardwareAddr, ip netip.Addr) []byte {
	frame := make([]byte, 0, 42)
	frame = append(frame, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	frame = append(frame, mac...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_ARP)
	frame = binary.BigEndian.AppendUint16(frame, 1)      // hardware: Ethernet
	frame = binary.BigEndian.AppendUint16(frame, 0x0800) // protocol: IPv4
	frame = append(frame, 6, 4)                          // address lengths
	frame = binary.BigEndian.AppendUint16(frame, 1)      // request
	ip4 := ip.As4()
	frame = append(frame, mac...)
	frame = append(frame, ip4[:]...)
	frame = append(frame, 0, 0, 0, 0, 0, 0)
	frame = append(frame, ip4[:]...)
	return frame
}

// allNodes is ff02::1, where an unsolicited advertisement goes.
var allNodes = netip.MustParseAddr("ff02::1")

// UnsolicitedNA is an ICMPv6 Neighbour Advertisement (RFC 4861 4.4) that
// ip is at mac, to all nodes. Hop limit 255, which receivers require of
// neighbour discovery. Flags: Override set, Solicited and Router clear.
// Override is what makes a Linux neighbour replace the MAC it cached for
// ip (a pod that moved here from another node); without it the entry is
// only marked stale and keeps the old MAC. The source is ip itself, as the
// kernel's own unsolicited advertisements are sent from the address they
// announce.
func UnsolicitedNA(mac net.HardwareAddr, ip netip.Addr) []byte {
	const icmpLen = 32 // type, code, checksum, flags, target, one option
	frame := make([]byte, 0, 14+40+icmpLen)
	frame = append(frame, 0x33, 0x33, 0, 0, 0, 1) // ff02::1's multicast MAC
	frame = append(frame, mac...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_IPV6)
	src, dst := ip.As16(), allNodes.As16()
	frame = append(frame, 0x60, 0, 0, 0) // version 6, no class, no flow
	frame = binary.BigEndian.AppendUint16(frame, icmpLen)
	frame = append(frame, unix.IPPROTO_ICMPV6, 255)
	frame = append(frame, src[:]...)
	frame = append(frame, dst[:]...)
	icmp := len(frame)
	frame = append(frame, 136, 0, 0, 0)  // Neighbour Advertisement, code 0, checksum below
	frame = append(frame, 0x20, 0, 0, 0) // R=0 S=0 O=1
	frame = append(frame, src[:]...)     // target
	frame = append(frame, 2, 1)          // target link-layer address, 8 bytes
	frame = append(frame, mac...)
	binary.BigEndian.PutUint16(frame[icmp+2:], icmpv6Checksum(src, dst, frame[icmp:]))
	return frame
}

// icmpv6Checksum is the ICMPv6 checksum of msg (its checksum field zero)
// between src and dst: the ones' complement sum over the IPv6
// pseudo-header and the message (RFC 8200 8.1).
func icmpv6Checksum(src, dst [16]byte, msg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	var pseudo [8]byte
	binary.BigEndian.PutUint32(pseudo[:4], uint32(len(msg)))
	pseudo[7] = unix.IPPROTO_ICMPV6
	add(pseudo[:])
	add(msg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func (s *Announcer) Close() error { return unix.Close(s.fd) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// AnnounceIn sends, from inside the namespace at netnsPath, the
// announcement of each address (gratuitous ARP, unsolicited neighbour
// advertisement) on the link ifName with its MAC: a pod whose interface
// sits on the segment itself (macvlan, ipvlan, passthrough) tells its
// neighbours that an address another MAC held — a pod on another node, a
// pod before it — is its now. The socket's close waits an RCU grace
// period (~9 ms) and is left to a goroutine, off the ADD's path.
func AnnounceIn(netnsPath, ifName string, addrs []netip.Addr) error {
	return netnsutil.Do(netnsPath, func() error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifName, err)
		}
		s, err := NewAnnouncer(link.Attrs().Index, link.Attrs().HardwareAddr)
		if err != nil {
			return err
		}
		defer func() { go s.Close() }()
		var errs []error
		for _, a := range addrs {
			errs = append(errs, s.Announce(a))
		}
		return errors.Join(errs...)
	})
}
