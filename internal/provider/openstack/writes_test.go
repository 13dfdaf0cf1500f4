package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider"
)

// These tests make the races of writes.go happen at exact moments: the
// provider talks to the lab's Neutron endpoint through a round tripper
// (hooks) at which the test acts as another writer, before vpcni's PUT
// reaches the endpoint or after it answered and before vpcni reads the
// answer and the port back.

// hooks lets the test act at the provider's PUTs of the VM port: before
// runs before one is sent and returns what is sent; after runs once one
// answered 200, before the provider sees the answer; answer may change
// the answer's body.
type hooks struct {
	next   http.RoundTripper
	port   string
	before func(*http.Request) *http.Request
	after  func()
	answer func(body []byte) []byte
}

func (h *hooks) RoundTrip(r *http.Request) (*http.Response, error) {
	put := r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/ports/"+h.port)
	if put && h.before != nil {
		r = h.before(r)
	}
	resp, err := h.next.RoundTrip(r)
	if !put || err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	if h.after != nil {
		h.after()
	}
	if h.answer != nil {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		body = h.answer(body)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header.Del("Content-Length")
	}
	return resp, nil
}

// once runs f the first time it is called.
func once(f func()) func() {
	var o sync.Once
	return func() { o.Do(f) }
}

// labNode is a VM port on the lab's endpoint with a provider for it whose
// PUTs go through h, and the notices the provider gave.
type labNode struct {
	nc       *gophercloud.ServiceClient // the other writer's client (no hooks)
	subnetID string
	portID   string
	subnet   netip.Prefix
	p        *Provider
	h        *hooks

	mu      sync.Mutex
	notices []provider.Notice
}

