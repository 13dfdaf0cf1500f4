package store

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/vpcni/vpcni/internal/alloc"
)

func TestRecordsAndCooling(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.0.0.5")
	rec := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Network: "n", Lease: alloc.Lease{Address: a}, Created: time.Now().UTC()}
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
	if err := s.Put(&alloc.Allocation{ContainerID: "c2", IfName: "eth0", Lease: alloc.Lease{Address: a}}); err != nil {
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
	if err := s.Release(&alloc.Allocation{ContainerID: "c3", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.6")}}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if cooling, _ := s.Cooling(); len(cooling) != 0 {
		t.Fatalf("Release without cooldown left %v cooling", cooling)
	}
	if err := s.Uncool(nil); err != nil {
		t.Fatal(err)
	}
}

// MarkReady rewrites only the very record it was given: after a DEL, or a
// newer ADD of the same attachment, it changes nothing.
func TestMarkReadyOnlyTheSameRecord(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Now().UTC()
	rec := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")}, Created: t0}
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	ready := *rec
	ready.Ready, ready.Wiring = true, &alloc.Wiring{Interfaces: []alloc.Interface{{Name: "eth0", MAC: "02:00:00:00:00:01", Sandbox: "/run/netns/p"}}}
	if err := s.MarkReady(&ready); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get("c1", "eth0")
	if got == nil || !got.Ready || got.PodMAC() != "02:00:00:00:00:01" {
		t.Fatalf("after MarkReady: %+v", got)
	}
	// A newer record of the same attachment wins over a late mark.
	newer := *rec
	newer.Created = t0.Add(time.Second)
	if err := s.Put(&newer); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkReady(&ready); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("c1", "eth0"); got.Ready || !got.Created.Equal(newer.Created) {
		t.Fatalf("a late mark overwrote the newer record: %+v", got)
	}
	// After the release, a late mark does not bring the record back.
	if err := s.Release(&newer, time.Time{}); err != nil {
		t.Fatal(err)
	}
	newerReady := newer
	newerReady.Ready = true
	if err := s.MarkReady(&newerReady); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("c1", "eth0"); got != nil {
		t.Fatalf("a mark after the release resurrected the record: %+v", got)
	}
}

// A record written by the previous release (no lease fields, no wiring,
// hostIf/hostMAC/podMAC fields) reads as an allocation without them.
func TestReadsRecordsOfThePreviousRelease(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := `{"containerID":"c9","ifName":"eth0","network":"vpcni","netns":"/run/netns/p9","address":"10.0.0.9","hostIf":"vpc0123456789a","hostMAC":"","podMAC":"","podNamespace":"default","podName":"web","ready":false,"created":"2026-11-01T10:00:00Z"}`
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).Put([]byte("c9/eth0"), []byte(old))
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("c9", "eth0")
	if err != nil || got == nil {
		t.Fatalf("Get: %v, %v", got, err)
	}
	if got.Address != netip.MustParseAddr("10.0.0.9") || got.Netns != "/run/netns/p9" || got.PodName != "web" || got.Wiring != nil || got.Ready || got.Prefix.IsValid() {
		t.Fatalf("old record read as %+v", got)
	}
	s.Close()
}

// A ready record carries "hostIf" as the previous release wrote it, so an
// agent rolled back to that release knows its pods' links; a late mark of
// a record that a repeated ADD moved to another namespace changes nothing.
func TestRecordsForTheRollbackAndTheMove(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/a", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.7")}, Created: time.Now().UTC()}
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	late := *rec
	late.Ready, late.Wiring = true, &alloc.Wiring{Interfaces: []alloc.Interface{{Name: "vpc0123456789a"}, {Name: "eth0", Sandbox: "/run/netns/a"}}}
	moved := *rec
	moved.Netns = "/run/netns/b"
	if err := s.Put(&moved); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkReady(&late); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("c1", "eth0"); got.Netns != "/run/netns/b" || got.Ready {
		t.Fatalf("a late mark undid the move: %+v", got)
	}
	moved.Ready, moved.Wiring = true, late.Wiring
	if err := s.MarkReady(&moved); err != nil {
		t.Fatal(err)
	}
	var raw string
	if err := s.db.View(func(tx *bolt.Tx) error {
		raw = string(tx.Bucket(bucketAllocs).Get([]byte("c1/eth0")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(raw, `"hostIf":"vpc0123456789a"`) || !strings.Contains(raw, `"address":"10.0.0.7"`) {
		t.Fatalf("record as stored: %s; want the previous release's hostIf and address fields", raw)
	}
}

// The schema: a file of the previous release (no meta bucket) opens as
// schema 0 and is migrated to Schema with its records kept; opened again it
// stays there; a file a newer vpcnid wrote is refused, saying so, and left
// as it is.
func TestSchemaMigratesForwardAndRefusesNewer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "allocations.db")
	// The previous release's file: its two buckets, one record, no meta.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := `{"containerID":"c1","ifName":"eth0","netns":"/run/netns/p1","address":"10.0.0.5","ready":true,"created":"2026-11-20T10:00:00Z"}`
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketAllocs)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketCooling); err != nil {
			return err
		}
		return b.Put([]byte("c1/eth0"), []byte(rec))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	schemaOf := func(s *Store) string {
		var v string
		_ = s.db.View(func(tx *bolt.Tx) error { v = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil })
		return v
	}
	for range 2 {
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := schemaOf(s); got != strconv.Itoa(Schema) {
			t.Fatalf("schema %q after open, want %d", got, Schema)
		}
		if r, err := s.Get("c1", "eth0"); err != nil || r == nil || r.Address != netip.MustParseAddr("10.0.0.5") || !r.Ready {
			t.Fatalf("the previous release's record after the migration: %+v %v", r, err)
		}
		s.Close()
	}

	// A newer vpcnid's file.
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte(strconv.Itoa(Schema+1))) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(dir); !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "written by a newer vpcnid") {
		t.Fatalf("opening a newer file: %v, want ErrNewerSchema saying so", err)
	}
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket(bucketMeta).Get(keySchema)); v != strconv.Itoa(Schema+1) {
			t.Errorf("the refused file's schema became %q", v)
		}
		if tx.Bucket(bucketAllocs).Get([]byte("c1/eth0")) == nil {
			t.Error("the refused file lost its record")
		}
		return nil
	})
}
