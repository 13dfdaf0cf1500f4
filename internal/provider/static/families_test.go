package static_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// dualRanges: 10.0.0.0/29 (.2-.6 usable) and a whole IPv6 /64 with its
// ::10-::1f excluded.
func dualRanges() *static.Config {
	return &static.Config{Ranges: []static.Range{
		{CIDR: "10.0.0.0/29"},
		{CIDR: "fd00:5::/64", Exclude: []string{"fd00:5::10/124"}},
	}}
}

// A dual-stack node: each request gets its family's addresses only, in
// order from its ranges; Held lists both; Release gives back both; the
// state survives a restart; the capacity is per family, the IPv6 one
// maxAddresses. Nothing walks the /64: the whole test is quick.
func TestDualAssignByFamily(t *testing.T) {
	start := time.Now()
	dir := t.TempDir()
	p, err := static.New(dualRanges(), dir)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := assign(t, p, provider.AssignRequest{Count: 2}) // Family unset: IPv4
	if err != nil || !slices.Equal(v4, addrs("10.0.0.2", "10.0.0.3")) {
		t.Fatalf("IPv4 Assign = %v, %v", v4, err)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 3, Family: family.V6})
	if err != nil {
		t.Fatal(err)
	}
	v6 := leased(t, got)
	if !slices.Equal(v6, addrs("fd00:5::2", "fd00:5::3", "fd00:5::4")) {
		t.Fatalf("IPv6 Assign = %v: want fd00:5::2..4 (::0 anycast, ::1 gateway)", v6)
	}
	if got[0].Prefix != netip.MustParsePrefix("fd00:5::/64") || got[0].Gateway != netip.MustParseAddr("fd00:5::1") {
		t.Errorf("IPv6 lease %+v: want subnet fd00:5::/64 and gateway fd00:5::1", got[0])
	}
	// A named address: of the request's family only; an excluded one is
	// outside the ranges.
	if _, err := assign(t, p, provider.AssignRequest{Addresses: addrs("fd00:5::99")}); !errors.Is(err, provider.ErrOutside) || !strings.Contains(err.Error(), "not an IPv4 address") {
		t.Errorf("an IPv6 address in an IPv4 request: %v, want ErrOutside", err)
	}
	if _, err := assign(t, p, provider.AssignRequest{Addresses: addrs("10.0.0.5"), Family: family.V6}); !errors.Is(err, provider.ErrOutside) {
		t.Errorf("an IPv4 address in an IPv6 request: %v, want ErrOutside", err)
	}
	if _, err := assign(t, p, provider.AssignRequest{Addresses: addrs("fd00:5::1a"), Family: family.V6}); !errors.Is(err, provider.ErrOutside) {
		t.Errorf("an excluded IPv6 address: %v, want ErrOutside", err)
	}
	named, err := assign(t, p, provider.AssignRequest{Addresses: addrs("fd00:5::99"), Family: family.V6})
	if err != nil || !slices.Equal(named, addrs("fd00:5::99")) {
		t.Fatalf("named IPv6 address: %v, %v", named, err)
	}
	all := append(append(slices.Clone(v4), v6...), named...)
	if h := held(t, p); !slices.Equal(h, all) {
		t.Fatalf("Held = %v, want %v (both families)", h, all)
	}
	// A restart reads both families back.
	again, err := static.New(dualRanges(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if h := held(t, again); !slices.Equal(h, all) {
		t.Fatalf("Held after a restart = %v, want %v", h, all)
	}
	if err := again.Release(context.Background(), addrs("10.0.0.2", "fd00:5::3", "fd00:5::99")); err != nil {
		t.Fatal(err)
	}
	if h := held(t, again); !slices.Equal(h, addrs("10.0.0.3", "fd00:5::2", "fd00:5::4")) {
		t.Fatalf("Held after releasing one of each = %v", h)
	}
	// The lowest free address of the family comes back first.
	if got, err := assign(t, again, provider.AssignRequest{Count: 1, Family: family.V6}); err != nil || !slices.Equal(got, addrs("fd00:5::3")) {
		t.Errorf("IPv6 Assign after a release = %v, %v; want fd00:5::3", got, err)
	}

	info := again.Info()
	if c := info.Capacities[family.V4]; c.Max != 5 || !strings.Contains(c.Reason, "5 usable addresses") {
		t.Errorf("IPv4 capacity %+v, want 5 usable", c)
	}
	if c := info.Capacities[family.V6]; c.Max != static.DefaultMaxAddresses || !strings.Contains(c.Reason, "maxAddresses") || !strings.Contains(c.Reason, "2^63 or more") {
		t.Errorf("IPv6 capacity %+v, want maxAddresses (%d) of 2^63 or more", c, static.DefaultMaxAddresses)
	}
	if info.Capacity != 5 || len(info.Capacities) != 2 {
		t.Errorf("Capacity %d (%d families), want the IPv4 one, 5, and two families", info.Capacity, len(info.Capacities))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %s: something walks the /64", d)
	}
}

// An IPv6-only node with maxAddresses 3: its capacity is 3, a request
// for more gets 3 and says why, a named address past the bound is refused
// too, and an IPv4 request is told there is no IPv4 range. A small IPv6
// range used up says so.
func TestIPv6OnlyBounds(t *testing.T) {
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "fd00:6::/64", Gateway: "fd00:6::ffff"}}, MaxAddresses: 3}
	p, err := static.New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	info := p.Info()
	if info.Capacity != 3 || len(info.Capacities) != 1 || info.Capacities[family.V6].Max != 3 {
		t.Fatalf("capacity %d %+v, want 3, IPv6 only", info.Capacity, info.Capacities)
	}
	got, err := assign(t, p, provider.AssignRequest{Count: 5, Family: family.V6})
	if !slices.Equal(got, addrs("fd00:6::1", "fd00:6::2", "fd00:6::3")) || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "maxAddresses (3)") {
		t.Fatalf("Assign of 5 with maxAddresses 3 = %v, %v", got, err)
	}
	if _, err := assign(t, p, provider.AssignRequest{Addresses: addrs("fd00:6::9"), Family: family.V6}); !errors.Is(err, provider.ErrExhausted) {
		t.Errorf("a named address past maxAddresses: %v, want ErrExhausted", err)
	}
	if _, err := assign(t, p, provider.AssignRequest{Count: 1}); !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "provider.static.ranges has no IPv4 range") {
		t.Errorf("an IPv4 request on an IPv6-only node: %v", err)
	}

	small, err := static.New(&static.Config{Ranges: []static.Range{{CIDR: "fd00:7::/125"}}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	got, err = assign(t, small, provider.AssignRequest{Count: 10, Family: family.V6})
	if len(got) != 6 || got[5] != netip.MustParseAddr("fd00:7::7") || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "IPv6 ranges are used up (6 of 6") {
		t.Errorf("a /125 asked for 10: %v, %v; want ::2..::7 and used up", got, err)
	}
}

