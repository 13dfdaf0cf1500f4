package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Client talks to vpcnid over its unix socket: one HTTP/1.1 request per
// connection, written by hand so that the CNI plugin does not carry
// net/http (its start-up is on every pod's critical path). The agent always
// answers with a Content-Length.
type Client struct {
	Socket string
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Client{Socket: socket}
}

// UnreachableError says the agent could not be reached at all: the request
// was not processed, so the caller may retry it safely.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("vpcnid is not reachable at %s: %v", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// HangupError says the agent closed or reset the connection before its
// answer was complete: it stopped, restarted or crashed while the request
// waited on its socket or was being served. The agent may have acted on the
// request, and repeating it is still safe: every verb it serves is
// idempotent (an ADD for a container and interface it already wired
// returns the same address).
type HangupError struct {
	Socket string
	Op     string // "send request" or "read answer"
	Err    error
}

func (e *HangupError) Error() string {
	return fmt.Sprintf("vpcnid at %s closed the connection before answering (%s): %v", e.Socket, e.Op, e.Err)
}

func (e *HangupError) Unwrap() error { return e.Err }

// TooLargeError says the request is over MaxRequestBytes, the most the
// agent reads. It was not sent: the agent would only refuse it, and the
// caller learns the size and the limit instead of a broken pipe.
type TooLargeError struct {
	Size, Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("request of %d bytes is over vpcnid's limit of %d bytes", e.Size, e.Limit)
}

// Do POSTs in (or GETs when in is nil) to path and decodes the answer into
// out (a *json.RawMessage keeps it raw). A CNI error from the agent comes
// back as *Error; failing to connect as *UnreachableError; the agent going
// away before it answered as *HangupError; a body over MaxRequestBytes, not
// sent, as *TooLargeError.
func (c *Client) Do(ctx context.Context, path string, in, out any) error {
	method, body := "GET", []byte(nil)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		method, body = "POST", b
	}
	if len(body) > MaxRequestBytes {
		return &TooLargeError{Size: len(body), Limit: MaxRequestBytes}
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("vpcnid at %s: %w", c.Socket, ctx.Err())
		}
		var opErr *net.OpError
		if ok := asOpError(err, &opErr); ok {
			return &UnreachableError{Socket: c.Socket, Err: opErr.Err}
		}
		return &UnreachableError{Socket: c.Socket, Err: err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: vpcnid\r\nConnection: close\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	status, data, err := 0, []byte(nil), error(nil)
	if _, werr := conn.Write(req.Bytes()); werr != nil {
		// An agent that stops reading a body it refuses (over its limit,
		// which may differ from ours during an upgrade) answers first, then
		// closes: its answer says more than the broken pipe.
		if !hungUp(werr) {
			return c.ioError(ctx, "send request", werr)
		}
		if status, data, err = readResponse(bufio.NewReader(conn)); err != nil {
			return c.ioError(ctx, "send request", werr)
		}
	} else if status, data, err = readResponse(bufio.NewReader(conn)); err != nil {
		return c.ioError(ctx, "read answer", err)
	}
	if status != 200 {
		e := &Error{}
		if json.Unmarshal(data, e) != nil || e.Code == 0 {
			return fmt.Errorf("vpcnid answered %d: %s", status, bytes.TrimSpace(data))
		}
		return e
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], data...)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode vpcnid answer: %w", err)
	}
	return nil
}

func (c *Client) ioError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	} else if _, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) {
		// The socket's deadline is the context's, and may pass a moment
		// before the context's own timer marks it done.
		err = context.DeadlineExceeded
	} else if hungUp(err) {
		return &HangupError{Socket: c.Socket, Op: what, Err: err}
	}
	return fmt.Errorf("vpcnid at %s: %s: %w", c.Socket, what, err)
}

// hungUp says whether err is the peer going away: the end of the stream
// before a whole answer (the agent closed the connection), ECONNRESET (it
// closed with our request unread, or its listener closed with the
// connection still in the backlog), or EPIPE (it was gone while we wrote).
func hungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func asOpError(err error, target **net.OpError) bool {
	for err != nil {
		if op, ok := err.(*net.OpError); ok {
			*target = op
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// readResponse reads an HTTP/1.1 status line, headers and a body of
// Content-Length bytes.
func readResponse(r *bufio.Reader) (status int, body []byte, err error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, nil, err
	}
	parts := strings.SplitN(strings.TrimSpace(line), " ", 3)
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "HTTP/1.") {
		return 0, nil, fmt.Errorf("not an HTTP answer: %q", line)
	}
	if status, err = strconv.Atoi(parts[1]); err != nil {
		return 0, nil, fmt.Errorf("bad HTTP status %q", parts[1])
	}
	length := -1
	for {
		h, err := r.ReadString('\n')
		if err != nil {
			return 0, nil, err
		}
		h = strings.TrimSpace(h)
		if h == "" {
			break
		}
		k, v, _ := strings.Cut(h, ":")
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "content-length":
			if length, err = strconv.Atoi(strings.TrimSpace(v)); err != nil || length < 0 || length > 64<<20 {
				return 0, nil, fmt.Errorf("bad Content-Length %q", v)
			}
		case "transfer-encoding":
			return 0, nil, fmt.Errorf("unexpected Transfer-Encoding %q", v)
		}
	}
	if length < 0 {
		body, err = io.ReadAll(io.LimitReader(r, 64<<20))
		return status, body, err
	}
	body = make([]byte, length)
	_, err = io.ReadFull(r, body)
	return status, body, err
}
