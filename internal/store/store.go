// Package store keeps the agent's allocation records (alloc.Allocation,
// as JSON) in a bbolt file: one record per container interface, written
// before ADD answers and removed only after DEL has taken the datapath
// down, plus the addresses cooling down after release and those leaving the
// node (requested addresses going back to the provider). Records written by
// earlier versions (without lease or wiring) read as allocations without
// them; the agent checks and completes them at start. A dual-stack
// record holds its first address where every release reads it and the
// others beside it; IPv6 addresses cool down and leave in buckets of
// their own, which a release before IPv6 never opens (it refuses an IPv6
// key in its buckets as damage).
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
)

var (
	bucketAllocs  = []byte("allocations")
	bucketCooling = []byte("cooling")
	// bucketLeaving holds requested addresses on their way back to the
	// provider (key: the address; value: the record's key it left), so
	// that a restart does not take them for the node's free addresses. An
	// older vpcnid ignores the bucket (and, rolled back to, adopts them
	// as free again, as it always did).
	bucketLeaving = []byte("leaving")
	// The IPv6 addresses cooling and leaving, as the two above hold
	// IPv4's: a rollback to a release that reads IPv4 alone still opens
	// a dual-stack node's file and finds its IPv4 part whole.
	bucketCooling6 = []byte("cooling6")
	bucketLeaving6 = []byte("leaving6")
	// bucketMeta holds the file's schema version (keySchema, decimal).
	// Files from before versions have none: schema 0.
	bucketMeta = []byte("meta")
	keySchema  = []byte("schema")
)

// Schema is the layout this vpcnid writes. A file of schema 0 (from before
// versions) to Schema-1 is migrated forward when opened (migrations); a
// newer one is refused, so an agent rolled back past a layout change never
// misreads it — the rollback of a release that changed no layout (schema
// equal) just works, and the previous release, which reads no meta
// bucket, ignores it. A schema no vpcnid writes (not a number, negative)
// marks a damaged file: refused as such (ErrDamaged).
const Schema = 1

// migrations[v] takes a file from schema v to v+1, inside the opening
// transaction. 0 -> 1: the layout is unchanged (records as JSON, the
// cooling bucket); the file only learns its version.
var migrations = []func(*bolt.Tx) error{
	func(*bolt.Tx) error { return nil },
}

// coolingOf and leavingOf are the buckets that hold an address of a's
// family.
func coolingOf(a netip.Addr) []byte {
	if family.Of(a) == family.V6 {
		return bucketCooling6
	}
	return bucketCooling
}

func leavingOf(a netip.Addr) []byte {
	if family.Of(a) == family.V6 {
		return bucketLeaving6
	}
	return bucketLeaving
}

// Key of an attachment, as records are filed.
func Key(containerID, ifName string) string { return alloc.Key(containerID, ifName) }

// record is an allocation as the file holds it. It also writes "hostIf",
// the field the previous release (routed veth only) read to tell its pods'
// links from orphans: rolled back to it, an agent would otherwise take
// every pod's link for an orphan and delete it.
type record struct {
	*alloc.Allocation
	HostIf string `json:"hostIf,omitempty"`
}

func encode(a *alloc.Allocation) ([]byte, error) {
	return json.Marshal(record{Allocation: a, HostIf: a.HostIf()})
}

// Store is the bbolt-backed record store.
type Store struct {
	db      *bolt.DB
	writes  chan write
	stopped chan struct{}

	closeMu sync.RWMutex
	closed  bool
}

// write is one change waiting for a commit.
type write struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// lockWait bounds the wait for another agent's lock on the file.
const lockWait = 2 * time.Second

