package ipam_test

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/vpcni/vpcni/internal/ipam"
)

func mustRange(t *testing.T, prefix, gateway string, exclude ...string) ipam.Range {
	t.Helper()
	var gw netip.Addr
	if gateway != "" {
		gw = netip.MustParseAddr(gateway)
	}
	var ex []netip.Prefix
	for _, e := range exclude {
		ex = append(ex, netip.MustParsePrefix(e))
	}
	r, err := ipam.NewRange(netip.MustParsePrefix(prefix), gw, ex)
	if err != nil {
		t.Fatalf("NewRange(%s, %q, %v): %v", prefix, gateway, exclude, err)
	}
	return r
}

func all(r ipam.Range) []netip.Addr {
	var out []netip.Addr
	r.All(func(a netip.Addr) bool { out = append(out, a); return true })
	return out
}

func TestRangeDefaultGatewayIsFirstHost(t *testing.T) {
	r := mustRange(t, "10.1.2.0/24", "")
	if want := netip.MustParseAddr("10.1.2.1"); r.Gateway != want {
		t.Fatalf("gateway = %s, want %s", r.Gateway, want)
	}
	// Host bits in the prefix are dropped before the gateway is chosen.
	r = mustRange(t, "10.1.2.77/24", "")
	if r.Prefix != netip.MustParsePrefix("10.1.2.0/24") || r.Gateway != netip.MustParseAddr("10.1.2.1") {
		t.Fatalf("got prefix %s gateway %s, want 10.1.2.0/24 and 10.1.2.1", r.Prefix, r.Gateway)
	}
}

func TestNewRangeRejects(t *testing.T) {
	for _, tc := range []struct{ prefix, gateway string }{
		{"10.0.0.0/24", "10.0.1.1"}, // gateway outside
		{"fd00::/64", "fd00:1::1"},  // IPv6 gateway outside
		{"fd00::/64", "10.0.0.1"},   // a gateway of the other family
		{"::ffff:10.0.0.0/120", ""}, // IPv4 mapped into IPv6: say which
		{"fd00::5/128", ""},         // no room for the default gateway
		{"10.0.0.5/32", ""},         // no room for the default gateway
		{"255.255.255.255/32", ""},  // nor here, at the very end of the space
	} {
		var gw netip.Addr
		if tc.gateway != "" {
			gw = netip.MustParseAddr(tc.gateway)
		}
		if r, err := ipam.NewRange(netip.MustParsePrefix(tc.prefix), gw, nil); err == nil {
			t.Errorf("NewRange(%s, %q) = %+v, want an error", tc.prefix, tc.gateway, r)
		}
	}
}

