package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/api/apitest"
)

// serve runs a real net/http server on a unix socket in a temp dir.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vpcnid.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// serveRaw answers every connection with exactly the bytes given, after
// reading the request, then closes it.
func serveRaw(t *testing.T, answer string) string {
	return apitest.ServeConn(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, answer)
	})
}

// writeJSON answers the way the agent does: always with a Content-Length.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	data = append(data, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestDoPostDecodesAnswer(t *testing.T) {
	in := &api.CNIRequest{
		ContainerID: "c0ffee", Netns: "/var/run/netns/x", IfName: "eth0",
		Args:   "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
		Config: json.RawMessage(`{"cniVersion":"1.0.0","name":"vpcni","type":"vpcni"}`),
	}
	want := api.State{Node: "node-1", Ready: true, Provider: "static", MTU: 1500, Pool: api.PoolState{Free: 3, Capacity: 250},
		Allocations: []alloc.Allocation{{ContainerID: "c0ffee", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")}}}}
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != api.PathAdd {
			http.Error(w, "wrong method or path: "+r.Method+" "+r.URL.Path, http.StatusTeapot)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			http.Error(w, "content type "+ct, http.StatusTeapot)
			return
		}
		var got api.CNIRequest
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil || !reflect.DeepEqual(&got, in) {
			http.Error(w, "request body arrived as "+got.ContainerID, http.StatusTeapot)
			return
		}
		writeJSON(w, http.StatusOK, want)
	})
	var got api.State
	if err := api.NewClient(sock).Do(ctx(t), api.PathAdd, in, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
}

func TestDoGetWithoutBody(t *testing.T) {
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != api.PathState || r.ContentLength > 0 {
			http.Error(w, "want a bodiless GET of the state", http.StatusTeapot)
			return
		}
		writeJSON(w, http.StatusOK, api.State{Node: "n"})
	})
	var st api.State
	if err := api.NewClient(sock).Do(ctx(t), api.PathState, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "n" {
		t.Fatalf("node = %q", st.Node)
	}
}

func TestDoRawAndNilOut(t *testing.T) {
	body := `{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.5/24"}]}`
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	})
	raw := json.RawMessage("stale")
	if err := api.NewClient(sock).Do(ctx(t), api.PathAdd, struct{}{}, &raw); err != nil {
		t.Fatal(err)
	}
	if string(raw) != body {
		t.Fatalf("raw answer = %s, want %s verbatim", raw, body)
	}
	if err := api.NewClient(sock).Do(ctx(t), api.PathDel, struct{}{}, nil); err != nil {
		t.Fatalf("nil out: %v", err)
	}
	// A 200 whose body does not fit out is an error, not a silent zero.
	var n int
	if err := api.NewClient(sock).Do(ctx(t), api.PathAdd, struct{}{}, &n); err == nil {
		t.Fatal("decoding an object into an int succeeded")
	}
}

func TestDoCNIError(t *testing.T) {
	for _, tc := range []struct {
		status int
		err    api.Error
	}{
		{http.StatusBadRequest, api.Error{Code: api.CodeInvalidConfig, Msg: "invalid config", Details: `"name" is required`}},
		{http.StatusNotFound, api.Error{Code: api.CodeUnknownContainer, Msg: "unknown container"}},
		{http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Msg: "boom", Details: "stack"}},
		{http.StatusServiceUnavailable, api.Error{Code: api.CodeTryAgainLater, Msg: "no free address", Details: "pool refilling"}},
	} {
		sock := serve(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, tc.status, tc.err) })
		err := api.NewClient(sock).Do(ctx(t), api.PathAdd, struct{}{}, &api.State{})
		var e *api.Error
		if !errors.As(err, &e) {
			t.Errorf("%d: error %v (%T) is not an *api.Error", tc.status, err, err)
			continue
		}
		if *e != tc.err {
			t.Errorf("%d: got %+v, want %+v", tc.status, *e, tc.err)
		}
	}
}

func TestDoNonJSONError(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
	}{
		{http.StatusBadGateway, "upstream exploded\n"},
		{http.StatusInternalServerError, `{"code":0,"msg":"no code"}`}, // JSON but not a CNI error
		{http.StatusNotFound, "<html>404 page not found</html>"},
	} {
		sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(tc.body)))
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		})
		err := api.NewClient(sock).Do(ctx(t), api.PathAdd, struct{}{}, nil)
		if err == nil {
			t.Errorf("%d %q: no error", tc.status, tc.body)
			continue
		}
		var e *api.Error
		if errors.As(err, &e) {
			t.Errorf("%d %q: came back as a CNI error %+v", tc.status, tc.body, e)
		}
		msg := err.Error()
		if !strings.Contains(msg, strconv.Itoa(tc.status)) || !strings.Contains(msg, strings.TrimSpace(tc.body)) {
			t.Errorf("%d %q: error %q should give the status and the body", tc.status, tc.body, msg)
		}
	}
}

