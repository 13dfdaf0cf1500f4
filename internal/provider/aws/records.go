package aws

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Ownership on ENIs vpcni did not create — the primary ENI, which the
// instance launched with and a person or another tool may also put
// addresses on. (On an ENI vpcni created, tagged as its own, every
// secondary address and prefix is vpcni's and no record is needed.)
//
// vpcni records which of the primary ENI's secondary addresses and
// prefixes it put there in a file under the agent's state directory, next
// to its allocation store, rather than in a tag on the ENI:
//   - a tag costs a CreateTags call with every assign and unassign (twice
//     the EC2 calls per pod) and holds 256 characters — 16 addresses — so
//     a large ENI would need many, rewritten under EC2's eventual
//     consistency with no compare-and-swap;
//   - the file lives exactly as long as the agent's allocation records:
//     losing it loses those too, and the node is rebuilt either way.
//
// A crash between the EC2 call and the record must not make vpcni's
// addresses look like someone else's (they would never be released) nor
// someone else's look like vpcni's. EC2 picks the addresses of a call by
// count, so they cannot be marked before the call as the Neutron provider
// marks its own; instead an intent is written first (durably): the ENI,
// what it held before, and how many the call asks for. After the call the
// new addresses are recorded and the intent dropped, in one write. An
// intent found at start (or after a call whose answer was lost) is
// settled against EC2: what the ENI holds now that it did not hold before
// is vpcni's if it is no more than the call asked for; more than that
// means someone else wrote at the same moment, and none of it is claimed
// (the addresses stay on the ENI; a person decides, told by a Notice).
type records struct {
	path string
	// Instance the file is about: a state directory carried over to
	// another instance (an image baked with it) claims nothing there.
	Instance string `json:"instance"`
	// Owned: ENI ID → address or prefix → when it was recorded.
	Owned map[string]map[string]time.Time `json:"owned,omitempty"`
	// Pending: calls in flight.
	Pending []intent `json:"pending,omitempty"`
	// Idle: addresses of vpcni's prefixes the agent gave back; each stays
	// on its ENI with its /28 until all 16 are idle.
	Idle []netip.Addr `json:"idle,omitempty"`
	// Prefixes6: per IPv6 /80 of vpcni's (its string), how far its
	// addresses were handed out (ipv6.go).
	Prefixes6 map[string]*prefix6Use `json:"prefixes6,omitempty"`
}

// intent is an assign call in flight on an ENI without vpcni's tag.
type intent struct {
	ENI string `json:"eni"`
	// Before: the ENI's secondary addresses and prefixes before the call.
	Before []string `json:"before"`
	// Count: how many new addresses or prefixes the call asks for, the
	// named ones included.
	Count int       `json:"count"`
	At    time.Time `json:"at"`
	// V6: the call assigns IPv6 addresses or /80s; it settles against
	// the ENI's IPv6 side only, an IPv4 one against its IPv4 side, so a
	// write of the other family at the same moment neither counts as its
	// gain nor makes it claim nothing.
	V6 bool `json:"v6,omitempty"`
}

const recordsFile = "aws-eni-owned.json"

