package openstack

import (
	"net/netip"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestMarksRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bits := rapid.IntRange(16, 28).Draw(t, "bits")
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rapid.IntRange(0, 255).Draw(t, "b")), 0, 0}), bits).Masked()
		size := 1 << (32 - bits)
		want := map[netip.Addr]bool{}
		for _, o := range rapid.SliceOfN(rapid.IntRange(0, size-1), 0, 30).Draw(t, "offsets") {
			want[addrAt(subnet.Addr(), uint64(o))] = true
		}
		rest := rapid.SampledFrom([]string{"", "web VM", "owned by team x"}).Draw(t, "rest")
		desc, err := joinMarks(rest, want, subnet)
		if err != nil {
			t.Fatalf("join: %v", err)
		}
		gotRest, got, err := splitMarks(desc, subnet)
		if err != nil {
			t.Fatalf("split %q: %v", desc, err)
		}
		if gotRest != rest || len(got) != len(want) {
			t.Fatalf("%q: rest %q marks %v, want %q %v", desc, gotRest, got, rest, want)
		}
		for a := range want {
			if !got[a] {
				t.Fatalf("%q lost %s", desc, a)
			}
		}
	})
}

func TestMarksCompactAndBounded(t *testing.T) {
	subnet := netip.MustParsePrefix("10.0.0.0/24")
	run := map[netip.Addr]bool{}
	for i := 100; i < 200; i++ {
		run[addrAt(subnet.Addr(), uint64(i))] = true
	}
	desc, err := joinMarks("", run, subnet)
	if err != nil || desc != "[vpcni:2s-5j]" {
		t.Fatalf("100 consecutive addresses: %q, %v", desc, err)
	}
	scattered := map[netip.Addr]bool{}
	for i := 0; i < 250; i += 2 {
		scattered[addrAt(subnet.Addr(), uint64(i))] = true
	}
	if _, err := joinMarks(strings.Repeat("x", 210), scattered, subnet); err == nil || !strings.Contains(err.Error(), "no longer fit") {
		t.Fatalf("overlong marks: %v", err)
	}
	for _, bad := range []string{"[vpcni:zz-a]", "[vpcni:%%]", "[vpcni:1", "[vpcni:zzzzz]", "[vpcni:=AAAA]", "[vpcni:=!!]"} {
		if _, _, err := splitMarks(bad, subnet); err == nil {
			t.Errorf("splitMarks(%q) accepted it", bad)
		}
	}
}

func TestMarksFitIsSafe(t *testing.T) {
	for _, bits := range []int{16, 20, 24, 28} {
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 0}), bits)
		n := marksFit(subnet)
		// The worst case: n addresses two apart, near the end of the subnet.
		size := uint64(1) << (32 - bits)
		addrs := map[netip.Addr]bool{}
		for i := range min(uint64(n), size/2) {
			addrs[addrAt(subnet.Addr(), size-1-2*i)] = true
		}
		if _, err := joinMarks("", addrs, subnet); err != nil {
			t.Errorf("/%d: %d scattered addresses do not fit: %v", bits, n, err)
		}
		if n < 10 {
			t.Errorf("/%d: only %d addresses fit", bits, n)
		}
	}
}

// Scattered addresses switch to the bitmap: every address of a /24 fits.
func TestMarksBitmap(t *testing.T) {
	subnet := netip.MustParsePrefix("10.0.0.0/24")
	all := map[netip.Addr]bool{}
	for i := range 256 {
		all[addrAt(subnet.Addr(), uint64(i))] = true
	}
	if desc, err := joinMarks("", all, subnet); err != nil || desc != "[vpcni:0-73]" {
		t.Fatalf("a whole /24 is one range: %q %v", desc, err)
	}
	scattered := map[netip.Addr]bool{}
	for i := 1; i < 256; i += 2 {
		scattered[addrAt(subnet.Addr(), uint64(i))] = true
	}
	desc, err := joinMarks("web VM", scattered, subnet)
	if err != nil || !strings.HasPrefix(desc, "web VM [vpcni:=") || len(desc) != len("web VM [vpcni:=]")+43 {
		t.Fatalf("128 scattered addresses: %q (%d characters) %v", desc, len(desc), err)
	}
	rest, got, err := splitMarks(desc, subnet)
	if err != nil || rest != "web VM" || len(got) != 128 || !got[addrAt(subnet.Addr(), 255)] || got[addrAt(subnet.Addr(), 254)] {
		t.Fatalf("bitmap back: %q %d %v", rest, len(got), err)
	}
	for bits, want := range map[int]int{24: 256, 23: 512, 22: 1024, 21: 61, 16: 49, 28: 16} {
		if got := marksFit(netip.PrefixFrom(subnet.Addr(), bits)); got != want {
			t.Errorf("marksFit(/%d) = %d, want %d", bits, got, want)
		}
	}
}
