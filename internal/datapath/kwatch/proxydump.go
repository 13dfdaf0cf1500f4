package kwatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proxyKey is one proxy neighbour entry (ARP or NDP): its address and
// link. A netip.Addr without a zone allocates nothing.
type proxyKey struct {
	ip   netip.Addr
	link int32
}

func (k proxyKey) String() string { return fmt.Sprintf("%s dev %d", k.ip, k.link) }

// proxyDumper dumps the proxy neighbour entries over one netlink socket
// into one buffer, both reused, and decodes only the address and link of
// each: the watch polls every ProxyPoll, and with netlink.NeighProxyList
// (a socket's worth of allocations per entry, every entry formatted into
// a string key) an idle node of 250 pods allocated 4.3 MB/s for it alone
// (bench node-scale, heap profile).
type proxyDumper struct {
	fd  int
	seq uint32
	req [unix.SizeofNlMsghdr + unix.SizeofNdMsg]byte
	buf []byte
}

var errDumpInterrupted = errors.New("proxy entries changed during the dump")

// newProxyDumper opens its socket in the calling thread's namespace.
func newProxyDumper() (*proxyDumper, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	// A dump that never ends (it cannot, short of a kernel bug) must not
	// hold the poller forever.
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	d := &proxyDumper{fd: fd, buf: make([]byte, 32<<10)}
	ne := binary.NativeEndian
	ne.PutUint32(d.req[0:], uint32(len(d.req)))
	ne.PutUint16(d.req[4:], unix.RTM_GETNEIGH)
	ne.PutUint16(d.req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	// ndm_family AF_UNSPEC: the kernel dumps the proxy entries of every
	// family, ARP's and NDP's, in one go.
	d.req[unix.SizeofNlMsghdr] = unix.AF_UNSPEC
	d.req[unix.SizeofNlMsghdr+10] = unix.NTF_PROXY // ndm_flags: the proxy table
	return d, nil
}

func (d *proxyDumper) close() { unix.Close(d.fd) }

// dump puts every proxy entry into into (cleared first).
func (d *proxyDumper) dump(into map[proxyKey]bool) error {
	clear(into)
	d.seq++
	ne := binary.NativeEndian
	ne.PutUint32(d.req[8:], d.seq)
	if err := unix.Sendto(d.fd, d.req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	interrupted := false
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for b := d.buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(ne.Uint32(b[0:]))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return fmt.Errorf("netlink message of %d bytes in %d", l, len(b))
			}
			msg := b[:l]
			b = b[min(nlAlign(l), len(b)):]
			if ne.Uint32(msg[8:]) != d.seq {
				continue // an earlier dump's late part
			}
			interrupted = interrupted || ne.Uint16(msg[6:])&unix.NLM_F_DUMP_INTR != 0
			switch ne.Uint16(msg[4:]) {
			case unix.NLMSG_DONE:
				if interrupted {
					return errDumpInterrupted
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(msg) >= unix.SizeofNlMsghdr+4 {
					if errno := -int32(ne.Uint32(msg[unix.SizeofNlMsghdr:])); errno != 0 {
						return syscall.Errno(errno)
					}
				}
				return nil
			case unix.RTM_NEWNEIGH:
				if k, ok := proxyEntry(msg[unix.SizeofNlMsghdr:]); ok {
					into[k] = true
				}
			}
		}
	}
}

// proxyEntry decodes an ndmsg and its attributes: an IPv4 or IPv6
// entry's destination and link.
func proxyEntry(m []byte) (proxyKey, bool) {
	if len(m) < unix.SizeofNdMsg || m[0] != unix.AF_INET && m[0] != unix.AF_INET6 {
		return proxyKey{}, false
	}
	ne := binary.NativeEndian
	k := proxyKey{link: int32(ne.Uint32(m[4:]))}
	for a := m[unix.SizeofNdMsg:]; len(a) >= unix.SizeofRtAttr; {
		l := int(ne.Uint16(a[0:]))
		if l < unix.SizeofRtAttr || l > len(a) {
			return proxyKey{}, false
		}
		if ne.Uint16(a[2:]) == unix.NDA_DST && (l == unix.SizeofRtAttr+4 || l == unix.SizeofRtAttr+16) {
			k.ip, _ = netip.AddrFromSlice(a[unix.SizeofRtAttr:l])
			return k, true
		}
		a = a[min(nlAlign(l), len(a)):]
	}
	return proxyKey{}, false
}

func nlAlign(l int) int { return (l + 3) &^ 3 }
