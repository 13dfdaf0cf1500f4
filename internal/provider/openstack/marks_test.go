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

// IPv6 marks: a block of their own beside the IPv4 one, 64-bit offsets,
// each family's split keeping the other's block as text.
func TestMarksIPv6BesideIPv4(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v4 := netip.MustParsePrefix("10.9.0.0/24")
		v6 := netip.MustParsePrefix("fd00:9::/64")
		want4, want6 := map[netip.Addr]bool{}, map[netip.Addr]bool{}
		for _, o := range rapid.SliceOfN(rapid.IntRange(1, 254), 0, 20).Draw(t, "offsets4") {
			want4[addrAt(v4.Addr(), uint64(o))] = true
		}
		for _, o := range rapid.SliceOfN(rapid.Uint64(), 0, 8).Draw(t, "offsets6") {
			want6[addrAt(v6.Addr(), o)] = true
		}
		rest := rapid.SampledFrom([]string{"", "web VM"}).Draw(t, "rest")
		d4, err := joinMarks(rest, want4, v4)
		if err != nil {
			t.Fatal(err)
		}
		r6, _, err := splitMarks(d4, v6)
		if err != nil || r6 != d4 {
			t.Fatalf("the IPv6 split of %q: rest %q, %v; want all of it as text", d4, r6, err)
		}
		desc, err := joinMarks(r6, want6, v6)
		if err != nil {
			t.Fatal(err)
		}
		rest4, got4, err := splitMarks(desc, v4)
		if err != nil || len(got4) != len(want4) {
			t.Fatalf("%q: IPv4 marks %v, %v; want %v", desc, got4, err, want4)
		}
		rest6, got6, err := splitMarks(desc, v6)
		if err != nil || len(got6) != len(want6) || rest6 != d4 {
			t.Fatalf("%q: IPv6 marks %v rest %q, %v; want %v and rest %q", desc, got6, rest6, err, want6, d4)
		}
		for a := range want6 {
			if !got6[a] || !v6.Contains(a) {
				t.Fatalf("%q lost %s", desc, a)
			}
		}
		if len(want4) > 0 && !strings.Contains(rest4, markOpen6) && len(want6) > 0 {
			t.Fatalf("the IPv4 split of %q dropped the IPv6 block: rest %q", desc, rest4)
		}
	})
	// Lowest-first picks are short: ::2-::41 of a /64 in 12 characters.
	v6 := netip.MustParsePrefix("fd00:9::/64")
	want := map[netip.Addr]bool{}
	for o := uint64(2); o <= 0x41; o++ {
		want[addrAt(v6.Addr(), o)] = true
	}
	if d, err := joinMarks("", want, v6); err != nil || d != "[vpcni6:2-1t]" {
		t.Fatalf("64 consecutive IPv6 addresses marked as %q, %v", d, err)
	}
	if fit := marksFit6(v6, netip.MustParseAddr("fd00:9::2"), netip.MustParsePrefix("10.9.0.0/24")); fit < 30 || fit > 64 {
		t.Fatalf("marksFit6 beside a /24's bitmap = %d, want 30..64 (scattered 3-digit offsets)", fit)
	}
}