func newLabNode(t *testing.T, mode string) *labNode {
	t.Helper()
	srv := httptest.NewServer(neutronapi.New().Handler())
	t.Cleanup(srv.Close)
	ctx := context.Background()
	n := &labNode{nc: NoAuthClient(srv.URL, http.Client{Timeout: 10 * time.Second}), subnet: netip.MustParsePrefix("10.81.0.0/24")}
	net, err := networks.Create(ctx, n.nc, networks.CreateOpts{Name: "pods"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	gw := "10.81.0.1"
	sn, err := subnets.Create(ctx, n.nc, subnets.CreateOpts{NetworkID: net.ID, IPVersion: gophercloud.IPv4, CIDR: n.subnet.String(), GatewayIP: &gw,
		AllocationPools: []subnets.AllocationPool{{Start: "10.81.0.2", End: "10.81.0.100"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ports.Create(ctx, n.nc, ports.CreateOpts{NetworkID: net.ID, Name: "vm", DeviceOwner: "compute:test",
		FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: "10.81.0.10"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	n.subnetID, n.portID = sn.ID, vm.ID
	n.h = &hooks{next: http.DefaultTransport, port: vm.ID}
	cfg := Config{Endpoint: srv.URL, SubnetID: sn.ID, Mode: mode}
	cfg.Defaults()
	if n.p, err = open(ctx, cfg, netip.MustParseAddr("10.81.0.10"), n.h); err != nil {
		t.Fatal(err)
	}
	n.p.notify = func(x provider.Notice) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.notices = append(n.notices, x)
	}
	return n
}

func (n *labNode) told() []provider.Notice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.notices)
}

// read reads the VM port from the endpoint.
func (n *labNode) read(t *testing.T) *ports.Port {
	t.Helper()
	port, err := ports.Get(context.Background(), n.nc, n.portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// fixedIPs are the VM port's fixed IPs and vpcni's marks among them.
func (n *labNode) fixedIPs(t *testing.T) (on, marked map[netip.Addr]bool) {
	t.Helper()
	port := n.read(t)
	on = map[netip.Addr]bool{}
	for _, f := range port.FixedIPs {
		on[netip.MustParseAddr(f.IPAddress)] = true
	}
	marked, err := Marked(port.Description, n.subnet)
	if err != nil {
		t.Fatal(err)
	}
	return on, marked
}

// write is the other writer, well behaved: it reads the port, changes
// it, and writes it under If-Match.
func (n *labNode) write(t *testing.T, change func(port *ports.Port, opts *ports.UpdateOpts)) {
	t.Helper()
	port := n.read(t)
	rev := port.RevisionNumber
	opts := ports.UpdateOpts{RevisionNumber: &rev}
	change(port, &opts)
	if _, err := ports.Update(context.Background(), n.nc, n.portID, opts).Extract(); err != nil {
		t.Fatal(err)
	}
}

func withFixedIP(a netip.Addr, subnetID string) func(*ports.Port, *ports.UpdateOpts) {
	return func(port *ports.Port, o *ports.UpdateOpts) {
		fixed := []ports.IP{{SubnetID: subnetID, IPAddress: a.String()}}
		for _, f := range port.FixedIPs {
			fixed = append(fixed, ports.IP{SubnetID: f.SubnetID, IPAddress: f.IPAddress})
		}
		o.FixedIPs = fixed
	}
}

func withoutFixedIP(a netip.Addr) func(*ports.Port, *ports.UpdateOpts) {
	return func(port *ports.Port, o *ports.UpdateOpts) {
		fixed := []ports.IP{}
		for _, f := range port.FixedIPs {
			if f.IPAddress != a.String() {
				fixed = append(fixed, ports.IP{SubnetID: f.SubnetID, IPAddress: f.IPAddress})
			}
		}
		o.FixedIPs = fixed
	}
}

// ifMatch is r checked against the port's revision now: what Neutron's
// If-Match amounts to when a racing write lands between its check and
// its commit (it retries the write without the check).
func (n *labNode) ifMatch(t *testing.T, r *http.Request) *http.Request {
	r = r.Clone(r.Context())
	r.Header.Set("If-Match", fmt.Sprintf("revision_number=%d", n.read(t).RevisionNumber))
	return r
}

func kinds(ns []provider.Notice) []string {
	var out []string
	for _, x := range ns {
		out = append(out, x.Reason+"/"+x.Kind)
	}
	return out
}

// An address someone else removes between vpcni's write and its
// read-back was removed on purpose as far as vpcni can tell: it stays
// removed, on an Assign and on a Release alike, and that is no race.
func TestWriteLeavesAnAddressItsOwnerRemoved(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	ctx := context.Background()
	x, y := netip.MustParseAddr("10.81.0.200"), netip.MustParseAddr("10.81.0.201")
	n.write(t, withFixedIP(x, n.subnetID))
	n.write(t, withFixedIP(y, n.subnetID))
	n.h.after = once(func() { n.write(t, withoutFixedIP(x)) })
	got, err := n.p.Assign(ctx, provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) = %v, %v", got, err)
	}
	on, marked := n.fixedIPs(t)
	if on[x] {
		t.Errorf("%s is back on the port after its owner removed it during vpcni's Assign", x)
	}
	for _, l := range got {
		if !on[l.Address] || !marked[l.Address] {
			t.Errorf("vpcni's %s: on the port %v, marked %v", l.Address, on[l.Address], marked[l.Address])
		}
	}
	n.h.after = once(func() { n.write(t, withoutFixedIP(y)) })
	if err := n.p.Release(ctx, []netip.Addr{got[0].Address}); err != nil {
		t.Fatal(err)
	}
	on, marked = n.fixedIPs(t)
	if on[y] || on[x] {
		t.Errorf("after a Release during which %s was removed the port holds %s %v, %s %v", y, x, on[x], y, on[y])
	}
	if on[got[0].Address] || !on[got[1].Address] || !marked[got[1].Address] {
		t.Errorf("after releasing %s the port holds %v marked %v", got[0].Address, on, marked)
	}
	if told := n.told(); len(told) != 0 {
		t.Errorf("a removal after vpcni's write is no race, but the provider told %v", kinds(told))
	}
}

// A write of vpcni's that Neutron lets through after another write landed
// at the revision it was checked against is reported, with the
// revisions, and vpcni's own address holds.
func TestWriteReportsOneThatLandedOverAnother(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	x := netip.MustParseAddr("10.81.0.200")
	n.write(t, withFixedIP(x, n.subnetID))
	// The provider's copy of the port is current (Held reads it), so its
	// write goes out checked against r0.
	if _, err := n.p.Held(context.Background()); err != nil {
		t.Fatal(err)
	}
	r0 := n.read(t).RevisionNumber
	n.h.before = func(r *http.Request) *http.Request {
		n.h.before = nil
		n.write(t, withoutFixedIP(x))
		return n.ifMatch(t, r)
	}
	got, err := n.p.Assign(context.Background(), provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("Assign(1) = %v, %v", got, err)
	}
	on, marked := n.fixedIPs(t)
	if a := got[0].Address; !on[a] || !marked[a] {
		t.Errorf("vpcni's %s: on the port %v, marked %v", a, on[a], marked[a])
	}
	told := n.told()
	if len(told) != 1 || told[0].Reason != provider.ReasonWriteRace || told[0].Kind != "overlapped" {
		t.Fatalf("told %v, want one %s/overlapped", kinds(told), provider.ReasonWriteRace)
	}
	// Checked against r0; the other write moved it once, vpcni's twice.
	for _, want := range []string{n.portID, fmt.Sprintf("revision %d", r0), fmt.Sprintf("revision %d", r0+3)} {
		if !strings.Contains(told[0].Message, want) {
			t.Errorf("the notice does not say %q: %s", want, told[0].Message)
		}
	}
}

// A write from an older copy of the port that takes vpcni's addresses
// (and their marks) off between vpcni's write and its read-back: vpcni
// puts its own back, says so, and leaves the other writer's address alone.
func TestWritePutsBackItsOwnKnockedOut(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	ctx := context.Background()
	first, err := n.p.Assign(ctx, provider.AssignRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	stale := n.read(t) // before the next write
	x := netip.MustParseAddr("10.81.0.200")
	n.h.after = once(func() {
		// An older copy's fixed IPs (without what vpcni adds now, and
		// without first) and description, and an address of its own.
		var fixed []ports.IP
		for _, f := range stale.FixedIPs {
			if f.IPAddress != first[0].Address.String() {
				fixed = append(fixed, ports.IP{SubnetID: f.SubnetID, IPAddress: f.IPAddress})
			}
		}
		fixed = append(fixed, ports.IP{SubnetID: n.subnetID, IPAddress: x.String()})
		desc := ""
		rev := n.read(t).RevisionNumber
		if _, err := ports.Update(ctx, n.nc, n.portID, ports.UpdateOpts{FixedIPs: fixed, Description: &desc, RevisionNumber: &rev}).Extract(); err != nil {
			t.Fatal(err)
		}
	})
	second, err := n.p.Assign(ctx, provider.AssignRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	on, marked := n.fixedIPs(t)
	for _, a := range []netip.Addr{first[0].Address, second[0].Address} {
		if !on[a] || !marked[a] {
			t.Errorf("vpcni's %s: on the port %v, marked %v", a, on[a], marked[a])
		}
	}
	if !on[x] || marked[x] {
		t.Errorf("the other writer's %s: on the port %v (want true), marked %v (want false)", x, on[x], marked[x])
	}
	told := n.told()
	if len(told) != 1 || told[0].Kind != "knocked_out" || !strings.Contains(told[0].Message, first[0].Address.String()) ||
		!strings.Contains(told[0].Message, second[0].Address.String()) {
		t.Fatalf("told %v, want one knocked_out naming %s and %s", told, first[0].Address, second[0].Address)
	}
}

// An answer to vpcni's write that lacks someone else's address vpcni
// wrote back as it was is reported; vpcni does not write it back again.
func TestWriteReportsADroppedAddress(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	x := netip.MustParseAddr("10.81.0.200")
	n.write(t, withFixedIP(x, n.subnetID))
	n.h.after = once(func() { n.write(t, withoutFixedIP(x)) })
	n.h.answer = func(body []byte) []byte {
		n.h.answer = nil
		var doc struct {
			Port map[string]any `json:"port"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatal(err)
		}
		fixed := doc.Port["fixed_ips"].([]any)
		doc.Port["fixed_ips"] = slices.DeleteFunc(fixed, func(f any) bool { return f.(map[string]any)["ip_address"] == x.String() })
		out, _ := json.Marshal(doc)
		return out
	}
	got, err := n.p.Assign(context.Background(), provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("Assign(1) = %v, %v", got, err)
	}
	if on, _ := n.fixedIPs(t); on[x] {
		t.Errorf("%s is back on the port", x)
	}
	told := n.told()
	if len(told) != 1 || told[0].Kind != "dropped" || !strings.Contains(told[0].Message, x.String()) {
		t.Fatalf("told %v, want one dropped naming %s", told, x)
	}
}

// In address-pairs mode as with fixed IPs: a pair someone else removes
// between vpcni's write and its read-back stays removed.
func TestWritePairsLeavesAPairItsOwnerRemoved(t *testing.T) {
	n := newLabNode(t, "address-pairs")
	ctx := context.Background()
	vip := ports.AddressPair{IPAddress: "10.81.0.200"}
	n.write(t, func(_ *ports.Port, o *ports.UpdateOpts) { o.AllowedAddressPairs = &[]ports.AddressPair{vip} })
	n.h.after = once(func() {
		n.write(t, func(port *ports.Port, o *ports.UpdateOpts) {
			pairs := slices.DeleteFunc(slices.Clone(port.AllowedAddressPairs), func(ap ports.AddressPair) bool { return ap.IPAddress == vip.IPAddress })
			o.AllowedAddressPairs = &pairs
		})
	})
	got, err := n.p.Assign(ctx, provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) = %v, %v", got, err)
	}
	pairs := map[string]bool{}
	for _, ap := range n.read(t).AllowedAddressPairs {
		pairs[ap.IPAddress] = true
	}
	if pairs[vip.IPAddress] {
		t.Errorf("the pair %s is back on the port after its owner removed it during vpcni's Assign", vip.IPAddress)
	}
	for _, l := range got {
		if !pairs[l.Address.String()] {
			t.Errorf("vpcni's pair %s is not on the port: %v", l.Address, pairs)
		}
	}
	if told := n.told(); len(told) != 0 {
		t.Errorf("a removal after vpcni's write is no race, but the provider told %v", kinds(told))
	}
}

// In address-pairs mode, a write from an older copy that takes one of
// vpcni's pairs off while vpcni releases another: the release goes
// through and vpcni's pair is put back, with a notice.
func TestWritePairsPutsBackItsOwnDuringARelease(t *testing.T) {
	n := newLabNode(t, "address-pairs")
	ctx := context.Background()
	got, err := n.p.Assign(ctx, provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) = %v, %v", got, err)
	}
	gone, kept := got[0].Address, got[1].Address
	n.h.after = once(func() {
		n.write(t, func(port *ports.Port, o *ports.UpdateOpts) {
			pairs := slices.DeleteFunc(slices.Clone(port.AllowedAddressPairs), func(ap ports.AddressPair) bool { return ap.IPAddress == kept.String() })
			o.AllowedAddressPairs = &pairs
		})
	})
	if err := n.p.Release(ctx, []netip.Addr{gone}); err != nil {
		t.Fatal(err)
	}
	pairs := map[string]bool{}
	for _, ap := range n.read(t).AllowedAddressPairs {
		pairs[ap.IPAddress] = true
	}
	if pairs[gone.String()] || !pairs[kept.String()] {
		t.Errorf("after releasing %s the port's pairs are %v, want only %s", gone, pairs, kept)
	}
	told := n.told()
	if len(told) != 1 || told[0].Kind != "knocked_out" || !strings.Contains(told[0].Message, kept.String()) {
		t.Fatalf("told %v, want one knocked_out naming %s", told, kept)
	}
}

// requests counts the provider's HTTP requests by method from now on.
func (n *labNode) requests() func() map[string]int64 {
	before := n.p.calls.snapshot()
	return func() map[string]int64 {
		out := map[string]int64{}
		for k, v := range n.p.calls.snapshot() {
			if d := v - before[k]; d != 0 {
				out[k] = d
			}
		}
		return out
	}
}

// On a port only vpcni writes, an Assign is one PUT and its read-back,
// and a Release the floating-IP check, one PUT and its read-back: no GET
// of the port before the write, however long ago the provider last read
// it (If-Match guards the copy), and the listing of the subnet's ports
// that an old copy of them calls for runs off the write's path.
func TestWritesOnACurrentCopyMakeNoReadFirst(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	ctx := context.Background()
	n.p.portAt = time.Now().Add(-time.Hour) // a copy an hour old, still right
	count := n.requests()
	got, err := n.p.Assign(ctx, provider.AssignRequest{Count: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("Assign(3) = %v, %v", got, err)
	}
	if c := count(); c["GET"] != 1 || c["PUT"] != 1 || len(c) != 2 {
		t.Errorf("Assign on a current copy made %v requests, want one PUT and its read-back", c)
	}
	count = n.requests()
	if err := n.p.Release(ctx, provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	if c := count(); c["GET"] != 2 || c["PUT"] != 1 || len(c) != 2 {
		t.Errorf("Release on a current copy made %v requests, want the floating-IP check, one PUT and its read-back", c)
	}
	if on, _ := n.fixedIPs(t); on[got[0].Address] {
		t.Errorf("%s is still on the port after its Release", got[0].Address)
	}

	// The subnet's used addresses as read an hour ago: the Assign goes
	// ahead on them and they are listed again in the background.
	// (The listing may end before or after the Assign's write: whether it
	// saw vpcni's new address is a race, and harmless — candidates skip
	// the port's own addresses anyway.)
	n.p.usedAt = time.Now().Add(-time.Hour)
	began := time.Now()
	got, err = n.p.Assign(ctx, provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("Assign(1) = %v, %v", got, err)
	}
	waitUntil(t, func() bool { n.p.mu.Lock(); defer n.p.mu.Unlock(); return !n.p.usedListing })
	n.p.mu.Lock()
	at := n.p.usedAt
	n.p.mu.Unlock()
	if at.Before(began) {
		t.Errorf("the subnet's used addresses were not listed again in the background (last read %s before the Assign)", began.Sub(at))
	}
}

// A copy of the port someone else's write made stale is turned back by
// If-Match (412): vpcni reads the port and plans again, so an address the
// other writer put on the port meanwhile — the one vpcni would have
// picked — stays theirs, unmarked, and vpcni takes another.
func TestAStaleCopyIsPlannedAgain(t *testing.T) {
	n := newLabNode(t, "fixed-ips")
	ctx := context.Background()
	// vpcni's copy says nothing but the node's IP is on the port; the
	// lowest free address, the one pick takes first, goes on it by hand.
	x := n.p.pick(1, map[netip.Addr]bool{}, nil, nil)[0]
	n.write(t, withFixedIP(x, n.subnetID))
	count := n.requests()
	got, err := n.p.Assign(ctx, provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("Assign(1) = %v, %v", got, err)
	}
	if got[0].Address == x {
		t.Fatalf("vpcni took %s, which another writer put on the port", x)
	}
	on, marked := n.fixedIPs(t)
	if !on[x] || marked[x] {
		t.Errorf("the other writer's %s: on the port %v (want true), marked %v (want false)", x, on[x], marked[x])
	}
	if a := got[0].Address; !on[a] || !marked[a] {
		t.Errorf("vpcni's %s: on the port %v, marked %v", a, on[a], marked[a])
	}
	if c := count(); c["PUT"] != 2 || c["GET"] != 2 {
		t.Errorf("a write on a stale copy made %v requests, want a PUT turned back, a GET, the PUT and its read-back", c)
	}
	if told := n.told(); len(told) != 0 {
		t.Errorf("a write turned back by If-Match is no race, but the provider told %v", kinds(told))
	}
	// A Release on a copy made stale the same way goes through too.
	y := netip.MustParseAddr("10.81.0.90")
	n.write(t, withFixedIP(y, n.subnetID))
	if err := n.p.Release(ctx, provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	on, _ = n.fixedIPs(t)
	if on[got[0].Address] || !on[x] || !on[y] {
		t.Errorf("after the Release the port holds %v: want %s gone, %s and %s kept", on, got[0].Address, x, y)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
