package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client talks to vpcnid over its unix socket.
type Client struct {
	Socket string
	http   *http.Client
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	return &Client{
		Socket: socket,
		http: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", socket)
			},
			DisableCompression: true,
		}},
	}
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

// Do POSTs in (or GETs when in is nil) to path and decodes the answer into
// out. A CNI error from the agent comes back as *Error; a transport failure
// before the request reached the agent as *UnreachableError.
func (c *Client) Do(ctx context.Context, path string, in, out any) error {
	method, body := http.MethodGet, io.Reader(nil)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vpcnid"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" {
			return &UnreachableError{Socket: c.Socket, Err: opErr.Err}
		}
		return fmt.Errorf("vpcnid at %s: %w", c.Socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read vpcnid answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{}
		if json.Unmarshal(data, e) != nil || e.Code == 0 {
			return fmt.Errorf("vpcnid answered %s: %s", resp.Status, bytes.TrimSpace(data))
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
