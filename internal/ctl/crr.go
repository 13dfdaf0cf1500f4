package ctl

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// crrPort is where the connect/request/response server listens.
const crrPort = 11112

// onCPU runs f on the calling goroutine's thread pinned to one CPU, and
// unpins it after (the thread goes back to Go's pool as it was).
func onCPU(cpu int, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return err
	}
	defer func() { _ = unix.SchedSetaffinity(0, &was) }()
	return f()
}

// crrServer answers connect/request/response exchanges on addr in the
// named namespace, one connection at a time on a thread pinned to cpu:
// read one byte, write it back, wait for the client to close. It returns
// the function that stops it.
func crrServer(ns string, addr netip.AddrPort, cpu int) (func(), error) {
	return pinnedServer(ns, addr, cpu, func(c net.Conn, buf []byte) {
		if _, err := io.ReadFull(c, buf); err == nil {
			if _, err := c.Write(buf); err == nil {
				_, _ = c.Read(buf) // until the client's reset
			}
		}
	})
}

// pinnedServer listens on addr in the named namespace and hands each
// connection, one at a time, to serve on a thread pinned to cpu (with a
// one-byte buffer, so serving allocates nothing), closing it after. The
// bench servers share it so their figures differ only by the exchange.
// It returns the function that stops it.
func pinnedServer(ns string, addr netip.AddrPort, cpu int, serve func(c net.Conn, buf []byte)) (func(), error) {
	l, err := netnsutil.Listen(netnsutil.Path(ns), addr.String())
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = onCPU(cpu, func() error {
			buf := make([]byte, 1)
			for {
				c, err := l.Accept()
				if err != nil {
					return err
				}
				serve(c, buf)
				c.Close()
			}
		})
	}()
	return func() { l.Close(); <-done }, nil
}

// crrRate opens a TCP connection to addr from the named namespace,
// exchanges one byte each way and resets it, again and again for secs
// seconds on a thread pinned to cpu; it returns exchanges per second. A
// reset rather than a close leaves no TIME_WAIT socket behind, so the
// client's ports last the whole run.
func crrRate(ctx context.Context, ns string, addr netip.AddrPort, secs, cpu int) (float64, error) {
	var n int
	var elapsed time.Duration
	err := onCPU(cpu, func() error {
		return netnsutil.Do(netnsutil.Path(ns), func() error {
			buf := []byte{'x'}
			start := time.Now()
			end := start.Add(time.Duration(secs) * time.Second)
			for time.Now().Before(end) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
				if err != nil {
					return err
				}
				tc := c.(*net.TCPConn)
				_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := tc.Write(buf); err != nil {
					tc.Close()
					return err
				}
				if _, err := io.ReadFull(tc, buf); err != nil {
					tc.Close()
					return err
				}
				_ = tc.SetLinger(0)
				tc.Close()
				n++
			}
			elapsed = time.Since(start)
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("no exchange completed")
	}
	return float64(n) / elapsed.Seconds(), nil
}