func TestDoUnreachable(t *testing.T) {
	dir := t.TempDir()
	notSocket := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sock  string
		errno syscall.Errno
	}{
		{filepath.Join(dir, "missing.sock"), syscall.ENOENT},
		{notSocket, syscall.ECONNREFUSED},
	} {
		err := api.NewClient(tc.sock).Do(ctx(t), api.PathAdd, struct{}{}, nil)
		var u *api.UnreachableError
		if !errors.As(err, &u) {
			t.Errorf("%s: error %v (%T) is not an *api.UnreachableError", tc.sock, err, err)
			continue
		}
		if u.Socket != tc.sock {
			t.Errorf("UnreachableError.Socket = %q, want %q", u.Socket, tc.sock)
		}
		if !errors.Is(err, tc.errno) {
			t.Errorf("%s: %v does not wrap %v", tc.sock, err, tc.errno)
		}
		if !strings.Contains(err.Error(), tc.sock) {
			t.Errorf("error %q does not name the socket", err)
		}
	}
	if c := api.NewClient(""); c.Socket != api.DefaultSocket {
		t.Errorf("NewClient(\"\").Socket = %q, want %q", c.Socket, api.DefaultSocket)
	}
}

// stalling serves a handler that has received the request and then never
// answers until the test ends.
func stalling(t *testing.T) (sock string, received <-chan struct{}) {
	got := make(chan struct{}, 1)
	release := make(chan struct{})
	sock = serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the server closes
	return sock, got
}

