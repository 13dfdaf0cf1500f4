// Package apitest is a test helper for the agent API's clients: a real
// unix socket server whose connections a test handles byte by byte (an
// agent that hangs up, resets, answers half). Tests only; no shipped
// binary imports it (internal/deptest).
package apitest

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// ServeConn listens on a fresh unix socket in a temp dir and hands every
// connection to handle (closing it after, with a 5 s deadline on it); it
// stops when the test ends. It returns the socket's path.
func ServeConn(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vpcnid.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				handle(c)
			}()
		}
	}()
	return sock
}
