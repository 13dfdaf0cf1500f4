package store

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/vpcni/vpcni/internal/alloc"
)

// A dual-stack record keeps both addresses; releasing it cools each in its
// family's bucket, leaving marks each leaving, and a new record of either
// address clears both marks. A release that read IPv4 alone finds the
// record's IPv4 address where it always was and no IPv6 key in its
// buckets.
func TestDualStackRecords(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v4, v6 := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00:10::7")
	rec := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/a",
		Lease: alloc.Lease{Address: v4}, Others: []alloc.Lease{{Address: v6, PodNetwork: "blue"}}, Created: time.Now().UTC()}
	rec.PodNetwork = "blue"
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("c1", "eth0")
	if err != nil || got == nil {
		t.Fatalf("get: %v %v", got, err)
	}
	if !slices.Equal(got.Addresses(), []netip.Addr{v4, v6}) {
		t.Fatalf("addresses read back %v", got.Addresses())
	}
	// The previous release's view: the top-level address alone.
	var old struct {
		Address netip.Addr `json:"address"`
	}
	if err := s.db.View(func(tx *bolt.Tx) error {
		return json.Unmarshal(tx.Bucket(bucketAllocs).Get([]byte("c1/eth0")), &old)
	}); err != nil || old.Address != v4 {
		t.Fatalf("the record's first address as an IPv4-only release reads it: %v %v", old.Address, err)
	}

	until := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	if err := s.Release(rec, until); err != nil {
		t.Fatal(err)
	}
	by, err := s.CoolingByNetwork()
	if err != nil {
		t.Fatal(err)
	}
	if len(by["blue"]) != 2 || !by["blue"][v4].Equal(until) || !by["blue"][v6].Equal(until) {
		t.Fatalf("cooling after release: %v", by)
	}
	keys := func(bucket []byte) (out []string) {
		_ = s.db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bucket).ForEach(func(k, _ []byte) error { out = append(out, string(k)); return nil })
		})
		return out
	}
	if c4, c6 := keys(bucketCooling), keys(bucketCooling6); !slices.Equal(c4, []string{"10.0.0.7"}) || !slices.Equal(c6, []string{"fd00:10::7"}) {
		t.Fatalf("cooling buckets: ipv4 %v ipv6 %v", c4, c6)
	}
	if err := s.Uncool([]netip.Addr{v6}); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Cooling(); len(c) != 1 || c[v4].IsZero() {
		t.Fatalf("after uncooling the IPv6 address: %v", c)
	}

	// Leaving: each address marked, Put of a record holding them clears both.
	rec2 := *rec
	rec2.ContainerID = "c2"
	if err := s.Put(&rec2); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Cooling(); len(c) != 0 {
		t.Fatalf("a record of the addresses left them cooling: %v", c)
	}
	if err := s.Leave(&rec2); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Leaving(); !slices.Equal(l, []netip.Addr{v4, v6}) {
		t.Fatalf("leaving %v", l)
	}
	if l4, l6 := keys(bucketLeaving), keys(bucketLeaving6); len(l4) != 1 || len(l6) != 1 {
		t.Fatalf("leaving buckets: ipv4 %v ipv6 %v", l4, l6)
	}
	if err := s.Left([]netip.Addr{v6}); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimOn(netip.MustParseAddr("fd00:10::9"), "blue"); err != nil {
		t.Fatal(err)
	}
	lb, _ := s.LeavingByNetwork()
	if !slices.Equal(lb["blue"], []netip.Addr{v4, netip.MustParseAddr("fd00:10::9")}) {
		t.Fatalf("leaving by network %v", lb)
	}
}

// An IPv6-only record (its first address IPv6) reads back as written, and
// the file opens again.
func TestIPv6OnlyRecord(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("fd00::5")}, Created: time.Now().UTC()}
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(rec, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(dir); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if c, err := s.Cooling(); err != nil || len(c) != 1 {
		t.Fatalf("cooling %v %v", c, err)
	}
}