// Open opens (creating) the store in dir. It fails fast when another agent
// holds the file, and refuses a file it cannot trust — damaged, hostile,
// or holding what this vpcnid cannot read — with ErrDamaged and what to
// do, rather than crash on it (check.go).
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(dir, "allocations.db")
	switch bad, err := checkFile(path); {
	case errors.Is(err, errLocked):
		return nil, fmt.Errorf("store %s is locked: is another vpcnid running on this node?", path)
	case err != nil:
		return nil, fmt.Errorf("open store %s: %w", path, err)
	case bad != nil:
		return nil, damaged(path, bad)
	}
	db, closeFile, err := openBolt(path)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("store %s is locked: is another vpcnid running on this node?", path)
	case err != nil && refusedByBolt(err):
		return nil, damaged(path, err)
	case err != nil:
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := guard(func() error { return readAll(db) }); err != nil {
		db.Close() // a read transaction's panic leaves nothing held
		return nil, damaged(path, err)
	}
	err = guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketAllocs, bucketCooling, bucketLeaving, bucketCooling6, bucketLeaving6, bucketMeta} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return migrate(tx)
		})
	})
	var p *panicked
	switch {
	case errors.As(err, &p):
		// A write that panicked may hold bbolt's write lock: Close would
		// wait on it.
		closeFile()
		return nil, damaged(path, err)
	case errors.Is(err, berrors.ErrIncompatibleValue):
		db.Close()
		return nil, damaged(path, fmt.Errorf("a bucket of vpcni's is a plain key: %w", err))
	case err != nil:
		db.Close()
		return nil, fmt.Errorf("init store %s: %w", path, err)
	}
	s := &Store{db: db, writes: make(chan write, 256), stopped: make(chan struct{})}
	go s.committer()
	return s, nil
}

// schemaOf reads the file's schema from its meta bucket: 0 when it has
// none (a file from before versions).
func schemaOf(meta *bolt.Bucket) (int, error) {
	v := meta.Get(keySchema)
	if v == nil {
		return 0, nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("its schema %q is not one any vpcnid writes", v)
	}
	return n, nil
}

// migrate brings the file to Schema, in the caller's transaction (all or
// nothing).
func migrate(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	from, err := schemaOf(meta)
	if err != nil {
		return err
	}
	if from > Schema {
		return fmt.Errorf("%w: the file is schema %d, this vpcnid reads up to %d: it was written by a newer vpcnid; run that release (or newer) again, or move the file aside to start from the cloud's state", ErrNewerSchema, from, Schema)
	}
	for v := from; v < Schema; v++ {
		if err := migrations[v](tx); err != nil {
			return fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
		}
	}
	if from != Schema {
		return meta.Put(keySchema, []byte(strconv.Itoa(Schema)))
	}
	return nil
}

// ErrNewerSchema: the file was written by a newer vpcnid.
var ErrNewerSchema = errors.New("allocation store is newer than this vpcnid")

// Close finishes pending writes and closes the file.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.writes)
	s.closeMu.Unlock()
	<-s.stopped
	return s.db.Close()
}

// ErrClosed: the store was closed (the agent is shutting down).
var ErrClosed = errors.New("allocation store is closed")

// update applies fn durably. Writes are group-committed: a write that finds
// the store idle commits at once (one fsync, ~0.4 ms here); writes that
// arrive during a commit share the next one, so a burst of pods does not
// queue behind one fsync each.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	w := write{fn: fn, done: make(chan error, 1)}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	s.writes <- w
	s.closeMu.RUnlock()
	return <-w.done
}

func (s *Store) committer() {
	defer close(s.stopped)
	for w := range s.writes {
		group := []write{w}
	more:
		for len(group) < cap(s.writes) {
			select {
			case next, ok := <-s.writes:
				if !ok {
					break more
				}
				group = append(group, next)
			default:
				break more
			}
		}
		s.commit(group)
	}
}

// commit runs a group in one transaction. If one change fails, the others
// are retried alone so that a bad write cannot sink its neighbours.
func (s *Store) commit(group []write) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, w := range group {
			if err := w.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(group) == 1 {
		for _, w := range group {
			w.done <- err
		}
		return
	}
	for _, w := range group {
		w.done <- s.db.Update(w.fn)
	}
}

// Put writes a record durably.
func (s *Store) Put(r *alloc.Allocation) error {
	data, err := encode(r)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketAllocs).Put([]byte(r.Key()), data); err != nil {
			return err
		}
		// An address handed out again is no longer cooling, nor leaving.
		for _, a := range r.Addresses() {
			if err := tx.Bucket(coolingOf(a)).Delete([]byte(a.String())); err != nil {
				return err
			}
			if err := tx.Bucket(leavingOf(a)).Delete([]byte(a.String())); err != nil {
				return err
			}
		}
		return nil
	})
}

