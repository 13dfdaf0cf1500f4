package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
)

const okRequest = "POST /v1/status HTTP/1.1\r\nHost: vpcnid\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"

// queue connects n clients to sock and sends each a request, before
// anything accepts them: they wait in the socket's backlog.
func queue(t *testing.T, sock string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, okRequest); err != nil {
			t.Fatalf("client %d: send: %v", i, err)
		}
		conns[i] = c
	}
	return conns
}

func answer(c net.Conn) (int, error) {
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// The kernel behaviour Drain exists for: closing a listening unix socket
// resets the connections still in its backlog, requests sent and all.
func TestCloseResetsQueuedConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	conns := queue(t, sock, 5)
	l.Close()
	for i, c := range conns {
		if _, err := answer(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("client %d: %v, want ECONNRESET", i, err)
		}
	}
}

func serveOK(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, struct{}{}) }

// Connections queued when the stop begins are accepted and answered;
// connects after it find no socket.
func TestDrainAnswersQueuedConnections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vpcnid.sock")
	sock, err := OpenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	conns := queue(t, path, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- sock.Drain(ctx) }()
	waitGone(t, path)
	if c, err := net.Dial("unix", path); !errors.Is(err, syscall.ENOENT) {
		if c != nil {
			c.Close()
		}
		t.Errorf("connect while draining: %v, want ENOENT", err)
	}

	srv := &http.Server{Handler: http.HandlerFunc(serveOK)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sock) }()
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if err := <-served; !errors.Is(err, ErrDrained) {
		t.Errorf("Serve returned %v, want ErrDrained", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for i, c := range conns {
		if status, err := answer(c); err != nil || status != http.StatusOK {
			t.Errorf("queued client %d: status %d, %v; want 200", i, status, err)
		}
	}
}

// The usual stop: Serve waits in Accept, requests are in their handlers.
// Drain wakes the Accept and ends; Shutdown waits for the handlers, whose
// answers all arrive.
func TestDrainWhileServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vpcnid.sock")
	sock, err := OpenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	var entered atomic.Int32
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		<-release
		serveOK(w, r)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sock) }()
	conns := queue(t, path, 5)
	waitUntil(t, "5 requests in their handler", func() bool { return entered.Load() == 5 })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := sock.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if d := time.Since(start); d < drainQuiet {
		t.Errorf("Drain ended after %s, before the backlog had been quiet for %s", d, drainQuiet)
	}
	if err := <-served; !errors.Is(err, ErrDrained) {
		t.Errorf("Serve returned %v, want ErrDrained", err)
	}
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	close(release)
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for i, c := range conns {
		if status, err := answer(c); err != nil || status != http.StatusOK {
			t.Errorf("client %d: status %d, %v; want 200", i, status, err)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket path after the stop: %v, want it gone", err)
	}
}

// A body over the limit, sent to the real handler over a unix socket: the
// client gets the agent's answer naming the limit, though the agent stops
// reading and closes while the client is still sending.
func TestOversizedBodyAnsweredOverSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vpcnid.sock")
	sock, err := OpenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: (&Agent{log: slog.New(slog.DiscardHandler)}).Handler()}
	go func() { _ = srv.Serve(sock) }()
	t.Cleanup(func() { srv.Close() })

	body := `{"config":{"name":"` + strings.Repeat("x", 2*api.MaxRequestBytes) + `"}}`
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		// Fails with EPIPE or ECONNRESET once the agent closes: expected.
		_, _ = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: vpcnid\r\nContent-Length: %d\r\n\r\n%s", api.PathAdd, len(body), body)
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to an oversized body: %v", err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), `"code":7`) || !strings.Contains(string(data), fmt.Sprint(api.MaxRequestBytes)) {
		t.Fatalf("answer %d %s, want 400 with CNI code 7 naming the %d-byte limit", res.StatusCode, data, api.MaxRequestBytes)
	}
}

func waitGone(t *testing.T, path string) {
	t.Helper()
	waitUntil(t, path+" to be unlinked", func() bool {
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist)
	})
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