// The agent starts the provider through its registration: it serves both
// families, and refuses ipFamilies naming one the ranges lack.
func TestRegistrationFamilies(t *testing.T) {
	reg, err := provider.Lookup("static")
	if err != nil {
		t.Fatal(err)
	}
	if !family.Has(reg.Families, family.V4) || !family.Has(reg.Families, family.V6) {
		t.Fatalf("Registration.Families = %v, want both", reg.Families)
	}
	start := func(cfg *static.Config, fams ...family.Family) error {
		cfg.Defaults()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("config: %v", err)
		}
		_, err := reg.New(context.Background(), provider.Node{Name: "n1", StateDir: t.TempDir(), Families: fams}, cfg)
		return err
	}
	v4only := func() *static.Config { return &static.Config{Ranges: []static.Range{{CIDR: "10.0.0.0/24"}}} }
	v6only := func() *static.Config { return &static.Config{Ranges: []static.Range{{CIDR: "fd00::/64"}}} }
	if err := start(v4only(), family.V4, family.V6); err == nil || err.Error() != "ipFamilies names ipv6 but provider.static.ranges has no IPv6 range" {
		t.Errorf("dual-stack on IPv4 ranges: %v", err)
	}
	if err := start(v6only(), family.V4); err == nil || !strings.Contains(err.Error(), "ipFamilies names ipv4 but provider.static.ranges has no IPv4 range") {
		t.Errorf("IPv4 on IPv6 ranges: %v", err)
	}
	for _, fams := range [][]family.Family{{family.V6, family.V4}, {family.V6}, {family.V4}, nil} {
		if err := start(dualRanges(), fams...); err != nil {
			t.Errorf("dual ranges with ipFamilies %v: %v", fams, err)
		}
	}
}

