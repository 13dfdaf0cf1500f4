package store

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
)

// A requested address leaves with its record's release, in one write,
// survives a reopen, and is forgotten by Left or by a record that takes it
// again.
func TestLeaving(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")
	for i, ip := range []netip.Addr{a, b} {
		r := &alloc.Allocation{ContainerID: "c" + string(rune('1'+i)), IfName: "eth0", Lease: alloc.Lease{Address: ip}, Requested: true, Created: time.Now()}
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
		if err := s.Leave(r); err != nil {
			t.Fatal(err)
		}
	}
	if recs, err := s.List(); err != nil || len(recs) != 0 {
		t.Fatalf("records after Leave: %v, %v", recs, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Leaving(); err != nil || !slices.Equal(got, []netip.Addr{a, b}) {
		t.Fatalf("Leaving after a reopen = %v, %v; want [%s %s]", got, err, a, b)
	}
	if err := s.Left([]netip.Addr{a}); err != nil {
		t.Fatal(err)
	}
	// The pod came back to this node: its new record takes b again.
	if err := s.Put(&alloc.Allocation{ContainerID: "c3", IfName: "eth0", Lease: alloc.Lease{Address: b}, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Leaving(); err != nil || len(got) != 0 {
		t.Fatalf("Leaving after Left and a new record = %v, %v; want none", got, err)
	}
}
