package store

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/vpcni/vpcni/internal/alloc"
)

// goodFile is a store file as vpcnid leaves it: schema 1, one record,
// one cooling entry.
func goodFile(t testing.TB) []byte {
	t.Helper()
	dir := t.(interface{ TempDir() string }).TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	keep := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", Network: "vpcni", Netns: "/run/netns/p1",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")}, Created: created}
	gone := &alloc.Allocation{ContainerID: "c2", IfName: "eth0", Network: "vpcni", Netns: "/run/netns/p2",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.6")}, Created: created}
	for _, r := range []*alloc.Allocation{keep, gone} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(gone, created.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, err := os.ReadFile(filepath.Join(dir, "allocations.db"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// edited is goodFile with fn applied to it through bbolt.
func edited(t testing.TB, fn func(tx *bolt.Tx) error) []byte {
	t.Helper()
	path := filepath.Join(t.(interface{ TempDir() string }).TempDir(), "allocations.db")
	if err := os.WriteFile(path, goodFile(t), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	db.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func put(bucket []byte, k, v string) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(k), []byte(v)) }
}

// openBytes writes data as a state dir's store file and opens it.
func openBytes(t testing.TB, data []byte) (*Store, error) {
	t.Helper()
	dir := t.(interface{ TempDir() string }).TempDir()
	if err := os.WriteFile(filepath.Join(dir, "allocations.db"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return Open(dir)
}

// A damaged or hostile file is refused with ErrDamaged, saying what is
// wrong and what to do, and never crashes the agent (a negative schema
// used to panic inside Open: migrations[-1]).
func TestOpenRefusesDamagedFiles(t *testing.T) {
	good := goodFile(t)
	pageSize := os.Getpagesize()
	cases := []struct {
		name string
		data []byte
		says string
	}{
		{"schema -1", edited(t, put(bucketMeta, string(keySchema), "-1")), `schema "-1" is not one any vpcnid writes`},
		{"schema not a number", edited(t, put(bucketMeta, string(keySchema), "one")), `schema "one"`},
		{"record not JSON", edited(t, put(bucketAllocs, "c3/eth0", "{")), `record "c3/eth0"`},
		{"record without an address", edited(t, put(bucketAllocs, "c3/eth0", `{"containerID":"c3","ifName":"eth0"}`)), "not an IPv4 or IPv6 address"},
		{"record of a v4-mapped address", edited(t, put(bucketAllocs, "c3/eth0", `{"containerID":"c3","ifName":"eth0","address":"::ffff:10.0.0.3"}`)), "not an IPv4 or IPv6 address"},
		{"record of two IPv6 addresses", edited(t, put(bucketAllocs, "c3/eth0", `{"containerID":"c3","ifName":"eth0","address":"fd00::3","others":[{"address":"fd00::4"}]}`)), "two ipv6 addresses"},
		{"record with another address missing", edited(t, put(bucketAllocs, "c3/eth0", `{"containerID":"c3","ifName":"eth0","address":"10.0.0.3","others":[{}]}`)), "not an IPv4 or IPv6 address"},
		{"record under another key", edited(t, put(bucketAllocs, "c3/eth0", `{"containerID":"c4","ifName":"eth0","address":"10.0.0.9"}`)), `names "c4/eth0"`},
		{"cooling entry not an address", edited(t, put(bucketCooling, "10.0.0", "2026-11-20T10:00:00Z")), `cooling entry "10.0.0"`},
		{"cooling entry not a time", edited(t, put(bucketCooling, "10.0.0.8", "soon")), "cooling entry 10.0.0.8"},
		// Each family's entries in its own bucket: an IPv6 key where a
		// release before IPv6 reads IPv4 would be damage to it.
		{"IPv6 cooling entry among IPv4's", edited(t, put(bucketCooling, "fd00::8", "2026-11-20T10:00:00Z")), `cooling entry "fd00::8": not an ipv4 address`},
		{"IPv4 cooling entry among IPv6's", edited(t, put(bucketCooling6, "10.0.0.8", "2026-11-20T10:00:00Z")), `cooling entry "10.0.0.8": not an ipv6 address`},
		{"IPv4 leaving entry among IPv6's", edited(t, put(bucketLeaving6, "10.0.0.8", "claimed")), `leaving entry "10.0.0.8": not an ipv6 address`},
		{"a bucket among the records", edited(t, func(tx *bolt.Tx) error {
			_, err := tx.Bucket(bucketAllocs).CreateBucket([]byte("c3/eth0"))
			return err
		}), `record "c3/eth0"`},
		{"truncated to its meta pages", good[:2*pageSize], "truncated"},
		{"a free list page that is not one", zeroPage(good, freelistOf(t, good)), "free list: page"},
		{"not a bbolt file", bytes.Repeat([]byte("vpcni"), 4096), "invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := openBytes(t, tc.data)
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "move it aside") {
				t.Fatalf("got %v; want ErrDamaged saying %q and what to do", err, tc.says)
			}
		})
	}
	// A schema a newer vpcnid writes is not damage: refused as newer.
	if _, err := openBytes(t, edited(t, put(bucketMeta, string(keySchema), "99"))); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("schema 99: %v, want ErrNewerSchema", err)
	}
}

// freelistOf is the page the current meta page gives the free list.
func freelistOf(t testing.TB, data []byte) int {
	t.Helper()
	m, ok, err := currentMeta(data)
	if !ok || err != nil {
		t.Fatalf("no meta page: %v", err)
	}
	return int(m.freelist)
}

func zeroPage(data []byte, n int) []byte {
	out := bytes.Clone(data)
	ps := os.Getpagesize()
	clear(out[n*ps : (n+1)*ps])
	return out
}

// FuzzOpen: whatever the store file holds, Open refuses it (ErrDamaged
// with what to do, or ErrNewerSchema) or returns a store that works: List
// and Cooling read it, a write lands and reads back. Never a panic.
func FuzzOpen(f *testing.F) {
	good := goodFile(f)
	f.Add(good)
	f.Add(edited(f, put(bucketMeta, string(keySchema), "-1")))
	f.Add(edited(f, put(bucketMeta, string(keySchema), "99")))
	f.Add(good[:len(good)/2])
	f.Add(good[:3*os.Getpagesize()+100])
	f.Add(zeroPage(good, freelistOf(f, good)))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := openBytes(t, data)
		if err != nil {
			if !errors.Is(err, ErrDamaged) && !errors.Is(err, ErrNewerSchema) {
				t.Fatalf("refused without saying why: %v", err)
			}
			if errors.Is(err, ErrDamaged) && !strings.Contains(err.Error(), "move it aside") {
				t.Fatalf("refused without saying what to do: %v", err)
			}
			return
		}
		defer s.Close()
		recs, err := s.List()
		if err != nil {
			t.Fatalf("List of an opened store: %v", err)
		}
		if _, err := s.Cooling(); err != nil {
			t.Fatalf("Cooling of an opened store: %v", err)
		}
		for _, r := range recs {
			if got, err := s.Get(r.ContainerID, r.IfName); err != nil || got == nil {
				t.Fatalf("Get of listed %s: %v %v", r.Key(), got, err)
			}
		}
		r := &alloc.Allocation{ContainerID: "fuzz", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.77")}, Created: time.Now().UTC()}
		if err := s.Put(r); err != nil {
			t.Fatalf("Put into an opened store: %v", err)
		}
		if got, err := s.Get("fuzz", "eth0"); err != nil || got == nil || got.Address != r.Address {
			t.Fatalf("Get after Put: %+v %v", got, err)
		}
	})
}

// A store as large as a busy node's (branch pages, values spanning
// pages, nested cooling entries freed and reused) passes the check, and
// the check costs little at start.
func TestOpenAcceptsALargeStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 6000) // a record longer than a page
	// From many goroutines: the writes share commits, as a burst of pods'.
	var wg sync.WaitGroup
	errs := make(chan error, 3000)
	for w := range 50 {
		wg.Go(func() {
			for i := w * 40; i < (w+1)*40; i++ {
				r := &alloc.Allocation{ContainerID: fmt.Sprintf("c%04d", i), IfName: "eth0", Netns: "/run/netns/" + pad[:i%3*3000],
					Lease: alloc.Lease{Address: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, Created: time.Now().UTC()}
				errs <- s.Put(r)
				if i%2 == 0 {
					errs <- s.Release(r, time.Now().Add(time.Hour))
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	start := time.Now()
	if bad, err := checkFile(filepath.Join(dir, "allocations.db")); bad != nil || err != nil {
		t.Fatalf("a store vpcnid wrote fails the check: %v %v", bad, err)
	}
	took := time.Since(start)
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.List()
	if err != nil || len(got) != 1000 {
		t.Fatalf("List: %d records, %v", len(got), err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "allocations.db"))
	t.Logf("checked %d bytes in %v", fi.Size(), took)
}

// A store another agent holds is reported as locked, not as damaged: the
// check reads the file only under its lock.
func TestOpenLockedStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(dir)
	if err == nil || errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "is another vpcnid running") {
		t.Fatalf("opening a held store: %v, want it said to be locked", err)
	}
}
