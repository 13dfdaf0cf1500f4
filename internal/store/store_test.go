package store

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestRecordsAndCooling(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.0.0.5")
	rec := &Record{ContainerID: "c1", IfName: "eth0", Network: "n", Address: a, Created: time.Now().UTC()}
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("c1", "eth0")
	if err != nil || got == nil || got.Address != a || got.Network != "n" {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	if none, _ := s.Get("c1", "eth1"); none != nil {
		t.Fatalf("Get of another interface found %+v", none)
	}
	until := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	if err := s.Release(rec, until); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.List(); len(all) != 0 {
		t.Fatalf("records after Release: %+v", all)
	}
	cooling, err := s.Cooling()
	if err != nil || !cooling[a].Equal(until) || len(cooling) != 1 {
		t.Fatalf("cooling %v, %v; want %s until %s", cooling, err, a, until)
	}
	// Handing the address out again ends its cooldown in the same write.
	if err := s.Put(&Record{ContainerID: "c2", IfName: "eth0", Address: a}); err != nil {
		t.Fatal(err)
	}
	if cooling, _ := s.Cooling(); len(cooling) != 0 {
		t.Fatalf("address still cooling after reuse: %v", cooling)
	}
	// Everything survives a reopen; a second opener is refused clearly.
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "another vpcnid") {
		t.Fatalf("second Open while the first holds the file: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if all, _ := s.List(); len(all) != 1 || all[0].ContainerID != "c2" {
		t.Fatalf("after reopen: %+v", all)
	}
	if err := s.Delete("c2", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(&Record{ContainerID: "c3", IfName: "eth0", Address: netip.MustParseAddr("10.0.0.6")}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if cooling, _ := s.Cooling(); len(cooling) != 0 {
		t.Fatalf("Release without cooldown left %v cooling", cooling)
	}
	if err := s.Uncool(nil); err != nil {
		t.Fatal(err)
	}
}
