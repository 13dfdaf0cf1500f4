package store

import (
	"fmt"
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

// A PodNetwork's cooling and leaving addresses keep its name, so a restart
// puts each back in its own network's pool; the default network's entries
// read as before.
func TestCoolingAndLeavingByNetwork(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	until := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	rec := func(id, ip, network string) *alloc.Allocation {
		return &alloc.Allocation{ContainerID: id, IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr(ip), PodNetwork: network}}
	}
	for _, r := range []*alloc.Allocation{rec("a", "10.0.0.1", ""), rec("b", "10.30.0.1", "web"), rec("c", "10.30.0.2", "web"), rec("d", "10.0.0.2", "")} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(rec("a", "10.0.0.1", ""), until); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(rec("b", "10.30.0.1", "web"), until); err != nil {
		t.Fatal(err)
	}
	if err := s.Leave(rec("c", "10.30.0.2", "web")); err != nil {
		t.Fatal(err)
	}
	if err := s.Leave(rec("d", "10.0.0.2", "")); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimOn(netip.MustParseAddr("10.30.0.9"), "web"); err != nil {
		t.Fatal(err)
	}
	cooling, err := s.CoolingByNetwork()
	if err != nil {
		t.Fatal(err)
	}
	if !cooling[""][netip.MustParseAddr("10.0.0.1")].Equal(until) || !cooling["web"][netip.MustParseAddr("10.30.0.1")].Equal(until) || len(cooling) != 2 {
		t.Errorf("cooling by network %v", cooling)
	}
	leaving, err := s.LeavingByNetwork()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(leaving) != "map[:[10.0.0.2] web:[10.30.0.2 10.30.0.9]]" {
		t.Errorf("leaving by network %v", leaving)
	}
	if all, err := s.Cooling(); err != nil || len(all) != 2 {
		t.Errorf("Cooling() = %v, %v; want both networks' entries", all, err)
	}
	if all, err := s.Leaving(); err != nil || len(all) != 3 {
		t.Errorf("Leaving() = %v, %v; want all three", all, err)
	}
}
