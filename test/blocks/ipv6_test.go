package blocks

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
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
	// An agent of an earlier version asks for IPv6 blocks under
	// vpcni.io/blocks-wanted: with IPv6 ranges alone, that count is
	// IPv6's, and the node gets its block.
	old := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ipv6-old", Annotations: map[string]string{v1alpha1.AnnotationBlocksWanted: "1"}}}
	if _, err := clientset(t).CoreV1().Nodes().Create(context.Background(), old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "an IPv6 block for the node that asks as agents before dual-stack blocks did", func() error {
		if got, _ := nodeBlocks(t); len(got[old.Name]) != 1 || !got[old.Name][0].Addr().Is6() {
			return fmt.Errorf("its blocks: %v", got[old.Name])
		}
		return nil
	})
}

// Dual-stack per-node blocks end to end: one assigner cuts IPv4 /28s and
// IPv6 /120s (the controller's -block-ranges of both families, each with
// its own size); two dual-stack agents each get one block of each family,
// disjoint from the other's, and take each family's addresses from their
// blocks of that family only; one that fills its IPv4 block gets a second
// IPv4 block and no IPv6 one (each family asked for under its own Node
// annotation); each family's capacity counts that family's blocks.
func TestDualStackBlocks(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the assigners stopped
	const v4, v6 = "10.32.0.0/24", "fd00:32::/112"
	stale := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dual-stale", Annotations: map[string]string{v1alpha1.AnnotationBlocksWanted: "3"}}}
	if _, err := clientset(t).CoreV1().Nodes().Create(context.Background(), stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	assignerOf(t, time.Minute, blocksOf(t, v4, 28), blocksOf(t, v6, 120))
	var agents []*agent
	for i := range 2 {
		node := fmt.Sprintf("dual-%d", i+1)
		createNode(t, node)
		agents = append(agents, newAgent(t, node, v4+","+v6, "15s"))
	}
	owner := map[netip.Addr]string{}
	take := func(a *agent, f family.Family, n int) {
		t.Helper()
		leases, err := a.p.Assign(context.Background(), provider.AssignRequest{Count: n, Family: f})
		if err != nil || len(leases) != n {
			t.Fatalf("%s: assign %d %s: %d, %v", a.node, n, f, len(leases), err)
		}
		for _, addr := range provider.Addresses(leases) {
			if family.Of(addr) != f {
				t.Fatalf("%s: asked for %s, got %s", a.node, f, addr)
			}
			if o, dup := owner[addr]; dup {
				t.Fatalf("%s given to %s and %s", addr, o, a.node)
			}
			owner[addr] = a.node
		}
	}
	for _, a := range agents {
		take(a, family.V4, 5)
		take(a, family.V6, 5)
	}
	perFamily := func(blocks []netip.Prefix) (n4, n6 int) {
		for _, b := range blocks {
			if b.Addr().Is4() {
				n4++
			} else {
				n6++
			}
		}
		return n4, n6
	}
	byNode, items := nodeBlocks(t)
	for _, a := range agents {
		if n4, n6 := perFamily(byNode[a.node]); n4 != 1 || n6 != 1 {
			t.Fatalf("%s has blocks %v: want one of each family", a.node, byNode[a.node])
		}
	}
	disjoint(t, items)
	// An IPv4 /28 holds 14 addresses past the range's network address and
	// gateway, 16 further on: 12 more IPv4 addresses need a second block.
	first := agents[0]
	if !inBlocks(byNode[first.node], netip.MustParseAddr("10.32.0.2")) {
		first = agents[1]
	}
	take(first, family.V4, 12)
	byNode, items = nodeBlocks(t)
	if n4, n6 := perFamily(byNode[first.node]); n4 != 2 || n6 != 1 || len(items) != 5 { // none for dual-stale
		t.Fatalf("after %s filled its IPv4 block: %v; want it with 2 IPv4 blocks and still 1 IPv6 block, 5 in all", first.node, byNode)
	}
	disjoint(t, items)
	node, err := clientset(t).CoreV1().Nodes().Get(context.Background(), first.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Annotations; got[v1alpha1.AnnotationBlocksWantedIPv4] != "2" || got[v1alpha1.AnnotationBlocksWantedIPv6] != "1" || got[v1alpha1.AnnotationBlocksWanted] != "" {
		t.Errorf("%s asks %v: want 2 IPv4 blocks and 1 IPv6 block, and no count of one family's blocks", first.node, got)
	}
	// A count of one family's blocks left from when the cluster was IPv6
	// only is no request of a dual-stack controller: no IPv4 block for it.
	if got := byNode[stale.Name]; len(got) != 0 {
		t.Errorf("node %s with %s %q left from before got blocks %v", stale.Name, v1alpha1.AnnotationBlocksWanted, stale.Annotations[v1alpha1.AnnotationBlocksWanted], got)
	}
	for _, a := range agents {
		for _, addr := range a.held(t) {
			if !inBlocks(byNode[a.node], addr) {
				t.Errorf("%s holds %s, outside its blocks %v", a.node, addr, byNode[a.node])
			}
		}
	}
	// IPv4: 253 usable (no network, broadcast, gateway) less the usable
	// addresses of the other node's IPv4 blocks; IPv6: 65534 (no anycast,
	// gateway) less those of its /120. The first blocks hold the range's
	// network address (anycast) and gateway: 14 and 254 usable.
	other := agents[0]
	if other == first {
		other = agents[1]
	}
	waitFor(t, 10*time.Second, "each family's capacity leaving out the other node's blocks of that family", func() error {
		for a, want := range map[*agent][2]int{first: {253 - 16, 65534 - 256}, other: {253 - 14 - 16, 65534 - 254}} {
			caps := a.p.Info().Capacities
			if caps[family.V4].Max != want[0] || caps[family.V6].Max != want[1] {
				return fmt.Errorf("%s: capacities %d/%d, want %d/%d (%s; %s)", a.node, caps[family.V4].Max, caps[family.V6].Max, want[0], want[1],
					caps[family.V4].Reason, caps[family.V6].Reason)
			}
		}
		return nil
	})
}