func TestConfigIPv6(t *testing.T) {
	ok := &static.Config{Ranges: []static.Range{
		{CIDR: "fd00:1::/64", Gateway: "fd00:1::fffe", Exclude: []string{"fd00:1::5", "fd00:1::100/120"}},
		{CIDR: "2001:db8::/120"},
		{CIDR: "10.0.0.0/24"},
		{CIDR: "fd00:4::/64", Gateway: "fd00:4::1", NIC: &static.NIC{MAC: "02:00:00:00:00:01", Address: "fd00:4::2"}},
	}}
	ok.Defaults()
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid IPv6 ranges refused: %v", err)
	}
	if ok.MaxAddresses != static.DefaultMaxAddresses {
		t.Errorf("maxAddresses default %d", ok.MaxAddresses)
	}
	bad := &static.Config{Ranges: []static.Range{
		{CIDR: "fd00:1::/48"},
		{CIDR: "fd00:2::1/64"},
		{CIDR: "fd00:3::/64", Gateway: "10.0.0.1", Exclude: []string{"10.0.0.0/24"}},
		{CIDR: "::ffff:10.0.0.0/120"},
	}, MaxAddresses: -1, Blocks: &static.Blocks{}}
	bad.Defaults()
	bad.Ranges = append(bad.Ranges, static.Range{CIDR: "10.1.0.0/24"})
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad IPv6 ranges accepted")
	}
	for _, want := range []string{
		`ranges[0].cidr: "fd00:1::/48" is larger than a /64`,
		`ranges[1].cidr: "fd00:2::1/64" has host bits set (did you mean fd00:2::/64?)`,
		`ranges[2].gateway: "10.0.0.1" is not an address inside fd00:3::/64`,
		`ranges[2].exclude[0]: "10.0.0.0/24" is not of the family of fd00:3::/64 (ipv6)`,
		`ranges[3].cidr: "::ffff:10.0.0.0/120" is an IPv4 range written as IPv6`,
		`maxAddresses: -1 is negative`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

// Blocks mode on IPv6 ranges: addresses from the node's IPv6 blocks in
// order (the range's anycast address and gateway never), another block
// when they are full; the capacity counts other nodes' blocks out in
// closed form, even for /80s of a /64.
func TestBlocksModeIPv6(t *testing.T) {
	src := &grantingSource{pending: []netip.Prefix{netip.MustParsePrefix("fd00:9::/124"), netip.MustParsePrefix("fd00:9::10/124")},
		taken: []netip.Prefix{netip.MustParsePrefix("fd00:9::20/124"), netip.MustParsePrefix("fd00:9::40/123")}}
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "fd00:9::/120", Exclude: []string{"fd00:9::12/127"}}}, Blocks: &static.Blocks{Wait: "50ms"}}
	cfg.Defaults()
	p, err := static.NewInBlocks(cfg, t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	// 256 - anycast - gateway - the /127 excluded, less the other nodes' 16 + 32.
	if c := p.Info().Capacities[family.V6]; c.Max != 254-2-48 || !strings.Contains(c.Reason, "outside other nodes' blocks (2)") {
		t.Errorf("capacity %+v, want %d outside other nodes' blocks", c, 254-2-48)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 20, Family: family.V6})
	var want []netip.Addr
	for i := 2; i < 0x20; i++ {
		if i != 0x12 && i != 0x13 {
			want = append(want, netip.AddrFrom16([16]byte{0xfd, 0, 0, 9, 15: byte(i)}))
		}
	}
	if g := provider.Addresses(got); !slices.Equal(g, want[:20]) || err != nil {
		t.Fatalf("got %v, %v; want %v", g, err, want[:20])
	}
	got, err = p.Assign(context.Background(), provider.AssignRequest{Count: 20, Family: family.V6})
	if g := provider.Addresses(got); !slices.Equal(g, want[20:]) || !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("the rest: %v, %v; want %v and exhausted", g, err, want[20:])
	}

	// A /64 in /80s: the capacity is arithmetic, and capped.
	big := &grantingSource{taken: []netip.Prefix{netip.MustParsePrefix("fd00:a:0:0:1::/80")}}
	cfg = &static.Config{Ranges: []static.Range{{CIDR: "fd00:a::/64"}}, Blocks: &static.Blocks{Wait: "50ms"}, MaxAddresses: 1000}
	cfg.Defaults()
	if p, err = static.NewInBlocks(cfg, t.TempDir(), big); err != nil {
		t.Fatal(err)
	}
	if c := p.Info().Capacities[family.V6]; c.Max != 1000 {
		t.Errorf("a /64 in blocks: capacity %+v, want maxAddresses 1000", c)
	}
}

