package cniplugin_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/api/apitest"
	"github.com/vpcni/vpcni/internal/cniplugin"
)

// staleSocket is what a killed agent leaves: the socket file, no listener.
func staleSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vpcnid.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	return sock
}

// fullBacklog is a live agent that accepts nothing, its backlog (1) full.
func fullBacklog(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vpcnid.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	for range 64 {
		c, err := net.Dial("unix", sock)
		if errors.Is(err, syscall.EAGAIN) {
			return sock
		}
		if err != nil {
			t.Fatalf("fill the backlog: %v", err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatal("64 connects to a socket with a backlog of 1 never got EAGAIN")
	return ""
}

func readRequest(c net.Conn) {
	if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
}

func conf(sock, extra string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"n","type":"vpcni","socket":"` + sock + `"` + extra + `}`)
}

// verbs runs every verb the way skel does, with a namespace that exists.
func verbs(t *testing.T, stdin []byte) map[string]error {
	args := &skel.CmdArgs{ContainerID: "c0ffee", Netns: t.TempDir(), IfName: "eth0", StdinData: stdin}
	f := cniplugin.Funcs()
	return map[string]error{
		"ADD": f.Add(args), "DEL": f.Del(args), "CHECK": f.Check(args), "GC": f.GC(args), "STATUS": f.Status(args),
	}
}

// Every failure a retry cures is "try again later" (11), saying what
// happened, for every verb: no agent at all, a dead agent's socket, and an
// agent that went away after it took the connection (the restart case:
// every verb is idempotent in the agent, so a retry is safe even then).
// What no retry cures is not 11.
func TestCallErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		sock string
		code uint
		says string
	}{
		{"no socket", filepath.Join(t.TempDir(), "none.sock"), types.ErrTryAgainLater, "not running on this node (no socket"},
		{"socket of a dead agent", staleSocket(t), types.ErrTryAgainLater, "not running on this node (nothing listens"},
		{"backlog full", fullBacklog(t), types.ErrTryAgainLater, "too busy"},
		{"closed after reading the request", apitest.ServeConn(t, readRequest), types.ErrTryAgainLater, "closed the connection before answering"},
		{"closed with the request unread (reset)", apitest.ServeConn(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) }), types.ErrTryAgainLater, "closed the connection before answering"},
		{"closed halfway through the answer", apitest.ServeConn(t, func(c net.Conn) {
			readRequest(c)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
		}), types.ErrTryAgainLater, "closed the connection before answering"},
		{"not an HTTP peer", apitest.ServeConn(t, func(c net.Conn) {
			readRequest(c)
			_, _ = io.WriteString(c, "SSH-2.0-OpenSSH\r\n")
		}), types.ErrInternal, "vpcnid call failed"},
	} {
		for verb, err := range verbs(t, conf(tc.sock, "")) {
			e := cniError(t, err)
			if e.Code != tc.code || !strings.Contains(e.Msg, tc.says) {
				t.Errorf("%s, %s: code %d %q; want %d saying %q", tc.name, verb, e.Code, e.Error(), tc.code, tc.says)
			}
			if tc.code == types.ErrTryAgainLater && !strings.Contains(e.Msg, "try again later") {
				t.Errorf("%s, %s: %q does not say to try again later", tc.name, verb, e.Msg)
			}
		}
	}
}

// A configuration over the agent's limit is refused by the plugin, naming
// size and limit, before it calls the agent: with no agent at all the
// answer is still 7, not 11.
func TestCallRefusesConfigOverLimit(t *testing.T) {
	pad := `,"pad":"` + strings.Repeat("x", api.MaxRequestBytes) + `"`
	for verb, err := range verbs(t, conf(filepath.Join(t.TempDir(), "none.sock"), pad)) {
		e := cniError(t, err)
		if e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "too large") || !strings.Contains(e.Msg, strconv.Itoa(api.MaxRequestBytes)) {
			t.Errorf("%s: code %d %q; want %d naming the %d-byte limit", verb, e.Code, e.Error(), types.ErrInvalidNetworkConfig, api.MaxRequestBytes)
		}
	}
}
