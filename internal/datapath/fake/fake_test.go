package fake

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
)

// A dual-stack pod is wired with both its addresses — one IPConfig and
// one node-side piece each — checked, repaired and torn down as a whole;
// an IPv6-only pod with its one /128.
func TestEveryLease(t *testing.T) {
	ns := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")
	dual := &alloc.Allocation{ContainerID: "dual", IfName: "eth0", Netns: ns,
		Lease: alloc.Lease{Address: v4}, Others: []alloc.Lease{{Address: v6}}}
	only6 := &alloc.Allocation{ContainerID: "six", IfName: "eth0", Netns: ns, Lease: alloc.Lease{Address: netip.MustParseAddr("fd00::6")}}
	d := New()
	ctx := t.Context()
	w, err := d.Setup(ctx, dual)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.IPs) != 2 || w.IPs[0].Address.String() != "10.0.0.5/32" || w.IPs[1].Address.String() != "fd00::5/128" {
		t.Fatalf("dual wiring %+v, want 10.0.0.5/32 then fd00::5/128", w.IPs)
	}
	w, err = d.Setup(ctx, only6)
	if err != nil || len(w.IPs) != 1 || w.IPs[0].Address.String() != "fd00::6/128" {
		t.Fatalf("IPv6-only wiring %+v, %v", w.IPs, err)
	}
	if !d.Wired("dual/eth0", v4, v6) || !d.Wired("six/eth0", netip.MustParseAddr("fd00::6")) || d.Wired("six/eth0", v4) {
		t.Fatal("Wired does not see both addresses of the dual pod, or sees one the IPv6-only pod lacks")
	}
	// Another pod may not take the dual pod's second address.
	thief := &alloc.Allocation{ContainerID: "thief", IfName: "eth0", Netns: ns, Lease: alloc.Lease{Address: v6}}
	if _, err := d.Setup(ctx, thief); err == nil || !strings.Contains(err.Error(), "wired for dual/eth0") {
		t.Fatalf("second pod on fd00::5: %v", err)
	}
	d.DropPiece(v6)
	if _, err := d.Check(ctx, dual); err == nil || !strings.Contains(err.Error(), "fd00::5 has no proxy entry") {
		t.Fatalf("Check with the v6 piece gone: %v", err)
	}
	rep, err := d.Reconcile(ctx, datapath.Desired{Allocations: []*alloc.Allocation{dual, only6}})
	if err != nil || len(rep.Repaired) != 1 || !strings.Contains(rep.Repaired[0].What, "fd00::5") {
		t.Fatalf("reconcile: %+v %v, want the v6 piece repaired", rep, err)
	}
	if _, err := d.Check(ctx, dual); err != nil {
		t.Fatalf("Check after repair: %v", err)
	}
	if err := d.Teardown(ctx, dual); err != nil {
		t.Fatal(err)
	}
	if d.HasStale(v4) || d.HasStale(v6) || d.Wired("dual/eth0", v4) {
		t.Fatal("teardown left a piece of the dual pod")
	}
}
