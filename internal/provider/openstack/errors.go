package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/vpcni/vpcni/internal/provider"
)

// backoffUnit is backoff's first pause (the fuzz target shortens it).
var backoffUnit = 100 * time.Millisecond

// backoff waits a jittered, growing pause before attempt n.
func backoff(ctx context.Context, attempt int) {
	d := min(backoffUnit<<attempt, 3*time.Second)
	d = d/2 + rand.N(d/2+1)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

var ipRe = regexp.MustCompile(`\b(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})\b`)

// v6In is the first IPv6 address a message names (invalid: none).
func v6In(msg string) netip.Addr {
	for _, w := range strings.Fields(msg) {
		w = strings.TrimRight(strings.Trim(w, ",;()'\""), ".")
		if a, err := netip.ParseAddr(w); err == nil && a.Is6() {
			return a
		}
	}
	return netip.Addr{}
}

// isNeutronError says whether err is an HTTP status with a NeutronError of
// the given type, and picks the address its message names.
func isNeutronError(err error, status int, typ string, addr *netip.Addr) bool {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) || code.Actual != status {
		return false
	}
	var body struct {
		NeutronError struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"NeutronError"`
	}
	if json.Unmarshal(code.Body, &body) != nil || body.NeutronError.Type != typ {
		return false
	}
	if addr != nil {
		if m := ipRe.FindString(body.NeutronError.Message); m != "" {
			*addr, _ = netip.ParseAddr(m)
		} else {
			*addr = v6In(body.NeutronError.Message)
		}
	}
	return true
}

// errNoObject: Neutron answered a call with success and a body without
// the object asked for ({} or null): gophercloud extracts no object and
// no error, and the object must not be used.
var errNoObject = errors.New("Neutron's answer holds no object")

// answered is what gophercloud extracted, errNoObject if that is nothing.
func answered[T any](v *T, err error) (*T, error) {
	if err == nil && v == nil {
		return nil, errNoObject
	}
	return v, err
}

// isStatus says whether err is an HTTP answer with that status.
func isStatus(err error, status int) bool {
	var code gophercloud.ErrUnexpectedResponseCode
	return errors.As(err, &code) && code.Actual == status
}

// retryable: a 412 (someone else wrote first), a 5xx, or no answer at all.
func retryable(err error) bool {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		return code.Actual == http.StatusPreconditionFailed || code.Actual >= 500
	}
	return errors.Is(err, provider.ErrUnavailable)
}

// explain adds what a person can do about a Neutron failure, and marks
// failures to reach Neutron as provider.ErrUnavailable.
func explain(err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		switch {
		case code.Actual == http.StatusUnauthorized:
			return fmt.Errorf("%w (Keystone refused the credentials: check the application credential or password)", err)
		case code.Actual == http.StatusForbidden:
			return explainDenied(err)
		case code.Actual >= 500:
			return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
		}
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if e := explainTLS(err); e != nil {
		return e // the node's settings, not the cloud: retrying cannot help
	}
	// No usable HTTP answer: refused, reset, timed out, or without the
	// object (errNoObject).
	return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
}

// callCounter counts HTTP requests by method.
type callCounter struct {
	next  http.RoundTripper
	gets  atomic.Int64
	puts  atomic.Int64
	other atomic.Int64
}

func (c *callCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.Method {
	case http.MethodGet:
		c.gets.Add(1)
	case http.MethodPut:
		c.puts.Add(1)
	default:
		c.other.Add(1)
	}
	return c.next.RoundTrip(r)
}

func (c *callCounter) snapshot() map[string]int64 {
	return map[string]int64{"GET": c.gets.Load(), "PUT": c.puts.Load(), "other": c.other.Load()}
}
