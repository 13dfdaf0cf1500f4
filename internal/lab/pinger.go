package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// Pinger probes an address with ICMP echo from inside a namespace at a
// fixed interval and records which probes were answered: how long a change
// on the path (bridge mode taking a node's uplink) cut it off.
type Pinger struct {
	fd    int
	id    uint16
	dst   netip.Addr
	every time.Duration

	mu     sync.Mutex
	sent   []time.Time // by sequence number
	answer map[uint16]bool
	stop   chan struct{} // ends the sending
	quit   chan struct{} // ends the receiving, once late answers had time
	done   sync.WaitGroup
}

// PingStats is what a Pinger saw.
type PingStats struct {
	Sent, Lost int
	// Gap is the longest time between the sending of two answered probes
	// with only unanswered ones between them: about the interval when
	// nothing was lost.
	Gap time.Duration
}

func (s PingStats) String() string {
	return fmt.Sprintf("gap_ms=%d lost=%d sent=%d", s.Gap.Milliseconds(), s.Lost, s.Sent)
}

// StartPinger probes dst (IPv4: ICMP echo; IPv6: ICMPv6 echo) from the
// namespace at nsPath every interval. Its raw socket is opened inside that
// namespace and stays there.
func StartPinger(nsPath string, dst netip.Addr, every time.Duration) (*Pinger, error) {
	dst = dst.Unmap()
	if !dst.IsValid() {
		return nil, errors.New("pinger: no address")
	}
	p := &Pinger{id: uint16(os.Getpid()) ^ uint16(time.Now().UnixNano()), dst: dst, every: every,
		answer: map[uint16]bool{}, stop: make(chan struct{}), quit: make(chan struct{})}
	domain, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if dst.Is6() {
		domain, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	err := netnsutil.Do(nsPath, func() error {
		fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		p.fd = fd
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pinger socket in %s: %w", nsPath, err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(p.fd)
		return nil, err
	}
	p.done.Add(2)
	go p.send()
	go p.receive()
	return p, nil
}

func (p *Pinger) send() {
	defer p.done.Done()
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		p.mu.Lock()
		seq := uint16(len(p.sent))
		p.sent = append(p.sent, time.Now())
		p.mu.Unlock()
		msg := make([]byte, 16)
		binary.BigEndian.PutUint16(msg[4:], p.id)
		binary.BigEndian.PutUint16(msg[6:], seq)
		var to unix.Sockaddr
		if p.dst.Is6() {
			// Echo request; the kernel computes an ICMPv6 checksum (it
			// covers the IPv6 pseudo-header) on a raw socket itself.
			msg[0] = 128
			to = &unix.SockaddrInet6{Addr: p.dst.As16()}
		} else {
			msg[0] = 8
			binary.BigEndian.PutUint16(msg[2:], checksum(msg))
			to = &unix.SockaddrInet4{Addr: p.dst.As4()}
		}
		// A send error (no route yet) is a lost probe like any other.
		_ = unix.Sendto(p.fd, msg, 0, to)
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *Pinger) receive() {
	defer p.done.Done()
	buf := make([]byte, 1500)
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			continue
		}
		// An IPv4 raw socket hands over the IP header, an IPv6 one only
		// the ICMPv6 message.
		var off int
		var reply byte
		switch src := from.(type) {
		case *unix.SockaddrInet4:
			if n < 20 || !p.dst.Is4() || src.Addr != p.dst.As4() {
				continue
			}
			off, reply = int(buf[0]&0x0f)*4, 0
		case *unix.SockaddrInet6:
			if !p.dst.Is6() || src.Addr != p.dst.As16() {
				continue
			}
			reply = 129
		default:
			continue
		}
		if n < off+8 || buf[off] != reply || binary.BigEndian.Uint16(buf[off+4:]) != p.id {
			continue
		}
		p.mu.Lock()
		p.answer[binary.BigEndian.Uint16(buf[off+6:])] = true
		p.mu.Unlock()
	}
}

// Stop ends the probing, waits a moment for late answers and says what
// was seen. The receiver outlives the sender by that moment: the answer
// to the last probe sent is counted, not lost with the receiver.
func (p *Pinger) Stop() PingStats {
	time.Sleep(4 * p.every)
	close(p.stop)
	time.Sleep(200 * time.Millisecond)
	close(p.quit)
	p.done.Wait()
	unix.Close(p.fd)
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PingStats{Sent: len(p.sent)}
	last := -1
	for i := range p.sent {
		if !p.answer[uint16(i)] {
			s.Lost++
			continue
		}
		if last >= 0 {
			s.Gap = max(s.Gap, p.sent[i].Sub(p.sent[last]))
		}
		last = i
	}
	if last < 0 {
		s.Gap = time.Since(p.sent[0])
	}
	return s
}

// Answered says whether any probe was answered yet.
func (p *Pinger) Answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answer) > 0
}

// WaitAnswered waits until a probe is answered (the path works before the
// change under test).
func (p *Pinger) WaitAnswered(d time.Duration) error {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(p.every) {
		if p.Answered() {
			return nil
		}
	}
	return errors.New("pinger: no answer before the change")
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// FirstAnsweredAfter is when the first probe sent at or after t that was
// answered went out (ok false: none yet): when a path cut at t works
// again, to within one probe interval and the round trip.
func (p *Pinger) FirstAnsweredAfter(t time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, s := range p.sent {
		if !s.Before(t) && p.answer[uint16(i)] {
			return s, true
		}
	}
	return time.Time{}, false
}
