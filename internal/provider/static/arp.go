package static

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Uplink is the node's interface to the pods' segment, opened once: an
// ARP socket bound to it and a netlink handle, both in the network
// namespace Open ran in (the agent's: the host's).
type Uplink struct {
	name  string
	index int
	mac   net.HardwareAddr
	fd    int
	// fd6 is the packet socket IPv6 addresses are probed on (ndp.go).
	fd6     int
	nl      *netlink.Handle
	timeout time.Duration
}

var _ Segment = (*Uplink)(nil)

// OpenUplink opens the interface name; each probe waits timeout for
// answers. The ARP socket needs CAP_NET_RAW (the agent has it); with
// timeout 0 there is none, and the uplink only tells its addresses.
func OpenUplink(name string, timeout time.Duration) (u *Uplink, err error) {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer func() {
		if err != nil {
			nl.Close()
		}
	}()
	link, err := nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("uplink %s: %w", name, err)
	}
	attrs := link.Attrs()
	if timeout == 0 {
		return &Uplink{name: name, index: attrs.Index, fd: -1, fd6: -1, nl: nl}, nil
	}
	if len(attrs.HardwareAddr) != 6 {
		return nil, fmt.Errorf("uplink %s has no Ethernet address: ARP cannot probe on it", name)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return nil, fmt.Errorf("ARP socket on %s: %w (the agent needs CAP_NET_RAW)", name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: attrs.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ARP socket on %s: %w", name, err)
	}
	fd6, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IPV6)))
	if err == nil {
		// Only neighbour advertisements reach it: the socket stays open,
		// and the node's other IPv6 traffic would be copied to it.
		if err = unix.SetsockoptSockFprog(fd6, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, naFilter()); err == nil {
			err = unix.Bind(fd6, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: attrs.Index})
		}
		if err != nil {
			unix.Close(fd6)
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("IPv6 probe socket on %s: %w", name, err)
	}
	return &Uplink{name: name, index: attrs.Index, mac: attrs.HardwareAddr, fd: fd, fd6: fd6, nl: nl, timeout: timeout}, nil
}

// Close releases the socket and the handle.
func (u *Uplink) Close() error {
	u.nl.Close()
	if u.fd < 0 {
		return nil
	}
	unix.Close(u.fd6)
	return unix.Close(u.fd)
}

// Addresses implements Segment: the uplink's IPv4 and global IPv6
// addresses now, with their prefix lengths (a link-local fe80:: address is
// in no range; the kernel's own, it is left out).
func (u *Uplink) Addresses() ([]netip.Prefix, error) {
	link, err := u.nl.LinkByIndex(u.index)
	if err != nil {
		return nil, fmt.Errorf("uplink %s: %w", u.name, err)
	}
	addrs, err := u.nl.AddrList(link, unix.AF_UNSPEC)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("addresses of uplink %s: %w", u.name, err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap().IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out, nil
}

// Probe implements Segment: an RFC 5227 probe for each IPv4 address (an
// ARP request from sender 0.0.0.0, so no host's cache learns from it) and
// a DAD neighbour solicitation for each IPv6 one (ndp.go), sent twice half
// the timeout apart against a lost frame, then every answer until the
// timeout: for IPv4 a reply for the address, or another host's own
// request or announcement from it; for IPv6 a neighbour advertisement for
// it. The node's own frames are skipped.
func (u *Uplink) Probe(ctx context.Context, addrs []netip.Addr) (map[netip.Addr]net.HardwareAddr, error) {
	found := map[netip.Addr]net.HardwareAddr{}
	if len(addrs) == 0 || u.fd < 0 {
		return found, nil
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	buf := make([]byte, 1500)
	send := func() error {
		for _, a := range addrs {
			if found[a] != nil {
				continue
			}
			fd, pkt, dst := u.fd, []byte(nil), &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: u.index, Halen: 6,
				Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
			what := "ARP probe"
			if a.Is4() {
				pkt = u.request(a)
			} else {
				fd, what = u.fd6, "neighbour solicitation"
				dst.Protocol = htons(unix.ETH_P_IPV6)
				pkt, dst.Addr = solicitation(a)
			}
			if err := unix.Sendto(fd, pkt, 0, dst); err != nil {
				return fmt.Errorf("%s for %s on %s: %w", what, a, u.name, err)
			}
		}
		return nil
	}
	// What queued since the last probe answers an earlier question.
	for _, fd := range []int{u.fd, u.fd6} {
		for {
			if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != nil {
				break
			}
		}
	}
	if err := send(); err != nil {
		return nil, err
	}
	start := time.Now()
	deadline, resendAt, resent := start.Add(u.timeout), start.Add(u.timeout/2), false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	fds := []unix.PollFd{{Fd: int32(u.fd), Events: unix.POLLIN}, {Fd: int32(u.fd6), Events: unix.POLLIN}}
	for len(found) < len(want) {
		now := time.Now()
		if !resent && !now.Before(resendAt) {
			resent = true
			if err := send(); err != nil {
				return nil, err
			}
		}
		if !now.Before(deadline) {
			break
		}
		next := deadline
		if !resent && resendAt.Before(next) {
			next = resendAt
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, int(max(time.Until(next).Milliseconds(), 1)))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("probe on %s: %w", u.name, err)
		}
		if n <= 0 {
			continue
		}
		for i, pfd := range fds {
			if pfd.Revents&unix.POLLIN == 0 {
				continue
			}
			m, from, err := unix.Recvfrom(int(pfd.Fd), buf, unix.MSG_DONTWAIT)
			if err != nil {
				continue
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			if ll == nil || ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			var sha net.HardwareAddr
			var spa netip.Addr
			ok := false
			if i == 0 {
				sha, spa, ok = parseARP(buf[:m])
			} else {
				spa, sha, ok = parseNA(buf[:m], net.HardwareAddr(append([]byte(nil), ll.Addr[:6]...)))
			}
			if ok && want[spa] && found[spa] == nil && sha.String() != u.mac.String() {
				found[spa] = sha
			}
		}
	}
	return found, nil
}

// request is an ARP probe for a: who has a, from us with sender 0.0.0.0.
func (u *Uplink) request(a netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(b[2:], 0x0800) // IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], 1) // request
	copy(b[8:14], u.mac)
	// b[14:18] sender 0.0.0.0, b[18:24] target MAC zero
	t := a.As4()
	copy(b[24:28], t[:])
	return b
}

// parseARP reads the sender of an Ethernet/IPv4 ARP packet; a sender
// address of 0.0.0.0 (another host's probe) is no holder.
func parseARP(b []byte) (sha net.HardwareAddr, spa netip.Addr, ok bool) {
	if len(b) < 28 || binary.BigEndian.Uint16(b[0:]) != 1 || binary.BigEndian.Uint16(b[2:]) != 0x0800 || b[4] != 6 || b[5] != 4 {
		return nil, spa, false
	}
	spa = netip.AddrFrom4([4]byte(b[14:18]))
	if spa.IsUnspecified() {
		return nil, spa, false
	}
	return net.HardwareAddr(append([]byte(nil), b[8:14]...)), spa, true
}

// htons is v in network byte order, as the packet socket's fields take it.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
