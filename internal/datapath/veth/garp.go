package veth

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/alloc"
)

// arpSender sends gratuitous ARP on one link from one long-lived packet
// socket: closing a packet socket waits for an RCU grace period (~9 ms
// here), far too long to pay on every pod ADD.
type arpSender struct {
	fd      int
	linkIdx int
	mac     net.HardwareAddr
}

func newARPSender(linkIdx int, mac net.HardwareAddr) (*arpSender, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("gratuitous ARP needs an Ethernet uplink, not MAC %q", mac)
	}
	// Protocol 0: the socket only sends and receives nothing.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	return &arpSender{fd: fd, linkIdx: linkIdx, mac: mac}, nil
}

// Announce broadcasts that ip is at the link's MAC (an ARP request for ip
// from ip), so neighbours update stale entries at once.
func (s *arpSender) Announce(ip netip.Addr) error {
	if !ip.Is4() {
		return fmt.Errorf("gratuitous ARP is IPv4 only, not %s", ip)
	}
	bcast := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := make([]byte, 0, 42)
	frame = append(frame, bcast[:6]...)
	frame = append(frame, s.mac...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_ARP)
	frame = binary.BigEndian.AppendUint16(frame, 1)      // hardware: Ethernet
	frame = binary.BigEndian.AppendUint16(frame, 0x0800) // protocol: IPv4
	frame = append(frame, 6, 4)                          // address lengths
	frame = binary.BigEndian.AppendUint16(frame, 1)      // request
	ip4 := ip.As4()
	frame = append(frame, s.mac...)
	frame = append(frame, ip4[:]...)
	frame = append(frame, 0, 0, 0, 0, 0, 0)
	frame = append(frame, ip4[:]...)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: s.linkIdx, Halen: 6, Addr: bcast}
	if err := unix.Sendto(s.fd, frame, 0, to); err != nil {
		return fmt.Errorf("send gratuitous ARP for %s: %w", ip, err)
	}
	return nil
}

func (s *arpSender) Close() error { return unix.Close(s.fd) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// announceOn sends one gratuitous ARP for a pod's address on a NIC other
// than the uplink, from a socket of its own (pods on secondary NICs are
// few; the uplink's sender stays long-lived). Best effort, as on the
// uplink.
func (v *Veth) announceOn(linkIdx int, a *alloc.Allocation) {
	if v.garp == nil {
		return
	}
	mac, err := net.ParseMAC(a.NIC.MAC)
	if err != nil {
		return
	}
	s, err := newARPSender(linkIdx, mac)
	if err != nil {
		return
	}
	defer s.Close()
	_ = s.Announce(a.Address)
}
