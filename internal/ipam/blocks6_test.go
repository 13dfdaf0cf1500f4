package ipam

import (
	"math"
	"net/netip"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestNumArithmetic(t *testing.T) {
	if got := pow2(64); got != (num{hi: 1}) {
		t.Errorf("2^64 = %+v", got)
	}
	if got := pow2(128); got != maxNum {
		t.Errorf("2^128 = %+v, want saturated", got)
	}
	if got := (num{lo: math.MaxUint64}).add(num{lo: 1}); got != (num{hi: 1}) {
		t.Errorf("carry: %+v", got)
	}
	if got := maxNum.add(num{lo: 1}); got != maxNum {
		t.Errorf("add past 2^128: %+v, want saturated", got)
	}
	if got := (num{hi: 1}).sub(num{lo: 1}); got != (num{lo: math.MaxUint64}) {
		t.Errorf("borrow: %+v", got)
	}
	if got := (num{lo: 1}).sub(num{lo: 2}); got != (num{}) {
		t.Errorf("1-2 = %+v, want 0", got)
	}
	if got := (num{hi: 1}).int(); got != math.MaxInt {
		t.Errorf("2^64 as int = %d, want MaxInt", got)
	}
	for p, want := range map[string]string{
		"fd00::/64":       "fd00::ffff:ffff:ffff:ffff",
		"fd00::/0":        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
		"fd00::7/128":     "fd00::7",
		"fd00::/63":       "fd00::1:ffff:ffff:ffff:ffff",
		"10.1.2.3/20":     "10.1.15.255",
		"0.0.0.0/0":       "255.255.255.255",
		"2001:db8::1/100": "2001:db8::fff:ffff",
	} {
		if got := lastAddr(netip.MustParsePrefix(p)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s, want %s", p, got, want)
		}
	}
}

// A /64 splits into exactly MaxBlocks /80s, handed out in order; a /96
// split of it is refused with the fix; IPv6 and IPv4 ranges do not mix.
func TestBlocksV6(t *testing.T) {
	b, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}, 80)
	if err != nil {
		t.Fatal(err)
	}
	if b.Count() != MaxBlocks || b.Size() != 1<<48 {
		t.Fatalf("count %d size %d, want %d and 2^48", b.Count(), b.Size(), MaxBlocks)
	}
	var used []netip.Prefix
	for _, w := range []string{"fd00:10::/80", "fd00:10:0:0:1::/80", "fd00:10:0:0:2::/80"} {
		p, ok := b.Free(used)
		if !ok || p.String() != w {
			t.Fatalf("after %v: free %v %v, want %s", used, p, ok, w)
		}
		used = append(used, p)
	}
	// An address used inside the fourth block rules it out.
	if p, ok := b.Free(append(used, netip.MustParsePrefix("fd00:10:0:0:3::5/128"))); !ok || p.String() != "fd00:10:0:0:4::/80" {
		t.Fatalf("free beside a /128 in the fourth block: %v %v", p, ok)
	}
	last := ""
	b.All(func(p netip.Prefix) bool { last = p.String(); return true })
	if last != "fd00:10:0:0:ffff::/80" {
		t.Errorf("last block %s, want fd00:10:0:0:ffff::/80", last)
	}
	if !b.Contains(netip.MustParsePrefix("fd00:10:0:0:7::/80")) || b.Contains(netip.MustParsePrefix("fd00:10:0:0:7::/96")) ||
		b.Contains(netip.MustParsePrefix("::ffff:10.0.0.0/80")) {
		t.Error("Contains: wrong for a v6 block, a misaligned size or another family")
	}
	if _, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}, 96); err == nil || !strings.Contains(err.Error(), "use larger blocks") {
		t.Errorf("a /64 in /96s (2^32 blocks) accepted: %v", err)
	}
	if _, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}, 129); err == nil || !strings.Contains(err.Error(), "/1 to /128") {
		t.Errorf("/129 blocks: %v", err)
	}
	if _, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("fd00:10::/64"), netip.MustParsePrefix("10.0.0.0/16")}, 80); err == nil ||
		!strings.Contains(err.Error(), "10.0.0.0/16 is not of the family of fd00:10::/64") {
		t.Errorf("mixed families: %v", err)
	}
	// Blocks as large as a /64 step by 2^64.
	b, err = NewBlocks([]netip.Prefix{netip.MustParsePrefix("fd00:20::/48")}, 64)
	if err != nil {
		t.Fatal(err)
	}
	if b.Count() != 1<<16 || b.Size() != math.MaxInt {
		t.Errorf("/48 in /64s: count %d size %d, want 65536 and MaxInt", b.Count(), b.Size())
	}
	var got []string
	b.All(func(p netip.Prefix) bool { got = append(got, p.String()); return len(got) < 2 })
	if strings.Join(got, " ") != "fd00:20::/64 fd00:20:0:1::/64" {
		t.Errorf("/48 in /64s: first blocks %v", got)
	}
}

// TestBlocksNeverOverlap for IPv6 ranges and blocks anywhere in the space.
func TestBlocksV6NeverOverlap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var raw [16]byte
		for i := range raw[:8] {
			raw[i] = byte(rapid.IntRange(0, 255).Draw(t, "hi"))
		}
		rangeBits := rapid.IntRange(100, 120).Draw(t, "rangeBits")
		r, _ := netip.AddrFrom16(raw).Prefix(rangeBits)
		bits := rapid.IntRange(rangeBits, min(rangeBits+6, 128)).Draw(t, "bits")
		b, err := NewBlocks([]netip.Prefix{r}, bits)
		if err != nil {
			t.Fatal(err)
		}
		near := numOf(r.Addr())
		var used []netip.Prefix
		for range rapid.IntRange(0, 20).Draw(t, "preused") {
			off := rapid.Uint64Range(0, 1<<(128-rangeBits+1)).Draw(t, "offset")
			a := near.sub(num{lo: 1 << (128 - rangeBits - 1)}).add(num{lo: off}).addr(r.Addr())
			p, _ := a.Prefix(rapid.IntRange(rangeBits-2, 128).Draw(t, "ubits"))
			used = append(used, p)
		}
		pre := len(used)
		for {
			p, ok := b.Free(used)
			if !ok {
				break
			}
			if p.Bits() != bits || p.Masked() != p || !r.Contains(p.Addr()) || !b.Contains(p) {
				t.Fatalf("block %s is not an aligned /%d of %s", p, bits, r)
			}
			for _, u := range used {
				if u.Overlaps(p) {
					t.Fatalf("block %s overlaps %s", p, u)
				}
			}
			used = append(used, p)
			if len(used)-pre > b.Count() {
				t.Fatalf("more blocks than %d handed out", b.Count())
			}
		}
		b.All(func(p netip.Prefix) bool {
			for _, u := range used {
				if u.Overlaps(p) {
					return true
				}
			}
			t.Fatalf("Free said full, but %s is free", p)
			return false
		})
	})
}
