package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
)

func reqIP(id, netns, args string) *api.CNIRequest {
	r := req(id, netns)
	r.Args += ";" + args
	return r
}

// held is what the static provider holds for the node, from its state
// file (written before each Assign or Release returns).
func (r *running) held(t *testing.T) []netip.Addr {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(r.cfg.StateDir, "static-provider.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Held []netip.Addr }
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st.Held
}

// A requested address is the pod's: the ADD gets exactly it (from the
// provider, or from the pool even while it cools), refuses what cannot be
// had with a proper code and leaks nothing, and DEL gives it straight back
// to the provider.
func TestRequestedAddress(t *testing.T) {
	n := newNode(t, "10.9.5.0/24", func(c *config.Config) { c.Cooldown.Duration = time.Hour })
	a := n.start()
	ctx := context.Background()
	want := netip.MustParseAddr("10.9.5.77")
	res, aerr := a.Add(ctx, reqIP("c1", n.pod("p1"), "IP=10.9.5.77"))
	if aerr != nil {
		t.Fatalf("ADD with IP=%s: %v", want, aerr)
	}
	if got := res.IPs[0].Address.IP.String(); got != want.String() {
		t.Fatalf("ADD with IP=%s got %s", want, got)
	}
	if r, _ := a.store.Get("c1", "eth0"); r == nil || !r.Requested {
		t.Fatalf("record %+v: not marked requested", r)
	}
	// A repeated ADD asking for the same address answers the same; one
	// asking for another is refused.
	if res, aerr := a.Add(ctx, reqIP("c1", n.pod("p1"), "IP=10.9.5.77")); aerr != nil || res.IPs[0].Address.IP.String() != want.String() {
		t.Errorf("repeated ADD with IP=%s = %v, %v", want, res, aerr)
	}
	if _, aerr := a.Add(ctx, reqIP("c1", n.pod("p1"), "IP=10.9.5.78")); aerr == nil || aerr.Code != api.CodeInvalidEnv {
		t.Errorf("repeated ADD asking for another address = %v, want code 4", aerr)
	}
	before := a.addrs.Status(time.Now())
	for _, c := range []struct {
		id, args string
		code     uint
	}{
		{"c2", "IP=10.9.5.77", api.CodeTryAgainLater}, // another pod's
		{"c3", "IP=10.9.9.9", api.CodeInvalidEnv},     // outside the range
		{"c4", "IP=banana", api.CodeInvalidEnv},
		{"c5", "IP=10.9.5.78;IP=10.9.5.79", api.CodeInvalidEnv},
	} {
		if _, aerr := a.Add(ctx, reqIP(c.id, n.pod(c.id), c.args)); aerr == nil || aerr.Code != c.code {
			t.Errorf("ADD %s with %s = %v, want code %d", c.id, c.args, aerr, c.code)
		}
		if r, _ := a.store.Get(c.id, "eth0"); r != nil {
			t.Errorf("refused ADD %s left a record %+v", c.id, r)
		}
	}
	if after := a.addrs.Status(time.Now()); after.Allocated != before.Allocated || len(a.held(t)) != len(before.Addresses["free"])+len(before.Addresses["allocated"])+len(before.Addresses["cooling"]) {
		t.Errorf("refused ADDs changed the pool or the provider: %+v -> %+v, provider holds %v", before, after, a.held(t))
	}
	a.checkInvariant(t, n)
	if aerr := a.Del(ctx, req("c1", "")); aerr != nil {
		t.Fatal(aerr)
	}
	if slices.Contains(a.held(t), want) {
		t.Errorf("provider still holds %s after DEL: a requested address must go back at once", want)
	}
	if s := a.addrs.Status(time.Now()); slices.Contains(s.Addresses["cooling"], want) || slices.Contains(s.Addresses["free"], want) {
		t.Errorf("pool kept %s after DEL: %+v", want, s.Addresses)
	}
	a.checkInvariant(t, n)

	// The runtimeConfig form, for an address this node's pool holds as
	// cooling: taken at once, the cooldown is for other pods.
	plain := a.add(t, "c6", n.pod("p6"))
	if aerr := a.Del(ctx, req("c6", "")); aerr != nil {
		t.Fatal(aerr)
	}
	r := req("c7", n.pod("p7"))
	r.Config = json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni","runtimeConfig":{"ips":["` + plain.String() + `/24"]}}`)
	res, aerr = a.Add(ctx, r)
	if aerr != nil || res.IPs[0].Address.IP.String() != plain.String() {
		t.Fatalf("ADD with runtimeConfig.ips=[%s/24] (cooling here) = %v, %v", plain, res, aerr)
	}
	a.checkInvariant(t, n)
}