// MarkReady writes a record again — ready, with its wiring — only if the
// store still holds this very record (same attachment, creation time,
// address and namespace): a DEL, a newer ADD, or a repeated ADD that moved
// the attachment to a new namespace, if it came first, wins.
func (s *Store) MarkReady(r *alloc.Allocation) error {
	data, err := encode(r)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAllocs)
		cur := b.Get([]byte(r.Key()))
		if cur == nil {
			return nil
		}
		var was alloc.Allocation
		if err := json.Unmarshal(cur, &was); err != nil || !was.Created.Equal(r.Created) || was.Address != r.Address || was.Netns != r.Netns {
			return nil
		}
		return b.Put([]byte(r.Key()), data)
	})
}

// decode reads a record as the store files it: an allocation of one
// address of each of its families, as JSON, under its own attachment's
// key. The agent keys its work and its pool by both.
func decode(k, v []byte) (*alloc.Allocation, error) {
	r := &alloc.Allocation{}
	if err := json.Unmarshal(v, r); err != nil {
		return nil, fmt.Errorf("record %q: %w", k, err)
	}
	seen := map[family.Family]bool{}
	for _, a := range r.Addresses() {
		f := family.Of(a)
		if f == 0 || a.Is4In6() || a.Zone() != "" {
			return nil, fmt.Errorf("record %q: address %q is not an IPv4 or IPv6 address", k, a)
		}
		if seen[f] {
			return nil, fmt.Errorf("record %q: two %s addresses (%s)", k, f, r.Addresses())
		}
		seen[f] = true
	}
	if r.Key() != string(k) {
		return nil, fmt.Errorf("record %q is filed under another attachment's key (it names %q)", k, r.Key())
	}
	return r, nil
}

// Get returns the record for an attachment, if any.
func (s *Store) Get(containerID, ifName string) (*alloc.Allocation, error) {
	var rec *alloc.Allocation
	err := s.db.View(func(tx *bolt.Tx) error {
		k := []byte(Key(containerID, ifName))
		data := tx.Bucket(bucketAllocs).Get(k)
		if data == nil {
			return nil
		}
		var err error
		rec, err = decode(k, data)
		return err
	})
	return rec, err
}

// List returns every record.
func (s *Store) List() ([]*alloc.Allocation, error) {
	var out []*alloc.Allocation
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).ForEach(func(k, v []byte) error {
			r, err := decode(k, v)
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// Release removes a record and, in the same transaction, marks its
// addresses cooling until the given time (none when until is zero), with
// the record's PodNetwork: a restart puts them back in that network's
// pools.
func (s *Store) Release(r *alloc.Allocation, until time.Time) error {
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketAllocs).Delete([]byte(r.Key())); err != nil {
			return err
		}
		if until.IsZero() {
			return nil
		}
		v, _ := until.MarshalText()
		if r.PodNetwork != "" {
			v = fmt.Appendf(v, " %s", r.PodNetwork)
		}
		for _, a := range r.Addresses() {
			if err := tx.Bucket(coolingOf(a)).Put([]byte(a.String()), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// ofNetwork is the value suffix that names an entry's PodNetwork.
const ofNetwork = " network="

// Leave removes a record whose addresses leave the node (requested
// addresses, the pod's own, going back to the provider) and, in the same
// transaction, marks them leaving until Left: a crash in between can
// neither lose the record's release nor let an address be taken for a
// free one of the node's.
func (s *Store) Leave(r *alloc.Allocation) error {
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketAllocs).Delete([]byte(r.Key())); err != nil {
			return err
		}
		for _, a := range r.Addresses() {
			if err := tx.Bucket(leavingOf(a)).Put([]byte(a.String()), leavingValue(r.Key(), r.PodNetwork)); err != nil {
				return err
			}
		}
		return nil
	})
}

// leavingValue is a leaving entry's value: who it left (a record's key, or
// "claimed") and, for a PodNetwork's address, the network.
func leavingValue(who, network string) []byte {
	if network != "" {
		who += ofNetwork + network
	}
	return []byte(who)
}

// Claim marks a requested address leaving before the provider is asked
// for it: if the agent dies before the pod's record is written (Put clears
// the mark), the next start gives the address back instead of taking it
// for a free one.
func (s *Store) Claim(a netip.Addr) error { return s.ClaimOn(a, "") }

// ClaimOn is Claim for an address of a PodNetwork's pool.
func (s *Store) ClaimOn(a netip.Addr, network string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(leavingOf(a)).Put([]byte(a.String()), leavingValue("claimed", network))
	})
}

