package routes

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vpcni/vpcni/internal/ipam"
)

// The plan's invariants over random routers, blocks and ports: the budget
// is never exceeded, a block is Routed exactly when its route is kept or
// added and its pair planned, a routed block keeps its route, routes of
// others are never removed, our stale routes always are.
func TestPlanProperties(t *testing.T) {
	rng := netip.MustParsePrefix("10.91.0.0/16")
	ours := func(p netip.Prefix) bool { return rng.Contains(p.Addr()) && p.Bits() >= 16 }
	rapid.Check(t, func(t *rapid.T) {
		nodes := rapid.IntRange(1, 12).Draw(t, "nodes")
		ips := make([]netip.Addr, nodes)
		room := map[netip.Addr]int{}
		for i := range ips {
			ips[i] = netip.AddrFrom4([4]byte{10, 90, 0, byte(11 + i)})
			if rapid.IntRange(0, 9).Draw(t, "hasPort") > 0 {
				room[ips[i]] = rapid.IntRange(0, 4).Draw(t, "room")
			}
		}
		var blocks []Block
		var routes []Route
		nb := rapid.IntRange(0, 40).Draw(t, "blocks")
		for i := range nb {
			c := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 91, byte(i), 0}), 24)
			n := rapid.IntRange(0, nodes-1).Draw(t, "node")
			b := Block{Name: fmt.Sprint(i), CIDR: c, Node: fmt.Sprint(n), NodeIP: ips[n], Created: time.Unix(int64(rapid.IntRange(0, 5).Draw(t, "age")), 0)}
			b.NodeGone = rapid.IntRange(0, 9).Draw(t, "gone") == 0
			blocks = append(blocks, b)
			switch rapid.IntRange(0, 3).Draw(t, "routed") {
			case 1:
				routes = append(routes, Route{c, b.NodeIP})
			case 2: // pointing at the wrong node
				routes = append(routes, Route{c, ips[rapid.IntRange(0, nodes-1).Draw(t, "wrong")]})
			}
		}
		for i := range rapid.IntRange(0, 5).Draw(t, "stale") {
			routes = append(routes, Route{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 91, byte(200 + i), 0}), 24), ips[0]})
		}
		others := rapid.IntRange(0, 5).Draw(t, "others")
		for i := range others {
			routes = append(routes, Route{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24), ips[0]})
		}
		limit := rapid.IntRange(others, 50).Draw(t, "limit")
		in := planInput{blocks: blocks, routes: routes, limit: limit, pairRoom: room, ours: ours}
		p := makePlan(in)

		after := slices.DeleteFunc(slices.Clone(routes), func(r Route) bool { return slices.Contains(p.remove, r) })
		after = append(after, p.add...)
		if len(after) > limit && len(p.add) > 0 {
			t.Fatalf("%d routes after the pass, limit %d", len(after), limit)
		}
		for _, r := range p.remove {
			if !ours(r.Destination) {
				t.Fatalf("removed a route of others: %v", r)
			}
		}
		for _, r := range routes {
			if ours(r.Destination) && !slices.ContainsFunc(blocks, func(b Block) bool { return b.CIDR == r.Destination }) && !slices.Contains(p.remove, r) {
				t.Fatalf("stale route kept: %v", r)
			}
		}
		for _, b := range blocks {
			r := Route{b.CIDR, b.NodeIP}
			routed := slices.Contains(after, r)
			paired := slices.Contains(p.pairs[b.NodeIP], b.CIDR)
			st := p.states[b.Name]
			if b.NodeGone {
				if st != NodeGone {
					t.Fatalf("gone node's block %s: %s", b.Name, st)
				}
				continue
			}
			if (st == Routed) != (routed && paired) {
				t.Fatalf("block %s: state %s, route %v, pair %v", b.Name, st, routed, paired)
			}
			if routed != paired {
				t.Fatalf("block %s half planned: route %v, pair %v", b.Name, routed, paired)
			}
			if slices.Contains(routes, r) && st != Routed && st != NoPairBudget && st != NoNodeAddress {
				t.Fatalf("block %s lost its route: %s", b.Name, st)
			}
		}
		for ip, ps := range p.pairs {
			if len(ps) > room[ip] {
				t.Fatalf("port of %s gets %d pairs, room %d", ip, len(ps), room[ip])
			}
		}
	})
}

// The fix names the block size that folds each node's blocks into the
// budget when one exists, and says so when none can.
func TestShortfallFix(t *testing.T) {
	ours := func(p netip.Prefix) bool { return netip.MustParsePrefix("10.91.0.0/16").Contains(p.Addr()) }
	var blocks []Block
	room := map[netip.Addr]int{}
	block := netip.MustParsePrefix("10.91.0.0/26")
	for n := range 10 {
		ip := netip.AddrFrom4([4]byte{10, 90, 0, byte(11 + n)})
		room[ip] = 10
		for range 4 {
			blocks = append(blocks, Block{Name: block.String(), CIDR: block, Node: ip.String(), NodeIP: ip})
			block = nextBlock(block)
		}
	}
	in := planInput{blocks: blocks, limit: 30, pairRoom: room, ours: ours}
	s := shortfall(in, makePlan(in))
	if s.Waiting != 10 || s.Needed != 40 || s.Bits != 25 || !strings.Contains(s.Fix, "use blocks of /25") {
		t.Fatalf("%+v", s)
	}
	in.limit = 8 // fewer routes than nodes
	s = shortfall(in, makePlan(in))
	if s.Bits != 0 || !strings.Contains(s.Fix, "no block size fits them") {
		t.Fatalf("%+v", s)
	}
}

