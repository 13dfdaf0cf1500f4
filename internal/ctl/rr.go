package ctl

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// The TCP request/response latency of an IPv6 path. sockperf, which
// measures IPv4's, speaks no IPv6 in the version Debian ships (3.7), so an
// IPv6 path is measured by this ping-pong of one byte over one connection,
// its server and client pinned to CPUs as sockperf's are; a pod's path and
// the node's it is compared with are measured alike.

// rrPort is where the request/response servers listen (sockperf's or
// rrServer).
const rrPort = 11111

// rrServer echoes every byte on each connection to addr in the named
// namespace, one connection at a time on a thread pinned to cpu, until
// the client closes it. It returns the function that stops it.
func rrServer(ns string, addr netip.AddrPort, cpu int) (func(), error) {
	return pinnedServer(ns, addr, cpu, func(c net.Conn, buf []byte) {
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
}

// rrLatency connects to addr from the named namespace and sends one byte
// and waits for it back, again and again for secs seconds on a thread
// pinned to cpu; it returns the median round trip in µs.
func rrLatency(ctx context.Context, ns string, addr netip.AddrPort, secs, cpu int) (float64, error) {
	var rtts []float64
	err := onCPU(cpu, func() error {
		return netnsutil.Do(netnsutil.Path(ns), func() error {
			c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.(*net.TCPConn).SetNoDelay(true)
			buf := []byte{'x'}
			end := time.Now().Add(time.Duration(secs) * time.Second)
			_ = c.SetDeadline(end.Add(2 * time.Second))
			for time.Now().Before(end) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				t := time.Now()
				if _, err := c.Write(buf); err != nil {
					return err
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					return err
				}
				rtts = append(rtts, float64(time.Since(t).Nanoseconds())/1e3)
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	if len(rtts) == 0 {
		return 0, errors.New("no exchange completed")
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], nil
}
