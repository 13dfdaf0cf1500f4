package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// FuzzSplitMarks: any port description, on any IPv4 subnet, is parsed
// into marks within the subnet or refused with an error, never a panic,
// and quickly (a description a tenant writes is read by vpcni-controller's
// leak audit too); what it parses, joinMarks writes back so that it reads
// the same.
func FuzzSplitMarks(f *testing.F) {
	for _, s := range []struct {
		desc string
		bits uint8
	}{
		{"[vpcni:2,4-6,a]", 24},
		{"web VM [vpcni:1-3]", 24},
		{"[vpcni:=gAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA]", 24},
		{"[vpcni:]", 28},
		{"[vpcni:2] [vpcni:3]", 24},
		{"[vpcni:0-zik0zj]", 8},
		{"[vpcni:0-9zldr]", 8},
		{"[vpcni:", 24},
		{"vpcni secondary NIC of instance i-1 [vpcni-own:10.0.0.7]", 24},
	} {
		f.Add(s.desc, byte(10), byte(1), byte(0), byte(0), s.bits)
	}
	f.Fuzz(func(t *testing.T, desc string, a, b, c, d, bits byte) {
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{a, b, c, d}), int(bits%33)).Masked()
		rest, marked, err := splitMarks(desc, subnet)
		if err != nil {
			return
		}
		if len(marked) > maxMarked {
			t.Fatalf("%q on %s marks %d addresses, more than the %d a node holds", desc, subnet, len(marked), maxMarked)
		}
		for m := range marked {
			if !subnet.Contains(m) {
				t.Fatalf("%q on %s marks %s, outside the subnet", desc, subnet, m)
			}
		}
		again, err := joinMarks(rest, marked, subnet)
		if err != nil {
			return // too long to write back: vpcni says so and writes nothing
		}
		rest2, marked2, err := splitMarks(again, subnet)
		if err != nil || rest2 != rest || len(marked2) != len(marked) {
			t.Fatalf("%q on %s: read %q %v, written back as %q, read again %q %v (%v)", desc, subnet, rest, marked, again, rest2, marked2, err)
		}
		for m := range marked {
			if !marked2[m] {
				t.Fatalf("%q on %s: %s marked, not after writing back %q", desc, subnet, m, again)
			}
		}
	})
}

// canned answers every request with body, and the i-th with the status
// statuses[i] picks (0, or past the end: the request's own success);
// past maxRequests it answers nothing, so a body that links to a next
// page of itself ends.
type canned struct {
	body     []byte
	statuses []byte
	n        int
}

const maxRequests = 100

var fuzzStatuses = []int{0, 200, 201, 204, 400, 403, 404, 409, 412, 500, 503}

func (c *canned) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	i := c.n
	c.n++
	if i >= maxRequests {
		return nil, errors.New("canned: no more answers")
	}
	code := 0
	if i < len(c.statuses) {
		code = fuzzStatuses[int(c.statuses[i])%len(fuzzStatuses)]
	}
	if code == 0 {
		switch r.Method {
		case http.MethodPost:
			code = http.StatusCreated
		case http.MethodDelete:
			code = http.StatusNoContent
		default:
			code = http.StatusOK
		}
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(c.body)),
		ContentLength: int64(len(c.body)), Request: r}, nil
}

// claimable is what the port in body holds as vpcni's: its marked fixed
// IPs on the subnet (fixed-ips mode), or its pairs (address-pairs mode).
func claimable(body []byte, mode string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	var doc struct {
		Subnet subnets.Subnet `json:"subnet"`
		Port   ports.Port     `json:"port"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return out
	}
	if mode == "address-pairs" {
		for _, ap := range doc.Port.AllowedAddressPairs {
			if a, err := netip.ParseAddr(ap.IPAddress); err == nil {
				out[a] = true
			}
		}
		return out
	}
	subnet, err := netip.ParsePrefix(doc.Subnet.CIDR)
	if err != nil {
		return out
	}
	marked, err := Marked(doc.Port.Description, subnet)
	if err != nil {
		return out
	}
	for _, f := range doc.Port.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == fuzzSubnetID && marked[a] {
			out[a] = true
		}
	}
	return out
}

const fuzzSubnetID = "0c9b7b2d-5b8f-4d62-9a3b-1f4e2c1d7a10"

// FuzzNeutronResponses: the provider reads Neutron's answers from the
// fuzz bytes — the subnet, the network, the VM port and port lists with
// fixed IPs, pairs and vpcni's marks in the description, floating IP
// lists, NeutronError bodies. Every answer's body is body (one JSON
// document may hold "subnet", "network", "port", "ports", "floatingips"
// and "NeutronError" at once, so each request finds its part), its status
// the next of statuses. Connecting, then Held, Assign and Release in mode
// fixed-ips or address-pairs, the provider returns errors, never panics,
// and never says it holds an address the body's port does not hold as
// vpcni's.
func FuzzNeutronResponses(f *testing.F) {
	backoffUnit = 0
	f.Fuzz(func(t *testing.T, body, statuses []byte, pairs bool) {
		mode := "fixed-ips"
		if pairs {
			mode = "address-pairs"
		}
		cfg := Config{Endpoint: "http://neutron.invalid/", SubnetID: fuzzSubnetID, Mode: mode, Retries: 2}
		cfg.Defaults()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := open(ctx, cfg, netip.MustParseAddr("10.0.0.10"), &canned{body: body, statuses: statuses})
		if err != nil {
			return
		}
		ours := claimable(body, mode)
		check := func(op string, leases []alloc.Lease) {
			for _, l := range leases {
				if !ours[l.Address] {
					t.Fatalf("%s (mode %s) says vpcni holds %s; the port in the body holds as vpcni's only %v", op, mode, l.Address, ours)
				}
			}
		}
		held, _ := p.Held(ctx)
		check("Held", held)
		got, _ := p.Assign(ctx, provider.AssignRequest{Count: 2, Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.3")}})
		check("Assign", got)
		_ = p.Release(ctx, provider.Addresses(append(held, got...)))
	})
}
