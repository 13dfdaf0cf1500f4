package ipam_test

import (
	"encoding/binary"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vpcni/vpcni/internal/ipam"
)

func TestRangeV6Reserved(t *testing.T) {
	r := mustRange(t, "fd00:1:2:3::/120", "")
	if want := netip.MustParseAddr("fd00:1:2:3::1"); r.Gateway != want {
		t.Fatalf("gateway = %s, want %s", r.Gateway, want)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"fd00:1:2:3::", false},    // Subnet-Router anycast
		{"fd00:1:2:3::1", false},   // gateway
		{"fd00:1:2:3::2", true},    // first usable
		{"fd00:1:2:3::ff", true},   // the last: IPv6 has no broadcast
		{"fd00:1:2:3::100", false}, // outside
		{"10.0.0.2", false},        // another family
		{"::ffff:10.0.0.2", false},
	} {
		if got := r.Usable(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Usable(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	if n := r.Size(); n != 254 || len(all(r)) != 254 {
		t.Errorf("/120 Size = %d, All yields %d; want 254 (256 less the anycast and the gateway)", n, len(all(r)))
	}
	// A /127 is a point-to-point link (RFC 6164): both addresses are
	// hosts, one the gateway.
	r = mustRange(t, "fd00::/127", "")
	if got := all(r); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("fd00::")}) || r.Size() != 1 {
		t.Errorf("/127 usable = %v (Size %d), want just fd00::", got, r.Size())
	}
	// The last /124 of the space must not wrap around.
	r = mustRange(t, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", "")
	got := all(r)
	if len(got) != 14 || got[len(got)-1] != netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff") || r.Size() != 14 {
		t.Errorf("last /124 usable = %v (Size %d), want 14 ending at the last address", got, r.Size())
	}
}

// A /64 is 2^64 addresses: Size says so at once (saturated), All yields
// the first few when stopped, and a large exclusion is stepped over in
// one step — each of these would never end address by address.
func TestRangeV6LargeIsArithmetic(t *testing.T) {
	start := time.Now()
	r := mustRange(t, "2001:db8:7::/64", "")
	if n := r.Size(); n != math.MaxInt {
		t.Errorf("/64 Size = %d, want math.MaxInt (saturated)", n)
	}
	var got []netip.Addr
	r.All(func(a netip.Addr) bool { got = append(got, a); return len(got) < 3 })
	if want := []netip.Addr{netip.MustParseAddr("2001:db8:7::2"), netip.MustParseAddr("2001:db8:7::3"), netip.MustParseAddr("2001:db8:7::4")}; !slices.Equal(got, want) {
		t.Errorf("/64 All, stopped at 3 = %v, want %v", got, want)
	}
	// The lower half, and a nested /70 in it, excluded: the first usable
	// address is the upper half's first.
	r = mustRange(t, "2001:db8:7::/64", "", "2001:db8:7:0::/65", "2001:db8:7:0:400::/70", "2001:db8:7:0:8000::/128")
	got = nil
	r.All(func(a netip.Addr) bool { got = append(got, a); return len(got) < 2 })
	if want := []netip.Addr{netip.MustParseAddr("2001:db8:7:0:8000::1"), netip.MustParseAddr("2001:db8:7:0:8000::2")}; !slices.Equal(got, want) {
		t.Errorf("/64 less its lower half: All = %v, want %v", got, want)
	}
	// Exact counts where they fit: a /96 (2^32) less a /97 and a /112
	// inside it, a /100 elsewhere in it and one /128: the anycast address
	// and the gateway lie in the excluded /97.
	r = mustRange(t, "fd00:9::/96", "", "fd00:9::/97", "fd00:9::8000/112", "fd00:9::8000:0/100", "fd00:9::ffff:ffff/128", "fd00:a::/64")
	if want := 1<<32 - 1<<31 - 1<<28 - 1; r.Size() != want {
		t.Errorf("/96 less exclusions: Size = %d, want %d", r.Size(), want)
	}
	// An exclusion holding the whole range leaves nothing, at once.
	r = mustRange(t, "fd00:9::/96", "", "fd00::/16")
	if n := r.Size(); n != 0 || len(all(r)) != 0 {
		t.Errorf("/96 inside an excluded /16: Size %d, All %v", n, all(r))
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %s: something walked a range address by address", d)
	}
}

func v6(hi, lo uint64) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}