// On a dual-stack router the budget holds both families: the fix grows
// only the family whose nodes hold several blocks, names each family's
// own flag, and counts a route per node and family as the least.
func TestShortfallFixDualStack(t *testing.T) {
	rng4, rng6 := netip.MustParsePrefix("10.91.0.0/16"), netip.MustParsePrefix("fd00:91::/64")
	ours := func(p netip.Prefix) bool { return rng4.Contains(p.Addr()) || rng6.Contains(p.Addr()) }
	input := func(per6 int) planInput {
		var blocks []Block
		room := map[netip.Addr]int{}
		port := map[netip.Addr]netip.Addr{}
		b4, b6 := firstBlocks(t, rng4, 26, 40), firstBlocks(t, rng6, 80, 10*per6)
		for n := range 10 {
			ip4 := netip.AddrFrom4([4]byte{10, 90, 0, byte(11 + n)})
			ip6 := netip.MustParseAddr(fmt.Sprintf("fd00:90::%d", 11+n))
			room[ip4], port[ip6] = 10, ip4
			node := fmt.Sprint("n", n)
			for _, b := range b4[4*n : 4*n+4] {
				blocks = append(blocks, Block{Name: b.String(), CIDR: b, Node: node, NodeIP: ip4})
			}
			for _, b := range b6[per6*n : per6*n+per6] {
				blocks = append(blocks, Block{Name: b.String(), CIDR: b, Node: node, NodeIP: ip6})
			}
		}
		return planInput{blocks: blocks, limit: 30, pairRoom: room, port: port, ours: ours}
	}
	// 40 IPv4 blocks and 10 IPv6 ones in 30 routes: /25 folds the IPv4
	// ones to 20, the IPv6 size stays.
	in := input(1)
	s := shortfall(in, makePlan(in))
	if s.Needed != 50 || s.Bits != 25 || s.BitsV6 != 0 || !strings.HasSuffix(s.Fix, ", or use IPv4 blocks of /25 (-block-size 25)") {
		t.Fatalf("one IPv6 block a node: %+v", s)
	}
	// Two IPv6 blocks a node too, in 20 routes: both families grow by two bits.
	in = input(2)
	in.limit = 20
	s = shortfall(in, makePlan(in))
	if s.Needed != 60 || s.Bits != 24 || s.BitsV6 != 78 || !strings.HasSuffix(s.Fix, "IPv4 blocks of /24 (-block-size 24) and IPv6 blocks of /78 (-block-size-v6 78)") {
		t.Fatalf("two IPv6 blocks a node: %+v", s)
	}
	// 19 routes for 10 nodes of two families: nothing fits.
	in.limit = 19
	s = shortfall(in, makePlan(in))
	if s.Bits != 0 || s.BitsV6 != 0 || !strings.Contains(s.Fix, "each of the 10 nodes needs a route of its own for each family") {
		t.Fatalf("fewer routes than nodes and families: %+v", s)
	}
}

// firstBlocks are the first n blocks of /bits in rng, as the controller
// cuts them.
func firstBlocks(t *testing.T, rng netip.Prefix, bits, n int) []netip.Prefix {
	t.Helper()
	bs, err := ipam.NewBlocks([]netip.Prefix{rng}, bits)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for p := range bs.All {
		if len(out) == n {
			break
		}
		out = append(out, p)
	}
	return out
}

func nextBlock(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += 1 << (32 - p.Bits())
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), p.Bits())
}

// A dual-stack node: its IPv4 block routes via its IPv4 address and its
// IPv6 block via its IPv6 one, and both pairs go on its one port, which
// has one pair budget for both families (planned under its first
// address): with room for one pair, the older block gets it and the
// other waits for pair room.
func TestPlanDualStackNodeSharesItsPortsPairs(t *testing.T) {
	rng4, rng6 := netip.MustParsePrefix("10.91.0.0/16"), netip.MustParsePrefix("fd00:91::/64")
	ours := func(p netip.Prefix) bool {
		return rng4.Contains(p.Addr()) && p.Bits() >= 16 || rng6.Contains(p.Addr()) && p.Bits() >= 64
	}
	ip4, ip6 := netip.MustParseAddr("10.90.0.11"), netip.MustParseAddr("fd00:90::11")
	b4 := Block{Name: "v4", CIDR: netip.MustParsePrefix("10.91.0.0/26"), Node: "n1", NodeIP: ip4, Created: time.Unix(1, 0)}
	b6 := Block{Name: "v6", CIDR: netip.MustParsePrefix("fd00:91::/80"), Node: "n1", NodeIP: ip6, Created: time.Unix(2, 0)}
	in := planInput{blocks: []Block{b6, b4}, limit: 30, ours: ours,
		pairRoom: map[netip.Addr]int{ip4: 2}, port: map[netip.Addr]netip.Addr{ip6: ip4}}
	p := makePlan(in)
	if !slices.Equal(p.add, []Route{{b4.CIDR, ip4}, {b6.CIDR, ip6}}) {
		t.Errorf("routes added %v: want each block via the node's address of its family", p.add)
	}
	if len(p.pairs) != 1 || !slices.Equal(p.pairs[ip4], []netip.Prefix{b4.CIDR, b6.CIDR}) {
		t.Errorf("pairs %v: want both blocks on the one port (under %s)", p.pairs, ip4)
	}
	in.pairRoom[ip4] = 1
	p = makePlan(in)
	if p.states["v4"] != Routed || p.states["v6"] != NoPairBudget || !slices.Equal(p.add, []Route{{b4.CIDR, ip4}}) {
		t.Errorf("one pair of room: states %v, routes %v; want the older (IPv4) block routed and the IPv6 one waiting for pair room", p.states, p.add)
	}
	// Without the port's alias the IPv6 address has no port.
	in.port = nil
	if p = makePlan(in); p.states["v6"] != NoNodeAddress {
		t.Errorf("an address no port has: %v", p.states)
	}
}