// IPv6 addresses are probed too (a neighbour solicitation): one a host
// answers for is set aside and said, and the node's own IPv6 address on
// the uplink and a Node's IPv6 address are never handed out.
func TestGuardIPv6ProbedOwnAvoided(t *testing.T) {
	seg := &segment{own: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24"), netip.MustParsePrefix("fd00:5::2/64")},
		holders: map[netip.Addr]string{netip.MustParseAddr("fd00:5::3"): "02:00:00:00:00:03", netip.MustParseAddr("10.0.0.3"): "02:00:00:00:00:04"}}
	p, err := static.New(dualRanges(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var notices []provider.Notice
	p.SetGuard(static.Guard{Segment: seg, Probe: true, Recheck: time.Minute,
		Nodes:  func(context.Context) ([]netip.Addr, error) { return ips("fd00:5::4"), nil },
		Notify: func(n provider.Notice) { notices = append(notices, n) }})
	got, err := assign(t, p, provider.AssignRequest{Count: 2, Family: family.V6})
	if err != nil || !slices.Equal(got, addrs("fd00:5::5", "fd00:5::6")) {
		t.Fatalf("IPv6 Assign = %v, %v; want ::5 and ::6 (::2 the node's, ::3 a host's, ::4 a Node's)", got, err)
	}
	if len(seg.probed) == 0 || !slices.Contains(seg.probed[0], netip.MustParseAddr("fd00:5::3")) {
		t.Errorf("IPv6 addresses probed: %v, want fd00:5::3 among them", seg.probed)
	}
	if len(notices) != 1 || notices[0].Kind != "neighbour_advertisement" || !strings.Contains(notices[0].Message, "02:00:00:00:00:03") {
		t.Errorf("notices %+v, want one neighbour_advertisement naming 02:00:00:00:00:03", notices)
	}
	got, err = assign(t, p, provider.AssignRequest{Count: 1})
	if err != nil || !slices.Equal(got, addrs("10.0.0.4")) {
		t.Errorf("IPv4 Assign = %v, %v (probed %v); want 10.0.0.4, probed past .3", got, err, seg.probed)
	}
}

// A static PodNetwork's room before it serves a pod is its tightest
// family's capacity: an IPv6 /64 counts maxAddresses, not 2^64.
func TestNetworkRoomIPv6(t *testing.T) {
	reg, err := provider.Lookup("static")
	if err != nil {
		t.Fatal(err)
	}
	node := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}}
	node.Defaults()
	for spec, want := range map[string]int{
		`{"ranges":["fd00:30::/64"]}`:                static.DefaultMaxAddresses,
		`{"ranges":["fd00:30::/64","10.30.0.0/29"]}`: 5,
		`{"ranges":["fd00:30::/124"]}`:               14,
	} {
		if n, ok := reg.NetworkRoom(node, []byte(spec), provider.Info{}); !ok || n != want {
			t.Errorf("room of %s = %d %v, want %d", spec, n, ok, want)
		}
	}
}