func TestDoDeadlineWhileServerStalls(t *testing.T) {
	sock, received := stalling(t)
	c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := api.NewClient(sock).Do(c, api.PathAdd, struct{}{}, nil)
	elapsed := time.Since(start)
	select {
	case <-received:
	default:
		t.Fatal("the server never saw the request: the test did not stall where it should")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want one wrapping context.DeadlineExceeded", err)
	}
	var u *api.UnreachableError
	if errors.As(err, &u) {
		t.Errorf("a request the agent received came back as unreachable (safe to retry): %v", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("Do returned after %s, long past the 200ms deadline", elapsed)
	}
}

func TestDoCancelWhileServerStalls(t *testing.T) {
	sock, received := stalling(t)
	c, cancel := context.WithCancel(context.Background())
	go func() {
		<-received
		cancel()
	}()
	done := make(chan error, 1)
	go func() { done <- api.NewClient(sock).Do(c, api.PathAdd, struct{}{}, nil) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want one wrapping context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not return after its context was cancelled")
	}
}

func TestDoNoContentLengthWithConnectionClose(t *testing.T) {
	sock := serveRaw(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+`{"node":"raw","ready":true}`)
	var st api.State
	if err := api.NewClient(sock).Do(ctx(t), api.PathState, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "raw" || !st.Ready {
		t.Fatalf("decoded %+v", st)
	}

	sock = serveRaw(t, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n"+`{"code":11,"msg":"try later"}`)
	err := api.NewClient(sock).Do(ctx(t), api.PathAdd, struct{}{}, nil)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeTryAgainLater || e.Msg != "try later" {
		t.Fatalf("error %v, want the CNI error with code 11", err)
	}
}

func TestDoNoContentLengthFromNetHTTP(t *testing.T) {
	// net/http sends neither a length nor chunks, and closes the connection,
	// when the handler asks for identity encoding and flushes.
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Transfer-Encoding", "identity")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"node":`)
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `"streamed"}`)
	})
	var st api.State
	if err := api.NewClient(sock).Do(ctx(t), api.PathState, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "streamed" {
		t.Fatalf("decoded %+v", st)
	}
}

func TestDoRejectsChunked(t *testing.T) {
	// What net/http does when a handler flushes without a Content-Length.
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"node":`)
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `"chunked"}`)
	})
	var st api.State
	err := api.NewClient(sock).Do(ctx(t), api.PathState, nil, &st)
	if err == nil {
		t.Fatalf("a chunked answer was accepted and decoded as %+v", st)
	}
	if msg := err.Error(); !strings.Contains(msg, "Transfer-Encoding") || !strings.Contains(msg, "chunked") {
		t.Fatalf("error %q should say the answer was chunked", msg)
	}
	if st.Node != "" {
		t.Fatalf("out was filled in despite the error: %+v", st)
	}
}

func TestDoMalformedAnswers(t *testing.T) {
	for name, answer := range map[string]string{
		"not HTTP":         "SSH-2.0-OpenSSH\r\n",
		"bad status":       "HTTP/1.1 abc OK\r\n\r\n",
		"truncated body":   "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"node\":",
		"negative length":  "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}",
		"headers cut off":  "HTTP/1.1 200 OK\r\nContent-Le",
		"empty":            "",
		"200, not JSON":    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"huge length":      "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{}",
		"non-numeric size": "HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n{}",
	} {
		sock := serveRaw(t, answer)
		var st api.State
		if err := api.NewClient(sock).Do(ctx(t), api.PathState, nil, &st); err == nil {
			t.Errorf("%s: accepted, decoded %+v", name, st)
		}
	}
}

// readRequest reads one whole request, body included.
func readRequest(c net.Conn) {
	if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
}

// An agent that goes away after it took the connection — closing it with
// or without reading the request, or halfway through its answer — is a
// hangup: safe to retry, and not mistaken for an agent that never got the
// request.
func TestDoHangup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handle func(net.Conn)
		is     error
	}{
		{"closed after reading the request", readRequest, io.EOF},
		// Closing with the request unread makes the kernel reset the
		// connection.
		{"closed with the request unread", func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) }, syscall.ECONNRESET},
		{"closed halfway through the answer", func(c net.Conn) {
			readRequest(c)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"node\":")
		}, io.ErrUnexpectedEOF},
	} {
		sock := apitest.ServeConn(t, tc.handle)
		err := api.NewClient(sock).Do(ctx(t), api.PathAdd, &api.CNIRequest{Config: json.RawMessage(`{}`)}, &api.State{})
		var h *api.HangupError
		if !errors.As(err, &h) {
			t.Errorf("%s: error %v (%T) is not an *api.HangupError", tc.name, err, err)
			continue
		}
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.is)
		}
		var u *api.UnreachableError
		if errors.As(err, &u) {
			t.Errorf("%s: reported as unreachable, though the agent took the connection: %v", tc.name, err)
		}
		if h.Socket != sock || !strings.Contains(err.Error(), sock) {
			t.Errorf("%s: error %q does not name the socket %s", tc.name, err, sock)
		}
	}
}

// A body over MaxRequestBytes is refused before any connection: the agent
// would only cut it off.
func TestDoTooLargeNotSent(t *testing.T) {
	var accepted atomic.Int32
	sock := apitest.ServeConn(t, func(c net.Conn) { accepted.Add(1) })
	big := &api.CNIRequest{Config: json.RawMessage(`{"pad":"` + strings.Repeat("x", api.MaxRequestBytes) + `"}`)}
	err := api.NewClient(sock).Do(ctx(t), api.PathAdd, big, nil)
	var tl *api.TooLargeError
	if !errors.As(err, &tl) {
		t.Fatalf("error %v (%T), want *api.TooLargeError", err, err)
	}
	if tl.Limit != api.MaxRequestBytes || tl.Size <= api.MaxRequestBytes {
		t.Errorf("size %d, limit %d: want the body's size over the limit %d", tl.Size, tl.Limit, api.MaxRequestBytes)
	}
	// A small request goes through: its connection proves
	// the server was reachable all along.
	small := &api.CNIRequest{Config: json.RawMessage(`{}`)}
	_ = api.NewClient(sock).Do(ctx(t), api.PathAdd, small, nil)
	if n := accepted.Load(); n != 1 {
		t.Errorf("server accepted %d connections, want 1 (only the small request's)", n)
	}
}

// An agent with a smaller limit (another version, mid-upgrade) answers and
// closes while the client still sends: the client reports the agent's
// answer, not the broken pipe.
func TestDoAnswerAfterAgentStopsReading(t *testing.T) {
	const limit = 64 << 10
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, limit)); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Code: api.CodeInvalidConfig, Msg: "request too large"})
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	body := &api.CNIRequest{Config: json.RawMessage(`{"pad":"` + strings.Repeat("x", 8*limit) + `"}`)}
	err := api.NewClient(sock).Do(ctx(t), api.PathAdd, body, nil)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeInvalidConfig {
		t.Fatalf("error %v (%T), want the agent's CNI error 7", err, err)
	}
}
