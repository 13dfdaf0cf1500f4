package blocks

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// IPv6 per-node blocks end to end: vpcni-controller's assigner cuts /120s
// of an IPv6 /112, the API server takes NodeBlocks named after IPv6
// blocks (':' as '-'), two IPv6-only agents get disjoint blocks and take
// addresses only from their own, one that fills its block (the range's
// Subnet-Router anycast address and gateway are in it) gets a second,
// and each advertises the range's usable addresses less the other's
// blocks.
func TestIPv6Blocks(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the assigners stopped
	const rng = "fd00:30::/112"
	assigner(t, rng, 120, time.Minute)
	var agents []*agent
	for i := range 2 {
		node := fmt.Sprintf("ipv6-%d", i+1)
		createNode(t, node)
		agents = append(agents, newAgent(t, node, rng, "15s"))
	}
	assign := func(a *agent, n int) []netip.Addr {
		t.Helper()
		leases, err := a.p.Assign(context.Background(), provider.AssignRequest{Count: n, Family: family.V6})
		if err != nil || len(leases) != n {
			t.Fatalf("%s: assign %d IPv6: %d, %v", a.node, n, len(leases), err)
		}
		for _, l := range leases {
			if l.Prefix != netip.MustParsePrefix(rng) || l.Gateway != netip.MustParseAddr("fd00:30::1") {
				t.Errorf("%s: lease %+v does not name the range and its gateway", a.node, l)
			}
		}
		return provider.Addresses(leases)
	}
	owner := map[netip.Addr]string{}
	take := func(a *agent, n int) {
		for _, addr := range assign(a, n) {
			if o, dup := owner[addr]; dup {
				t.Fatalf("%s given to %s and %s", addr, o, a.node)
			}
			owner[addr] = a.node
		}
	}
	take(agents[0], 10)
	take(agents[1], 10)
	byNode, items := nodeBlocks(t) // checks each name is its block's
	if len(items) != 2 {
		t.Fatalf("%d NodeBlocks, want 2: %v", len(items), byNode)
	}
	disjoint(t, items)
	t.Logf("NodeBlocks %s, %s", items[0].Name, items[1].Name)
	// The first block holds 254 pod addresses: 250 more for the node that
	// has it need a second block.
	first := agents[0]
	if !inBlocks(byNode[first.node], netip.MustParseAddr("fd00:30::2")) {
		first = agents[1]
	}
	take(first, 250)
	byNode, items = nodeBlocks(t)
	if len(items) != 3 || len(byNode[first.node]) != 2 {
		t.Fatalf("after %s filled its block: %v, want 3 blocks, 2 of them its", first.node, byNode)
	}
	disjoint(t, items)
	for _, a := range agents {
		for _, addr := range a.held(t) {
			if !inBlocks(byNode[a.node], addr) || !addr.Is6() {
				t.Errorf("%s holds %s, outside its blocks %v", a.node, addr, byNode[a.node])
			}
			if addr == netip.MustParseAddr("fd00:30::") || addr == netip.MustParseAddr("fd00:30::1") {
				t.Errorf("%s holds the range's anycast address or gateway %s", a.node, addr)
			}
		}
	}
	// 65536 - anycast - gateway usable, less the other node's blocks.
	other := agents[0]
	if other == first {
		other = agents[1]
	}
	waitFor(t, 10*time.Second, "IPv6 capacities that leave out the other node's blocks", func() error {
		for a, want := range map[*agent]int{first: 65534 - 256, other: 65534 - 254 - 256} {
			if got := a.p.Info().Capacities[family.V6]; got.Max != want {
				return fmt.Errorf("%s: IPv6 capacity %d, want %d (%s)", a.node, got.Max, want, got.Reason)
			}
		}
		return nil
	})
}
