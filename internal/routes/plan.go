// Package routes routes a pod subnet of its own through the cloud's
// router: per node block, one extra route on the router (block → the
// node's IP) and one pair (the block's CIDR) on the node's port, so the
// router sends the block to the node and port security lets the node's
// pods answer. A Neutron router holds at most max_routes extra routes (30
// by default) and a port 10 allowed address pairs: the reconciler plans
// within both, never asks for what must fail, and says what a block that
// does not fit waits for and how to make room.
//
// It is vpcni-controller's (the leader's) and knows nothing of
// Kubernetes: the caller hands it the blocks (NodeBlocks with their
// node's address) and publishes what comes back. Nor does it know a
// cloud's API: it reaches the router and the ports through Cloud, which
// each cloud implements (Neutron's is internal/provider/openstack/cluster),
// and its section of the cloud file is Config.
package routes

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Block is one node block as the reconciler sees it.
type Block struct {
	// Name identifies the block to the caller (the NodeBlock's name).
	Name string
	CIDR netip.Prefix
	Node string
	// NodeIP is the node's address of the block's family (on the VM
	// subnet for IPv4; for an IPv6 block, the VM port's IPv6 address): the
	// route's next hop and how its VM port is found. Invalid: unknown (no
	// InternalIP of that family).
	NodeIP netip.Addr
	// NodeGone: the block's node no longer exists. Its route and pair
	// stay until the block is reclaimed (the caller stops handing it in).
	NodeGone bool
	// Created orders who gets the budget: the older block first.
	Created time.Time
}

// State is what became of a block.
type State string

const (
	// Routed: its route is on the router and its pair on the node's port.
	Routed State = "Routed"
	// NoRouteBudget: the router has no room for its route (max_routes).
	NoRouteBudget State = "RouteBudgetExhausted"
	// NoPairBudget: the node's VM port has no room for its pair.
	NoPairBudget State = "AddressPairsExhausted"
	// NoNodeAddress: the node has no address, or no VM port has it.
	NoNodeAddress State = "NodeAddressUnknown"
	// NodeGone: its node is gone; what it had is kept until the block is
	// reclaimed.
	NodeGone State = "NodeGone"
)

// Route is an extra route of the router.
type Route struct {
	Destination netip.Prefix
	NextHop     netip.Addr
}

func (r Route) String() string { return r.Destination.String() + " via " + r.NextHop.String() }

// plan is what one pass decides: which routes go and come, which blocks
// each VM port allows, and each block's state.
type plan struct {
	add, remove []Route
	// pairs: a node's port (by its first address, planInput.port) -> the
	// block CIDRs it must allow (ours only; a port not in the map is left
	// alone).
	pairs  map[netip.Addr][]netip.Prefix
	states map[string]State
	// ours is how many of our routes the router holds after the pass,
	// others how many routes are someone else's.
	ours, others int
}

// planInput is what a pass knows.
type planInput struct {
	blocks []Block
	// routes is the router's whole route list.
	routes []Route
	// limit is max_routes as known (math.MaxInt: not known yet).
	limit int
	// pairRoom: a node's port, by its first address -> how many pairs of
	// ours it may hold (the limit less the pairs of others); an address
	// missing has no port.
	pairRoom map[netip.Addr]int
	// port maps a node address to its port's first address (a dual-stack
	// node's IPv6 address to its IPv4 one: one port, one pair budget for
	// both families' blocks). An address not in it is its port's first.
	port map[netip.Addr]netip.Addr
	// ours says whether a route destination or pair is vpcni's (inside
	// the block ranges).
	ours func(netip.Prefix) bool
}

// makePlan decides a pass. Invariants (property-tested):
//   - routes after the pass never exceed limit, and a route never goes
//     out without its pair, nor a pair without its route, on a port the
//     pass writes;
//   - a block routed before keeps its route while its node and block
//     live (a working route is never traded for a newer block's);
//   - the rest of the budget goes to the oldest blocks first;
//   - a route or pair of ours for a block nobody holds, or pointing at
//     the wrong node, goes; routes and pairs not ours are never touched.
func makePlan(in planInput) plan {
	p := plan{pairs: map[netip.Addr][]netip.Prefix{}, states: map[string]State{}}
	have := map[Route]bool{}
	byDest := map[netip.Prefix]Route{}
	for _, r := range in.routes {
		if !in.ours(r.Destination) {
			p.others++
			continue
		}
		have[r] = true
		byDest[r.Destination] = r
	}
	blocks := slices.Clone(in.blocks)
	slices.SortFunc(blocks, func(a, b Block) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Name, b.Name))
	})
	keep := map[Route]bool{}
	room := map[netip.Addr]int{}
	for ip, n := range in.pairRoom {
		room[ip] = n
	}
	portOf := func(ip netip.Addr) netip.Addr {
		if first, ok := in.port[ip]; ok {
			return first
		}
		return ip
	}
	hasPort := func(ip netip.Addr) bool { _, ok := in.pairRoom[portOf(ip)]; return ok }
	takePair := func(ip netip.Addr, c netip.Prefix) bool {
		ip = portOf(ip)
		if room[ip] <= 0 {
			return false
		}
		room[ip]--
		p.pairs[ip] = append(p.pairs[ip], c)
		return true
	}
	// Blocks of gone nodes keep what they have: the route names the port.
	for _, b := range blocks {
		if !b.NodeGone {
			continue
		}
		p.states[b.Name] = NodeGone
		if r, ok := byDest[b.CIDR]; ok {
			keep[r] = true
			if hasPort(r.NextHop) {
				takePair(r.NextHop, b.CIDR)
			}
		}
	}
	var wanted []Block
	for _, b := range blocks {
		if b.NodeGone {
			continue
		}
		if !b.NodeIP.IsValid() || !hasPort(b.NodeIP) {
			p.states[b.Name] = NoNodeAddress
			continue
		}
		wanted = append(wanted, b)
	}
	// First the blocks routed already, then the new ones while there is room.
	used := p.others + len(keep)
	for _, b := range wanted {
		r := Route{b.CIDR, b.NodeIP}
		if !have[r] {
			continue
		}
		if !takePair(b.NodeIP, b.CIDR) {
			p.states[b.Name] = NoPairBudget
			continue
		}
		keep[r] = true
		used++
		p.states[b.Name] = Routed
	}
	for _, b := range wanted {
		r := Route{b.CIDR, b.NodeIP}
		if have[r] {
			continue
		}
		if used >= in.limit {
			p.states[b.Name] = NoRouteBudget
			continue
		}
		if !takePair(b.NodeIP, b.CIDR) {
			p.states[b.Name] = NoPairBudget
			continue
		}
		keep[r] = true
		used++
		p.add = append(p.add, r)
		p.states[b.Name] = Routed
	}
	for _, r := range in.routes {
		if have[r] && !keep[r] {
			p.remove = append(p.remove, r)
		}
	}
	// A port whose node lost its last block still gets its (now empty) list.
	for ip := range in.pairRoom {
		if _, ok := p.pairs[ip]; !ok {
			p.pairs[ip] = nil
		}
	}
	p.ours = used - p.others
	return p
}

