// Package store keeps the agent's allocation records in a bbolt file: one
// record per container interface, written before ADD answers and removed
// only after DEL has taken the datapath down, plus the addresses cooling
// down after release.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketAllocs  = []byte("allocations")
	bucketCooling = []byte("cooling")
)

// Record is one address given to one container interface.
type Record struct {
	ContainerID  string     `json:"containerID"`
	IfName       string     `json:"ifName"`
	Network      string     `json:"network"`
	Netns        string     `json:"netns"`
	Address      netip.Addr `json:"address"`
	HostIf       string     `json:"hostIf"`
	HostMAC      string     `json:"hostMAC"`
	PodMAC       string     `json:"podMAC"`
	PodNamespace string     `json:"podNamespace,omitempty"`
	PodName      string     `json:"podName,omitempty"`
	// Ready is false while the datapath is being wired: a record found
	// unready after a crash is wired again or torn down, never trusted.
	Ready   bool      `json:"ready"`
	Created time.Time `json:"created"`
}

// Key identifies a record: the CNI attachment (container ID, interface).
func (r *Record) Key() string { return Key(r.ContainerID, r.IfName) }

// Key of an attachment. Container IDs never hold '/' (CNI spec).
func Key(containerID, ifName string) string { return containerID + "/" + ifName }

// Store is the bbolt-backed record store.
type Store struct{ db *bolt.DB }

// Open opens (creating) the store in dir. It fails fast when another agent
// holds the file.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(dir, "allocations.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("store %s is locked: is another vpcnid running on this node?", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketAllocs, bucketCooling} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Put writes a record durably (one fsync, ~0.4 ms here; bbolt's Batch would
// add up to 10 ms of waiting to every sequential ADD).
func (s *Store) Put(r *Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketAllocs).Put([]byte(r.Key()), data); err != nil {
			return err
		}
		// An address handed out again is no longer cooling.
		return tx.Bucket(bucketCooling).Delete([]byte(r.Address.String()))
	})
}

// Get returns the record for an attachment, if any.
func (s *Store) Get(containerID, ifName string) (*Record, error) {
	var rec *Record
	err := s.db.View(func(tx *bolt.Tx) error {
		data := tx.Bucket(bucketAllocs).Get([]byte(Key(containerID, ifName)))
		if data == nil {
			return nil
		}
		rec = &Record{}
		return json.Unmarshal(data, rec)
	})
	return rec, err
}

// List returns every record.
func (s *Store) List() ([]*Record, error) {
	var out []*Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).ForEach(func(k, v []byte) error {
			r := &Record{}
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// Release removes a record and, in the same transaction, marks its address
// cooling until the given time (none when until is zero).
func (s *Store) Release(r *Record, until time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketAllocs).Delete([]byte(r.Key())); err != nil {
			return err
		}
		if until.IsZero() {
			return nil
		}
		v, _ := until.MarshalText()
		return tx.Bucket(bucketCooling).Put([]byte(r.Address.String()), v)
	})
}

// Delete removes a record without cooling its address (an ADD that failed
// before the pod ever used it).
func (s *Store) Delete(containerID, ifName string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).Delete([]byte(Key(containerID, ifName)))
	})
}

// Cooling lists the addresses cooling down and until when.
func (s *Store) Cooling() (map[netip.Addr]time.Time, error) {
	out := map[netip.Addr]time.Time{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCooling).ForEach(func(k, v []byte) error {
			a, err := netip.ParseAddr(string(k))
			if err != nil {
				return fmt.Errorf("cooling entry %q: %w", k, err)
			}
			var t time.Time
			if err := t.UnmarshalText(v); err != nil {
				return fmt.Errorf("cooling entry %s: %w", a, err)
			}
			out[a] = t
			return nil
		})
	})
	return out, err
}

// Uncool forgets cooling entries (their cooldown is over, or the provider
// took the address back).
func (s *Store) Uncool(addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCooling)
		for _, a := range addrs {
			if err := b.Delete([]byte(a.String())); err != nil {
				return err
			}
		}
		return nil
	})
}