// TestRangeSizeMatchesUsable for IPv6: small prefixes anywhere in the
// space (their host part fits the low 64 bits), random gateways and
// exclusions near them; Size agrees with counting Usable, All yields
// exactly the usable addresses in order, and Usable agrees with a plain
// integer definition (no broadcast; the first address is reserved).
func TestRangeV6SizeMatchesUsable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bits := rapid.IntRange(116, 128).Draw(t, "bits")
		host := 128 - bits
		mask := ^uint64(0) << host
		hi := rapid.Uint64().Draw(t, "hi")
		base := rapid.Uint64().Draw(t, "base") & mask
		last := base | ^mask
		prefix := netip.PrefixFrom(v6(hi, base), bits)

		var gw netip.Addr
		if rapid.Bool().Draw(t, "explicitGateway") || bits == 128 {
			gw = v6(hi, base+rapid.Uint64Range(0, ^mask).Draw(t, "gatewayOffset"))
		}
		type span struct {
			hi, lo, top uint64
		}
		var spans []span
		var exclude []netip.Prefix
		for range rapid.IntRange(0, 5).Draw(t, "exclusions") {
			at, ehi := base+rapid.Uint64Range(0, ^mask).Draw(t, "excludeOffset"), hi
			if rapid.Bool().Draw(t, "excludeOutside") {
				if b := rapid.IntRange(host, 127).Draw(t, "flipBit"); b < 64 {
					at ^= 1 << b
				} else {
					ehi ^= 1 << (b - 64)
				}
			}
			eb := rapid.IntRange(bits-2, 128).Draw(t, "excludeBits") // >= 114: inside the low 64 bits
			e := netip.PrefixFrom(v6(ehi, at), eb).Masked()
			exclude = append(exclude, e)
			em := ^uint64(0) << (128 - eb)
			spans = append(spans, span{ehi, at & em, at&em | ^em})
		}

		r, err := ipam.NewRange(prefix, gw, exclude)
		if err != nil {
			t.Fatalf("NewRange(%s, %s, %v): %v", prefix, gw, exclude, err)
		}
		if !gw.IsValid() && r.Gateway != v6(hi, base+1) {
			t.Fatalf("default gateway %s, want the first host of %s", r.Gateway, prefix)
		}
		var usable []netip.Addr
		for v := base; ; v++ {
			a := v6(hi, v)
			want := (v != base || bits >= 127) && a != r.Gateway
			for _, s := range spans {
				if s.hi == hi && v >= s.lo && v <= s.top {
					want = false
				}
			}
			if got := r.Usable(a); got != want {
				t.Fatalf("Usable(%s) = %v, want %v (range %s gateway %s exclude %v)", a, got, want, prefix, r.Gateway, exclude)
			}
			if want {
				usable = append(usable, a)
			}
			if v == last {
				break
			}
		}
		if n := r.Size(); n != len(usable) {
			t.Fatalf("Size() = %d, but %d addresses of %s are usable (gateway %s exclude %v)", n, len(usable), prefix, r.Gateway, exclude)
		}
		if got := all(r); !slices.Equal(got, usable) {
			t.Fatalf("All yielded %v, want %v", got, usable)
		}
	})
}

// SizeIn of a block agrees with counting the block's usable addresses,
// for blocks of IPv4 and IPv6 ranges with exclusions and reserved
// addresses at either end; a prefix holding the range counts all of it.
func TestRangeSizeIn(t *testing.T) {
	for _, tc := range []struct {
		r        ipam.Range
		blockLen int
	}{
		{mustRange(t, "10.9.0.0/24", "", "10.9.0.20/32", "10.9.0.64/27", "10.9.0.100/31"), 28},
		{mustRange(t, "10.9.0.0/24", "10.9.0.77", "10.9.0.0/26"), 26},
		{mustRange(t, "fd00:9::/112", "", "fd00:9::20/128", "fd00:9::8000/113", "fd00:9::1:0/113", "fd00:9::3000/116"), 116},
		{mustRange(t, "fd00:9::/120", "fd00:9::ff", "fd00:9::40/122"), 124},
	} {
		total := 0
		for a := tc.r.Prefix.Addr(); tc.r.Prefix.Contains(a); a = a.Next() {
			block, _ := a.Prefix(tc.blockLen)
			if a != block.Addr() {
				continue
			}
			n := 0
			var want []netip.Addr
			for b := a; block.Contains(b); b = b.Next() {
				if tc.r.Usable(b) {
					n++
					want = append(want, b)
				}
			}
			var got []netip.Addr
			tc.r.AllIn(block, func(a netip.Addr) bool { got = append(got, a); return true })
			if !slices.Equal(got, want) {
				t.Errorf("%s AllIn(%s) = %v, want %v", tc.r.Prefix, block, got, want)
			}
			if got := tc.r.SizeIn(block); got != n {
				t.Errorf("%s SizeIn(%s) = %d, want %d", tc.r.Prefix, block, got, n)
			}
			total += n
		}
		if total != tc.r.Size() || tc.r.SizeIn(netip.PrefixFrom(tc.r.Prefix.Addr(), tc.r.Prefix.Bits()-1).Masked()) != total {
			t.Errorf("%s: blocks hold %d, Size %d, SizeIn of a wider prefix %d", tc.r.Prefix, total, tc.r.Size(),
				tc.r.SizeIn(netip.PrefixFrom(tc.r.Prefix.Addr(), tc.r.Prefix.Bits()-1).Masked()))
		}
	}
	r := mustRange(t, "fd00:9::/64", "")
	if n := r.SizeIn(netip.MustParsePrefix("fd00:9::/80")); n != 1<<48-2 {
		t.Errorf("first /80 of a /64: SizeIn %d, want 2^48-2 (anycast, gateway)", n)
	}
	if n := r.SizeIn(netip.MustParsePrefix("fd00:9::1:0:0:0/80")); n != 1<<48 {
		t.Errorf("second /80 of a /64: SizeIn %d, want 2^48", n)
	}
	if n := r.SizeIn(netip.MustParsePrefix("10.0.0.0/8")); n != 0 {
		t.Errorf("another family: SizeIn %d, want 0", n)
	}
}