// Shortfall is what the router lacks: how many blocks wait for a route,
// the max_routes that would take them all, and the fix in words.
type Shortfall struct {
	Waiting int
	// Needed is the max_routes every block's route fits in.
	Needed int
	// Bits and BitsV6 are block prefix lengths (larger blocks) of IPv4
	// and IPv6 with which every node fits in the current limit; 0 where
	// the family's size need not change (or no size fits: fewer routes
	// than nodes, counted per family).
	Bits, BitsV6 int
	Fix          string
}

// familyBlocks are one family's routed blocks: how many each node has
// and the longest block prefix among them.
type familyBlocks struct {
	bits    int
	perNode map[string]int
}

// folded is how many routes the family's blocks take as blocks d bits
// larger: a node's blocks merge only where it has more than one.
func (f familyBlocks) folded(d int) int {
	n := 0
	for _, c := range f.perNode {
		n += (c + 1<<d - 1) >> d
	}
	return n
}

// shortfall works out the fix for the blocks left waiting for a route:
// raise max_routes to others+wanted, or use blocks large enough that each
// node's blocks fold into fewer routes. The router's max_routes holds
// both families, so the larger sizes are searched together: each family
// whose nodes hold more than one block grows by the same number of bits
// until all fit. (The NodeBlocks do not merge by themselves: a new block
// size applies to blocks assigned after it.)
func shortfall(in planInput, p plan) Shortfall {
	var s Shortfall
	fams := map[bool]*familyBlocks{} // by IPv6
	wanted := 0
	for _, b := range in.blocks {
		if b.NodeGone || p.states[b.Name] == NoNodeAddress {
			continue
		}
		if p.states[b.Name] == NoRouteBudget {
			s.Waiting++
		}
		v6 := b.CIDR.Addr().Is6()
		f := fams[v6]
		if f == nil {
			f = &familyBlocks{perNode: map[string]int{}}
			fams[v6] = f
		}
		f.perNode[b.Node]++
		f.bits = max(f.bits, b.CIDR.Bits())
		wanted++
	}
	if s.Waiting == 0 {
		return s
	}
	gone := 0
	for _, st := range p.states {
		if st == NodeGone {
			gone++
		}
	}
	s.Needed = p.others + gone + wanted
	budget := in.limit - p.others - gone
	// Every node needs a route per family whatever the size; a family
	// grows only where some node holds several of its blocks.
	least := 0
	nodes := map[string]bool{}
	grows := map[bool]bool{}
	for v6, f := range fams {
		least += len(f.perNode)
		for n, c := range f.perNode {
			nodes[n] = true
			grows[v6] = grows[v6] || c > 1
		}
	}
	for d := 1; d <= 16 && budget >= least; d++ {
		n := 0
		for v6, f := range fams {
			if grows[v6] {
				n += f.folded(d)
			} else {
				n += f.folded(0)
			}
		}
		if n > budget {
			continue
		}
		if f := fams[false]; f != nil && grows[false] {
			s.Bits = max(f.bits-d, 1)
		}
		if f := fams[true]; f != nil && grows[true] {
			s.BitsV6 = max(f.bits-d, 1)
		}
		break
	}
	limit := "unknown"
	if in.limit != math.MaxInt {
		limit = fmt.Sprint(in.limit)
	}
	s.Fix = fmt.Sprintf("raise max_routes to %d (neutron.conf; now %s, %d of them others')", s.Needed, limit, p.others)
	// The family is named only when the router holds both.
	v4, v6, own := "", "IPv6 ", "a route of its own"
	if len(fams) == 2 {
		v4, own = "IPv4 ", "a route of its own for each family"
	}
	var sizes []string
	if s.Bits > 0 {
		sizes = append(sizes, fmt.Sprintf("%sblocks of /%d (-block-size %d)", v4, s.Bits, s.Bits))
	}
	if s.BitsV6 > 0 {
		sizes = append(sizes, fmt.Sprintf("%sblocks of /%d (-block-size-v6 %d)", v6, s.BitsV6, s.BitsV6))
	}
	if len(sizes) > 0 {
		s.Fix += ", or use " + strings.Join(sizes, " and ")
	} else {
		s.Fix += fmt.Sprintf(": each of the %d nodes needs %s, so no block size fits them in %s", len(nodes), own, limit)
	}
	return s
}
