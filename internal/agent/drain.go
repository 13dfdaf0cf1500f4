package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrDrained ends http.Server.Serve once Socket.Drain has emptied the
// backlog.
var ErrDrained = errors.New("vpcnid socket drained")

// drainQuiet is how long the backlog must stay empty before Drain ends. A
// connect that looked the path up just before the unlink still lands in
// the backlog a moment later (the kernel resolves the path, then queues on
// the socket it found); on a loaded node that moment can be a preempted
// thread, so milliseconds, not microseconds. It delays a stop by this much.
const drainQuiet = 100 * time.Millisecond

// Socket is the agent's listening socket, with a graceful stop that
// resets no connection a client already made: see Drain.
type Socket struct {
	*net.UnixListener
	path     string
	draining atomic.Bool
	once     sync.Once
	drained  chan struct{}
}

// OpenSocket listens on path as Listen does.
func OpenSocket(path string) (*Socket, error) {
	l, err := Listen(path)
	if err != nil {
		return nil, err
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("listener on %s is a %T, not a unix socket", path, l)
	}
	// Drain unlinks the path itself, before the end; an unlink at Close
	// could remove the socket of the agent that replaced this one.
	ul.SetUnlinkOnClose(false)
	return &Socket{UnixListener: ul, path: path, drained: make(chan struct{})}, nil
}

// Drain stops new connections and returns once every connection already
// queued on the socket has been accepted (http.Server.Shutdown then waits
// for their answers); Serve returns ErrDrained.
//
// Closing a listening unix socket does not refuse what waits in its
// backlog, it resets it: the kernel releases each queued connection and its
// client reads ECONNRESET, though its request was already sent (measured:
// all 30 ADDs queued when vpcnid got SIGTERM; 0-11 of 60 in a burst it was
// serving). So the path goes first: new connects fail with ENOENT, which
// the plugin reports as "not running, try again later"; then the socket
// keeps accepting until its backlog has stayed empty for drainQuiet.
func (s *Socket) Drain(ctx context.Context) error {
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unlink socket: %w", err)
	}
	s.draining.Store(true)
	// Wake an Accept that waits without a deadline, so it starts draining.
	_ = s.UnixListener.SetDeadline(time.Unix(1, 0))
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain %s: %w", s.path, ctx.Err())
	}
}

// Accept returns the next connection; once draining, ErrDrained when none
// came for drainQuiet.
func (s *Socket) Accept() (net.Conn, error) {
	for {
		if !s.draining.Load() {
			c, err := s.UnixListener.Accept()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue // Drain's wake-up
			}
			return c, err
		}
		until := time.Now().Add(drainQuiet)
		_ = s.UnixListener.SetDeadline(until)
		c, err := s.UnixListener.Accept()
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return c, err
		}
		if time.Now().Before(until) {
			continue // Drain's wake-up came after this deadline was set
		}
		s.once.Do(func() { close(s.drained) })
		return nil, ErrDrained
	}
}
