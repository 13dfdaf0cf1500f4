package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// SendGratuitousARP announces on the link that ip is at mac (an ARP request
// for ip from ip, broadcast), so neighbours update stale entries at once.
func SendGratuitousARP(linkIdx int, mac net.HardwareAddr, ip netip.Addr) error {
	if len(mac) != 6 || !ip.Is4() {
		return fmt.Errorf("gratuitous ARP needs an Ethernet MAC and an IPv4 address")
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	bcast := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := make([]byte, 0, 42)
	frame = append(frame, bcast[:6]...)
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
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: linkIdx, Halen: 6, Addr: bcast}
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		return fmt.Errorf("send gratuitous ARP for %s: %w", ip, err)
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