// Blocks mode on both families: each family's addresses come from the
// node's blocks of that family only, and a family whose blocks are full
// asks for a block of its own family (the IPv4 blocks the node has do not
// count for IPv6, nor the other way round); each family's capacity counts
// only that family's blocks.
func TestBlocksModeDualStack(t *testing.T) {
	src := &grantingSource{pending: []netip.Prefix{
		netip.MustParsePrefix("10.9.0.0/28"), netip.MustParsePrefix("fd00:9::/124"),
		netip.MustParsePrefix("10.9.0.16/28"), netip.MustParsePrefix("fd00:9::10/124")},
		taken: []netip.Prefix{netip.MustParsePrefix("10.9.0.32/28"), netip.MustParsePrefix("fd00:9::20/124")}}
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}, {CIDR: "fd00:9::/120"}}, Blocks: &static.Blocks{Wait: "50ms"}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("dual-stack blocks refused: %v", err)
	}
	p, err := static.NewInBlocks(cfg, t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	take := func(f family.Family, n int) []netip.Addr {
		t.Helper()
		got, err := p.Assign(context.Background(), provider.AssignRequest{Count: n, Family: f})
		if err != nil || len(got) != n {
			t.Fatalf("assign %d %s: %v, %v", n, f, got, err)
		}
		return provider.Addresses(got)
	}
	v4 := take(family.V4, 3)
	if !slices.Equal(v4, addrs("10.9.0.2", "10.9.0.3", "10.9.0.4")) || len(src.Blocks()) != 1 {
		t.Fatalf("IPv4: %v from blocks %v, want .2-.4 of the first IPv4 block alone", v4, src.Blocks())
	}
	v6 := take(family.V6, 15) // fd00:9::2-f fill the first IPv6 block (14), then one of the second
	if v6[0] != netip.MustParseAddr("fd00:9::2") || v6[14] != netip.MustParseAddr("fd00:9::10") {
		t.Fatalf("IPv6: %v, want fd00:9::2 on, across two IPv6 blocks", v6)
	}
	if !slices.Equal(src.Blocks(), []netip.Prefix{netip.MustParsePrefix("10.9.0.0/28"), netip.MustParsePrefix("fd00:9::/124"), netip.MustParsePrefix("fd00:9::10/124")}) {
		t.Fatalf("blocks %v: want the second IPv6 block, and no second IPv4 one", src.Blocks())
	}
	// IPv4 asked for 1 block, IPv6 for 1 then 2: per family, never 3.
	if !slices.Equal(src.wants, []int{1, 1, 2}) {
		t.Errorf("asked for %v blocks, want 1 (IPv4), then 1 and 2 (IPv6)", src.wants)
	}
	caps := p.Info().Capacities
	// 253 usable IPv4 (no network, broadcast or gateway) less one other
	// node's /28; 254 IPv6 (no anycast or gateway) less its /124.
	if caps[family.V4].Max != 253-16 || caps[family.V6].Max != 254-16 || !strings.Contains(caps[family.V6].Reason, "holds 2 IPv6 blocks") {
		t.Errorf("capacities %+v", caps)
	}
}
