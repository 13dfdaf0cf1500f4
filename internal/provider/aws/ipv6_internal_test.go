package aws

import (
	"net/netip"
	"slices"
	"testing"
)

// TestPrefix6Use: a /80's addresses are handed out by offset without
// expanding it: given-back ones first, then new ones past any taken by
// name; all back, the record starts over.
func TestPrefix6Use(t *testing.T) {
	pf := netip.MustParsePrefix("2600:1f18:aa:bb01:7::/80")
	for _, off := range []uint64{1, 255, 256, 1<<48 - 1} {
		if a := addrAt6(pf, off); !pf.Contains(a) || offset6(pf, a) != off {
			t.Fatalf("offset %d: %s (back to %d)", off, a, offset6(pf, a))
		}
	}
	if a := addrAt6(pf, 1<<48-1); a != netip.MustParseAddr("2600:1f18:aa:bb01:7:ffff:ffff:ffff") {
		t.Fatalf("the last address: %s", a)
	}
	u := &prefix6Use{Next: 1}
	first := u.take(pf, 3)
	if !slices.Equal(first, []netip.Addr{addrAt6(pf, 1), addrAt6(pf, 2), addrAt6(pf, 3)}) || u.Next != 4 {
		t.Fatalf("take 3: %v next %d", first, u.Next)
	}
	if !u.takeNamed(5) || u.takeNamed(5) || u.takeNamed(2) || u.takeNamed(0) {
		t.Fatal("takeNamed: 5 once, never a held one or offset 0")
	}
	if got := u.take(pf, 2); !slices.Equal(got, []netip.Addr{addrAt6(pf, 4), addrAt6(pf, 6)}) || len(u.Taken) != 0 {
		t.Fatalf("take 2 past the named 5: %v (taken %v)", got, u.Taken)
	}
	if !u.give(2) || u.give(2) || u.give(9) {
		t.Fatal("give: 2 once, never one not handed out")
	}
	if got := u.take(pf, 1); !slices.Equal(got, []netip.Addr{addrAt6(pf, 2)}) {
		t.Fatalf("the given-back 2 first: %v", got)
	}
	if h := u.held(pf); len(h) != 6 {
		t.Fatalf("held %v, want offsets 1-6", h)
	}
	for off := uint64(1); off <= 6; off++ {
		if u.idle() {
			t.Fatalf("idle with %d still out", 7-off)
		}
		u.give(off)
	}
	if !u.idle() || u.Next != 1 || len(u.Free) != 0 {
		t.Fatalf("all back: %+v", u)
	}
}
