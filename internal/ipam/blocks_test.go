package ipam

import (
	"net/netip"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestNewBlocksNamesEveryBadInput(t *testing.T) {
	_, err := NewBlocks([]netip.Prefix{
		netip.MustParsePrefix("10.0.0.1/24"),
		netip.MustParsePrefix("fd00::/64"),
		netip.MustParsePrefix("10.1.0.0/30"),
		netip.MustParsePrefix("10.2.0.0/16"),
		netip.MustParsePrefix("10.2.128.0/17"),
	}, 28)
	if err == nil {
		t.Fatal("bad ranges accepted")
	}
	for _, want := range []string{"did you mean 10.0.0.0/24", "fd00::/64 is not of the family of 10.0.0.1/24", "10.1.0.0/30 is smaller than one block /28",
		"10.2.0.0/16 and 10.2.128.0/17 overlap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, 32); err == nil || !strings.Contains(err.Error(), "use larger blocks") {
		t.Errorf("16M blocks accepted: %v", err)
	}
	if _, err := NewBlocks(nil, 33); err == nil || !strings.Contains(err.Error(), "no range") || !strings.Contains(err.Error(), "/33") {
		t.Errorf("no range and /33: %v", err)
	}
}

func TestBlocksInOrderUntilFull(t *testing.T) {
	b, err := NewBlocks([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/26"), netip.MustParsePrefix("192.168.7.0/27")}, 28)
	if err != nil {
		t.Fatal(err)
	}
	if b.Count() != 6 || b.Size() != 16 {
		t.Fatalf("count %d size %d, want 6 and 16", b.Count(), b.Size())
	}
	var used []netip.Prefix
	want := []string{"10.20.0.0/28", "10.20.0.16/28", "10.20.0.32/28", "10.20.0.48/28", "192.168.7.0/28", "192.168.7.16/28"}
	for _, w := range want {
		p, ok := b.Free(used)
		if !ok || p.String() != w {
			t.Fatalf("after %v: free %v %v, want %s", used, p, ok, w)
		}
		used = append(used, p)
	}
	if p, ok := b.Free(used); ok {
		t.Fatalf("full ranges gave %s", p)
	}
	// A block of an older, larger size covers the blocks inside it; one
	// outside the ranges covers nothing of them.
	p, ok := b.Free([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/27"), netip.MustParsePrefix("10.99.0.0/28")})
	if !ok || p.String() != "10.20.0.32/28" {
		t.Fatalf("free beside an old /27: %v %v", p, ok)
	}
	// A smaller one inside a candidate rules the whole candidate out.
	p, ok = b.Free([]netip.Prefix{netip.MustParsePrefix("10.20.0.5/32")})
	if !ok || p.String() != "10.20.0.16/28" {
		t.Fatalf("free beside a /32 in the first block: %v %v", p, ok)
	}
	if !b.Contains(netip.MustParsePrefix("192.168.7.16/28")) || b.Contains(netip.MustParsePrefix("10.20.0.8/29")) ||
		b.Contains(netip.MustParsePrefix("10.20.0.64/28")) {
		t.Error("Contains: wrong for a block, a misaligned size or a block outside the ranges")
	}
}

// Whatever was used before (blocks of any size, anywhere), the blocks
// Free hands out one after another are aligned, of the size, inside the
// ranges, overlap nothing used and nothing handed out, and Free says
// "full" only when no block of the ranges is free.
func TestBlocksNeverOverlap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := netip.AddrFrom4([4]byte{10, byte(rapid.IntRange(0, 3).Draw(t, "b")), 0, 0})
		rangeBits := rapid.IntRange(20, 26).Draw(t, "rangeBits")
		r, _ := base.Prefix(rangeBits)
		bits := rapid.IntRange(rangeBits, 30).Draw(t, "bits")
		b, err := NewBlocks([]netip.Prefix{r}, bits)
		if err != nil {
			t.Fatal(err)
		}
		var used []netip.Prefix
		for range rapid.IntRange(0, 20).Draw(t, "preused") {
			a := netip.AddrFrom4([4]byte{10, byte(rapid.IntRange(0, 3).Draw(t, "o2")), byte(rapid.IntRange(0, 255).Draw(t, "o3")), byte(rapid.IntRange(0, 255).Draw(t, "o4"))})
			p, _ := a.Prefix(rapid.IntRange(18, 32).Draw(t, "ubits"))
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