// loadRecords reads the records of instance from path (empty if there
// are none, or they are another instance's).
func loadRecords(path, instance string) (*records, error) {
	r := &records{path: path, Instance: instance, Owned: map[string]map[string]time.Time{}}
	data, err := os.ReadFile(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	var on records
	if err := json.Unmarshal(data, &on); err != nil {
		return nil, fmt.Errorf("%s: %w (vpcni's record of the addresses it put on the primary ENI; fix or remove it — removed, those addresses are left on the ENI as a person's)", r.path, err)
	}
	if on.Instance != instance {
		return r, nil
	}
	on.path = r.path
	if on.Owned == nil {
		on.Owned = map[string]map[string]time.Time{}
	}
	return &on, nil
}

// save writes the records atomically (temp file, fsync, rename).
func (r *records) save() (err error) {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.path), ".aws-eni-owned-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), r.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(r.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// owns says whether the record holds an address or prefix on an ENI.
func (r *records) owns(eni, what string) bool {
	_, ok := r.Owned[eni][what]
	return ok
}

// own records addresses or prefixes as vpcni's (not saved).
func (r *records) own(eni string, what []string, now time.Time) {
	if len(what) == 0 {
		return
	}
	m := r.Owned[eni]
	if m == nil {
		m = map[string]time.Time{}
		r.Owned[eni] = m
	}
	for _, w := range what {
		m[w] = now
	}
}

// disown forgets addresses or prefixes (not saved).
func (r *records) disown(eni string, what []string) {
	for _, w := range what {
		delete(r.Owned[eni], w)
	}
	if len(r.Owned[eni]) == 0 {
		delete(r.Owned, eni)
	}
}

// begin records an intent durably before its call.
func (r *records) begin(in intent) error {
	r.Pending = append(r.Pending, in)
	if err := r.save(); err != nil {
		r.Pending = r.Pending[:len(r.Pending)-1]
		return fmt.Errorf("record the intent to assign on ENI %s: %w", in.ENI, err)
	}
	return nil
}

// pendingOn says whether an intent on eni waits to be settled.
func (r *records) pendingOn(eni string) bool {
	return slices.ContainsFunc(r.Pending, func(in intent) bool { return in.ENI == eni })
}

// end drops an intent (not saved).
func (r *records) end(in intent) {
	r.Pending = slices.DeleteFunc(r.Pending, func(p intent) bool { return p.ENI == in.ENI && p.At.Equal(in.At) })
}

// settle resolves the intents on eni against what it holds now; it
// returns what it claimed and, if the ENI gained more than an intent
// asked for, what it did not dare claim. Not saved.
func (r *records) settle(eni string, now []string) (claimed, unclaimed []string) {
	var keep []intent
	for _, in := range r.Pending {
		if in.ENI != eni {
			keep = append(keep, in)
			continue
		}
		var gained []string
		for _, w := range now {
			if isV6(w) != in.V6 {
				continue
			}
			if !slices.Contains(in.Before, w) && !r.owns(eni, w) {
				gained = append(gained, w)
			}
		}
		if len(gained) <= in.Count {
			r.own(eni, gained, in.At)
			claimed = append(claimed, gained...)
		} else {
			unclaimed = append(unclaimed, gained...)
		}
	}
	r.Pending = keep
	return claimed, unclaimed
}

// isV6 says whether a recorded address or prefix is IPv6.
func isV6(w string) bool { return strings.Contains(w, ":") }

// prune forgets what eni no longer holds, once it was recorded longer ago
// than grace (EC2's describes may lag its own writes for a moment), and
// every record of an ENI that is not attached any more. It says whether
// anything changed. Not saved.
func (r *records) prune(eni string, holds map[string]bool, cutoff time.Time) bool {
	changed := false
	for w, at := range r.Owned[eni] {
		if !holds[w] && at.Before(cutoff) {
			delete(r.Owned[eni], w)
			changed = true
		}
	}
	if len(r.Owned[eni]) == 0 && r.Owned[eni] != nil {
		delete(r.Owned, eni)
	}
	return changed
}

// isIdle says whether a prefix address was given back.
func (r *records) isIdle(a netip.Addr) bool { return slices.Contains(r.Idle, a) }

// setIdle marks prefix addresses given back, or (idle false) taken again.
func (r *records) setIdle(addrs []netip.Addr, idle bool) {
	for _, a := range addrs {
		i := slices.Index(r.Idle, a)
		switch {
		case idle && i < 0:
			r.Idle = append(r.Idle, a)
		case !idle && i >= 0:
			r.Idle = slices.Delete(r.Idle, i, i+1)
		}
	}
	slices.SortFunc(r.Idle, netip.Addr.Compare)
}