func TestRangeUsable(t *testing.T) {
	// Nested exclusions that together cover a whole /28 leave nothing.
	r := mustRange(t, "10.0.0.0/28", "", "10.0.0.0/29", "10.0.0.4/30", "10.0.0.8/29", "10.0.0.9/32")
	if n := r.Size(); n != 0 {
		t.Fatalf("Size = %d with the whole /28 excluded; usable: %v", n, all(r))
	}

	r = mustRange(t, "10.0.0.0/24", "",
		"10.0.0.10/32",
		"10.0.0.10/32",   // the same twice
		"10.0.0.16/28",   // .16-.31
		"10.0.0.20/30",   // nested in the one above
		"10.0.0.0/30",    // overlaps network and gateway, adds .2 and .3
		"10.0.0.252/30",  // overlaps broadcast, adds .252-.254
		"192.168.0.0/16", // elsewhere entirely: no effect
	)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.0.0.0", false},   // network
		{"10.0.0.1", false},   // gateway
		{"10.0.0.2", false},   // in 10.0.0.0/30
		{"10.0.0.3", false},   // in 10.0.0.0/30
		{"10.0.0.4", true},    // first usable
		{"10.0.0.9", true},    //
		{"10.0.0.10", false},  // single exclusion
		{"10.0.0.11", true},   //
		{"10.0.0.15", true},   // just below the /28
		{"10.0.0.16", false},  // first of the /28
		{"10.0.0.22", false},  // in both the /28 and the nested /30
		{"10.0.0.31", false},  // last of the /28
		{"10.0.0.32", true},   // just above it
		{"10.0.0.251", true},  // just below the top /30
		{"10.0.0.252", false}, // top /30
		{"10.0.0.254", false}, // top /30
		{"10.0.0.255", false}, // broadcast
		{"10.0.1.4", false},   // outside the prefix
		{"9.255.255.255", false},
		{"192.168.0.5", false}, // in an exclusion, outside the prefix
		{"::ffff:10.0.0.4", false},
	} {
		if got := r.Usable(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Usable(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	// 256 - network - broadcast - gateway - .2 .3 - .10 - .16-.31 - .252-.254
	const want = 256 - 1 - 1 - 1 - 2 - 1 - 16 - 3
	if n := r.Size(); n != want {
		t.Errorf("Size = %d, want %d", n, want)
	}
	got := all(r)
	if len(got) != r.Size() {
		t.Errorf("All yielded %d addresses, Size says %d", len(got), r.Size())
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].Compare(got[i]) >= 0 {
			t.Fatalf("All is not strictly ascending at %d: %s then %s", i, got[i-1], got[i])
		}
		if !r.Usable(got[i]) {
			t.Fatalf("All yielded %s, which Usable refuses", got[i])
		}
	}
	if got[0] != netip.MustParseAddr("10.0.0.4") || got[len(got)-1] != netip.MustParseAddr("10.0.0.251") {
		t.Errorf("All runs %s..%s, want 10.0.0.4..10.0.0.251", got[0], got[len(got)-1])
	}
}

func TestRangeExplicitGateway(t *testing.T) {
	r := mustRange(t, "10.0.0.0/29", "10.0.0.6")
	want := []netip.Addr{
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"),
		netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.0.5"),
	}
	if got := all(r); !slices.Equal(got, want) {
		t.Fatalf("All = %v, want %v (.0 network, .6 gateway, .7 broadcast)", got, want)
	}
}

func TestRangeAllStopsWhenAsked(t *testing.T) {
	r := mustRange(t, "10.0.0.0/24", "")
	var got []netip.Addr
	r.All(func(a netip.Addr) bool { got = append(got, a); return len(got) < 3 })
	want := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")}
	if !slices.Equal(got, want) {
		t.Fatalf("All with an early stop yielded %v, want %v", got, want)
	}
}

func TestRangeTinyPrefixes(t *testing.T) {
	// A /31 is a point-to-point link: both addresses are hosts (RFC 3021),
	// one of them the gateway.
	r := mustRange(t, "10.0.0.0/31", "")
	if r.Gateway != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("/31 default gateway = %s, want 10.0.0.1", r.Gateway)
	}
	if got := all(r); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.0")}) || r.Size() != 1 {
		t.Errorf("/31 usable = %v (Size %d), want just 10.0.0.0", got, r.Size())
	}
	r = mustRange(t, "10.0.0.0/31", "10.0.0.0")
	if got := all(r); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) {
		t.Errorf("/31 with gateway .0: usable = %v, want just 10.0.0.1", got)
	}
	// A /32 holds only its gateway: nothing for pods, and no endless loop.
	r = mustRange(t, "10.0.0.5/32", "10.0.0.5")
	if n := r.Size(); n != 0 {
		t.Errorf("/32 Size = %d, want 0", n)
	}
	// The last /30 of the address space must not wrap around.
	r = mustRange(t, "255.255.255.252/30", "")
	if got := all(r); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("255.255.255.254")}) {
		t.Errorf("255.255.255.252/30 usable = %v, want just .254", got)
	}
}

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func addrOf(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// For random small prefixes with random gateways and exclusions, Size is the
// number of addresses in the prefix that Usable accepts, All yields exactly
// those in order, and Usable agrees with a plain integer definition.
func TestRangeSizeMatchesUsable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bits := rapid.IntRange(20, 30).Draw(t, "bits")
		mask := ^uint32(0) << (32 - bits)
		base := rapid.Uint32().Draw(t, "base") & mask
		last := base | ^mask
		prefix := netip.PrefixFrom(addrOf(base), bits)

		var gw netip.Addr
		if rapid.Bool().Draw(t, "explicitGateway") {
			gw = addrOf(base + rapid.Uint32Range(0, ^mask).Draw(t, "gatewayOffset"))
		}
		type span struct{ lo, hi uint32 }
		var spans []span
		var exclude []netip.Prefix
		for range rapid.IntRange(0, 5).Draw(t, "exclusions") {
			// Near the prefix, sometimes straddling or outside it.
			at := base + rapid.Uint32Range(0, ^mask).Draw(t, "excludeOffset")
			if rapid.Bool().Draw(t, "excludeOutside") {
				at ^= 1 << rapid.IntRange(32-bits, 31).Draw(t, "flipBit")
			}
			eb := rapid.IntRange(bits-2, 32).Draw(t, "excludeBits")
			emask := ^uint32(0) << (32 - eb)
			exclude = append(exclude, netip.PrefixFrom(addrOf(at), eb).Masked())
			spans = append(spans, span{at & emask, at&emask | ^emask})
		}

		r, err := ipam.NewRange(prefix, gw, exclude)
		if err != nil {
			t.Fatalf("NewRange(%s, %s, %v): %v", prefix, gw, exclude, err)
		}
		if !gw.IsValid() && u32(r.Gateway) != base+1 {
			t.Fatalf("default gateway %s, want the first host of %s", r.Gateway, prefix)
		}

		var usable []netip.Addr
		for v := base; ; v++ {
			a := addrOf(v)
			want := v != base && v != last && a != r.Gateway
			for _, s := range spans {
				if v >= s.lo && v <= s.hi {
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
		if base > 0 && r.Usable(addrOf(base-1)) {
			t.Fatalf("Usable(%s) outside %s", addrOf(base-1), prefix)
		}
		if last < ^uint32(0) && r.Usable(addrOf(last+1)) {
			t.Fatalf("Usable(%s) outside %s", addrOf(last+1), prefix)
		}
		if n := r.Size(); n != len(usable) {
			t.Fatalf("Size() = %d, but %d addresses of %s are usable", n, len(usable), prefix)
		}
		if got := all(r); !slices.Equal(got, usable) {
			t.Fatalf("All yielded %v, want %v", got, usable)
		}
	})
}