// Leaving lists the addresses on their way back to the provider.
func (s *Store) Leaving() ([]netip.Addr, error) {
	by, err := s.LeavingByNetwork()
	var out []netip.Addr
	for _, addrs := range by {
		out = append(out, addrs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, err
}

// LeavingByNetwork lists the addresses on their way back to the provider
// by the PodNetwork whose pool they are of ("": the node's default).
func (s *Store) LeavingByNetwork() (map[string][]netip.Addr, error) {
	out := map[string][]netip.Addr{}
	err := s.db.View(func(tx *bolt.Tx) error {
		for _, f := range family.All {
			err := tx.Bucket(leavingOf(hostOf(f))).ForEach(func(k, v []byte) error {
				a, err := decodeLeaving(k, f)
				if err != nil {
					return err
				}
				_, network, _ := strings.Cut(string(v), ofNetwork)
				out[network] = append(out[network], a)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// hostOf is any address of family f, to pick f's buckets by.
func hostOf(f family.Family) netip.Addr {
	if f == family.V6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// decodeLeaving reads a leaving entry's key: an address of the bucket's
// family f.
func decodeLeaving(k []byte, f family.Family) (netip.Addr, error) {
	a, err := netip.ParseAddr(string(k))
	if err != nil || family.Of(a) != f || a.Is4In6() || a.Zone() != "" {
		return a, fmt.Errorf("leaving entry %q: not an %s address", k, f)
	}
	return a, nil
}

// Left forgets leaving addresses (the provider has them back, or the node
// holds them again).
func (s *Store) Left(addrs []netip.Addr) error { return s.forget(leavingOf, addrs) }

// forget deletes the entries of addrs from the address-keyed buckets
// bucket picks by each address's family.
func (s *Store) forget(bucket func(netip.Addr) []byte, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	return s.update(func(tx *bolt.Tx) error {
		for _, a := range addrs {
			if err := tx.Bucket(bucket(a)).Delete([]byte(a.String())); err != nil {
				return err
			}
		}
		return nil
	})
}

// Delete removes a record without cooling its address (an ADD that failed
// before the pod ever used it).
func (s *Store) Delete(containerID, ifName string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).Delete([]byte(Key(containerID, ifName)))
	})
}

// decodeCooling reads a cooling entry: an address of the bucket's family
// f, until when, and the PodNetwork whose pool it is of ("": the node's
// default).
func decodeCooling(k, v []byte, f family.Family) (a netip.Addr, until time.Time, network string, err error) {
	a, err = netip.ParseAddr(string(k))
	if err != nil || family.Of(a) != f || a.Is4In6() || a.Zone() != "" {
		return a, until, "", fmt.Errorf("cooling entry %q: not an %s address", k, f)
	}
	t, network, _ := strings.Cut(string(v), " ")
	if err := until.UnmarshalText([]byte(t)); err != nil {
		return a, until, "", fmt.Errorf("cooling entry %s: %w", a, err)
	}
	return a, until, network, nil
}

// Cooling lists the addresses cooling down and until when.
func (s *Store) Cooling() (map[netip.Addr]time.Time, error) {
	by, err := s.CoolingByNetwork()
	out := map[netip.Addr]time.Time{}
	for _, m := range by {
		maps.Copy(out, m)
	}
	return out, err
}

// CoolingByNetwork lists the addresses cooling down and until when, by the
// PodNetwork whose pool they are of ("": the node's default).
func (s *Store) CoolingByNetwork() (map[string]map[netip.Addr]time.Time, error) {
	out := map[string]map[netip.Addr]time.Time{}
	err := s.db.View(func(tx *bolt.Tx) error {
		for _, f := range family.All {
			err := tx.Bucket(coolingOf(hostOf(f))).ForEach(func(k, v []byte) error {
				a, until, network, err := decodeCooling(k, v, f)
				if err != nil {
					return err
				}
				if out[network] == nil {
					out[network] = map[netip.Addr]time.Time{}
				}
				out[network][a] = until
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// Uncool forgets cooling entries (their cooldown is over, or the provider
// took the address back).
func (s *Store) Uncool(addrs []netip.Addr) error { return s.forget(coolingOf, addrs) }
