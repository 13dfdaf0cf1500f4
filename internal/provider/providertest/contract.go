// Package providertest is the contract every cloud provider passes, run
// against a real endpoint (neutron-server) and, later, the lab's. An
// endpoint plugs in through Endpoint; the tests only use provider.Provider
// and read the truth back from the endpoint itself.
package providertest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// Endpoint is the cloud under test.
type Endpoint interface {
	// NewSubnet makes a network and subnet for one test; pool is the
	// allocation pool's size (the gateway is the subnet's first address):
	// how many addresses are free for nodes and pods, from the second
	// host address up (a cloud that reserves more, as EC2 reserves .1-.3,
	// starts after those and keeps pool free all the same).
	NewSubnet(t *testing.T, cidr string, pool int) Subnet
	// NewNode makes a VM port with nodeIP on the subnet and a provider for
	// it, as an agent on that node would build it.
	NewNode(t *testing.T, sn Subnet, nodeIP netip.Addr) Node
}

// Subnet is a test subnet.
type Subnet struct {
	ID      string
	CIDR    netip.Prefix
	Gateway netip.Addr
}

// Node is one VM port and the ways to look at it.
type Node struct {
	Provider provider.Provider
	// PortID is the port the node's leases must name ("" : not checked).
	PortID string
	// Reopen builds a new provider for the same port (an agent restart).
	Reopen func(t *testing.T) provider.Provider
	// PortIPs reads from the endpoint every address the port holds: its
	// fixed IPs and its allowed address pairs.
	PortIPs func(t *testing.T) []netip.Addr
	// AddByHand puts an address on the port the way a person or another
	// tool would (read, modify, write with If-Match, retry on 412).
	AddByHand func(t *testing.T, ip netip.Addr)
	// Attached reads from the compute API the NICs the VM has, by port ID
	// (NIC-attaching endpoints only).
	Attached func(t *testing.T) map[string]AttachedNIC
	// Unattached lists the ports on the node's network that are attached
	// to nothing (a leak check; NIC-attaching endpoints only).
	Unattached func(t *testing.T) []string
	// BatchCall is the key of Info().Calls that counts the provider's
	// writes of addresses ("" : "PUT", Neutron's port update).
	BatchCall string
}

// Lacks names what an endpoint does not do as the cloud it stands in for,
// each with why (empty: it does). A contract test that needs it does not
// run against that endpoint and says why; the endpoint that does it all
// (the lab's) runs every test.
type Lacks struct {
	// Exhaustion: the endpoint never runs out of addresses.
	Exhaustion string
	// UniqueAddresses: the endpoint may give one address to two callers
	// or come back with fewer than asked.
	UniqueAddresses string
	// TakenCheck: the endpoint gives an address another port holds to
	// whoever names it.
	TakenCheck string
	// ExactAnswers: the endpoint's answer to a write lists more than the
	// write added, so a concurrent outside write cannot be told apart.
	ExactAnswers string
}

// need skips a test the endpoint cannot run, loudly, with the reason.
func need(t *testing.T, what, lacking string) {
	t.Helper()
	if lacking != "" {
		t.Skipf("vpcni-test: NOT RUN against this endpoint, which lacks %s: %s", what, lacking)
	}
}

// Run runs the whole contract.
func Run(t *testing.T, ep Endpoint) { RunLacking(t, ep, Lacks{}) }

// RunLacking runs the contract against an endpoint that lacks what l
// names: the tests that need it say so and do not run.
func RunLacking(t *testing.T, ep Endpoint, l Lacks) {
	t.Run("AssignReleaseOne", func(t *testing.T) { t.Parallel(); assignReleaseOne(t, ep) })
	t.Run("AssignManyInOneCall", func(t *testing.T) { t.Parallel(); assignMany(t, ep, l) })
	t.Run("ExplicitAddresses", func(t *testing.T) { t.Parallel(); explicit(t, ep, l) })
	t.Run("TwoNodesConcurrently", func(t *testing.T) {
		t.Parallel()
		need(t, "unique addresses", l.UniqueAddresses)
		twoNodes(t, ep)
	})
	t.Run("OutsideWriter", func(t *testing.T) {
		t.Parallel()
		need(t, "exact answers to writes", l.ExactAnswers)
		outsideWriter(t, ep)
	})
	t.Run("Exhaustion", func(t *testing.T) {
		t.Parallel()
		need(t, "exhaustion", l.Exhaustion)
		exhaustion(t, ep)
	})
	t.Run("SeesAddressesOthersGaveBack", func(t *testing.T) {
		t.Parallel()
		need(t, "exhaustion", l.Exhaustion)
		othersGaveBack(t, ep)
	})
	t.Run("RestartAndOwnership", func(t *testing.T) { t.Parallel(); restartOwnership(t, ep) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// netN gives each test its own subnet so they can run in parallel.
var (
	netMu sync.Mutex
	netN  = 0
)

func nextCIDR(bits int) string {
	netMu.Lock()
	defer netMu.Unlock()
	netN++
	return fmt.Sprintf("10.%d.%d.0/%d", 200+netN/200, netN%200, bits)
}

func at(sn Subnet, last byte) netip.Addr {
	b := sn.CIDR.Addr().As4()
	b[3] = last
	return netip.AddrFrom4(b)
}

func sorted(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}

// without the node's own address.
func podIPs(t *testing.T, n Node, nodeIP netip.Addr) []netip.Addr {
	return sorted(slices.DeleteFunc(n.PortIPs(t), func(a netip.Addr) bool { return a == nodeIP }))
}

func assignReleaseOne(t *testing.T, ep Endpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNode(t, sn, nodeIP)
	got, err := assign(t, sn, n, provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("Assign(1) = %v, %v", got, err)
	}
	a := got[0]
	if !sn.CIDR.Contains(a) || a == sn.Gateway || a == nodeIP {
		t.Fatalf("assigned %s: not a free address of %s", a, sn.CIDR)
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, []netip.Addr{a}) {
		t.Fatalf("port holds %v, want %s", on, a)
	}
	h, err := held(t, sn, n)
	if err != nil || !slices.Equal(h, []netip.Addr{a}) {
		t.Fatalf("Held = %v, %v; want %s", h, err, a)
	}
	if err := n.Provider.Release(ctx(t), []netip.Addr{a}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if on := podIPs(t, n, nodeIP); len(on) != 0 {
		t.Fatalf("port still holds %v after Release", on)
	}
	if h, _ := held(t, sn, n); len(h) != 0 {
		t.Fatalf("Held after Release = %v", h)
	}
	// Releasing what the node does not hold is not an error.
	if err := n.Provider.Release(ctx(t), []netip.Addr{a}); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

// totalCalls is how many cloud calls of method the provider made (-1: it
// does not count them).
func totalCalls(p provider.Provider, method string) int64 {
	if c := p.Info().Calls; c != nil {
		return c[method]
	}
	return -1
}

// assign asks the node's provider for addresses; every lease must say
// where its address lives.
func assign(t *testing.T, sn Subnet, n Node, req provider.AssignRequest) ([]netip.Addr, error) {
	t.Helper()
	got, err := n.Provider.Assign(ctx(t), req)
	return leased(t, sn, n, got), err
}

// held lists what the node's provider holds; every lease must say where
// its address lives.
func held(t *testing.T, sn Subnet, n Node) ([]netip.Addr, error) {
	t.Helper()
	got, err := n.Provider.Held(ctx(t))
	return leased(t, sn, n, got), err
}

// leased checks that each lease names the subnet's prefix and gateway and
// the node's port, and returns the addresses.
func leased(t *testing.T, sn Subnet, n Node, leases []alloc.Lease) []netip.Addr {
	t.Helper()
	out := make([]netip.Addr, len(leases))
	for i, l := range leases {
		if l.Prefix != sn.CIDR || l.Gateway != sn.Gateway || n.PortID != "" && l.Interface != n.PortID {
			t.Errorf("lease %+v: want prefix %s, gateway %s, interface %q", l, sn.CIDR, sn.Gateway, n.PortID)
		}
		out[i] = l.Address
	}
	return out
}

func assignMany(t *testing.T, ep Endpoint, l Lacks) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNode(t, sn, nodeIP)
	batch := n.BatchCall
	if batch == "" {
		batch = "PUT"
	}
	puts := totalCalls(n.Provider, batch)
	got, err := assign(t, sn, n, provider.AssignRequest{Count: 8})
	if err != nil || len(got) != 8 {
		t.Fatalf("Assign(8) = %v, %v", got, err)
	}
	switch {
	case l.UniqueAddresses != "":
		// Asking again for what came back short or doubled is right.
		t.Logf("vpcni-test: the one-batch check is NOT RUN against this endpoint, which lacks unique addresses: %s", l.UniqueAddresses)
	case puts >= 0:
		if d := totalCalls(n.Provider, batch) - puts; d != 1 {
			t.Errorf("8 addresses took %d %s calls, want 1 (one batch)", d, batch)
		}
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, sorted(got)) {
		t.Fatalf("port holds %v, Assign said %v", on, got)
	}
	if err := n.Provider.Release(ctx(t), got[:5]); err != nil {
		t.Fatal(err)
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, sorted(got[5:])) {
		t.Fatalf("after releasing 5 the port holds %v, want %v", on, sorted(got[5:]))
	}
}

func explicit(t *testing.T, ep Endpoint, l Lacks) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	a, b := ep.NewNode(t, sn, at(sn, 10)), ep.NewNode(t, sn, at(sn, 11))
	want := at(sn, 77)
	got, err := assign(t, sn, a, provider.AssignRequest{Addresses: []netip.Addr{want}})
	if err != nil || !slices.Equal(got, []netip.Addr{want}) {
		t.Fatalf("Assign(%s) = %v, %v", want, got, err)
	}
	// Asking again for an address the node holds is idempotent.
	if got, err := assign(t, sn, a, provider.AssignRequest{Addresses: []netip.Addr{want}}); err != nil || !slices.Equal(got, []netip.Addr{want}) {
		t.Fatalf("repeated Assign(%s) = %v, %v", want, got, err)
	}
	need(t, "a check that an address is taken", l.TakenCheck)
	got, err = assign(t, sn, b, provider.AssignRequest{Addresses: []netip.Addr{want}, Count: 1})
	if !errors.Is(err, provider.ErrTaken) {
		t.Fatalf("another node asking for %s: %v, want ErrTaken", want, err)
	}
	if len(got) != 1 || got[0] == want {
		t.Fatalf("the count part of the request should still succeed: %v", got)
	}
}

func twoNodes(t *testing.T, ep Endpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodes := []Node{ep.NewNode(t, sn, at(sn, 10)), ep.NewNode(t, sn, at(sn, 11))}
	var wg sync.WaitGroup
	results := make([][]netip.Addr, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			// Two callers per node and two nodes at once (8 addresses a
			// node: within even address-pairs mode's 10).
			for range 2 {
				got, err := assign(t, sn, nodes[i%2], provider.AssignRequest{Count: 2})
				results[i] = append(results[i], got...)
				errs[i] = errors.Join(errs[i], err)
			}
		})
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i := range 4 {
		if errs[i] != nil {
			t.Errorf("caller %d: %v", i, errs[i])
		}
		for _, a := range results[i] {
			if j, dup := seen[a]; dup {
				t.Fatalf("%s was given to callers %d and %d", a, j, i)
			}
			seen[a] = i
		}
	}
	for k, n := range nodes {
		var want []netip.Addr
		for i := k; i < 4; i += 2 {
			want = append(want, results[i]...)
		}
		if on := podIPs(t, n, at(sn, byte(10+k))); !slices.Equal(on, sorted(want)) {
			t.Errorf("node %d port holds %v, its callers were told %v", k, on, sorted(want))
		}
	}
	if len(seen) != 4*2*2 {
		t.Errorf("%d distinct addresses, want %d", len(seen), 4*2*2)
	}
}

func outsideWriter(t *testing.T, ep Endpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNode(t, sn, nodeIP)
	var wg sync.WaitGroup
	var mine []netip.Addr
	var assignErr error
	wg.Go(func() {
		for range 3 {
			got, err := assign(t, sn, n, provider.AssignRequest{Count: 2})
			mine = append(mine, got...)
			assignErr = errors.Join(assignErr, err)
		}
	})
	hand := []netip.Addr{at(sn, 201), at(sn, 202), at(sn, 203)}
	wg.Go(func() {
		for _, h := range hand {
			n.AddByHand(t, h)
		}
	})
	wg.Wait()
	if assignErr != nil {
		t.Fatal(assignErr)
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, sorted(append(slices.Clone(mine), hand...))) {
		t.Fatalf("lost update: port holds %v, want vpcni's %v and the hand-added %v", on, mine, hand)
	}
	h, err := held(t, sn, n)
	if err != nil || !slices.Equal(h, sorted(mine)) {
		t.Fatalf("Held = %v, %v; want only vpcni's %v", h, err, mine)
	}
}

func exhaustion(t *testing.T, ep Endpoint) {
	// .2-.7, the node at .4 (EC2 reserves .1-.3 of a subnet; Neutron
	// does not mind).
	sn := ep.NewSubnet(t, nextCIDR(28), 6)
	nodeIP := at(sn, 4)
	n := ep.NewNode(t, sn, nodeIP)
	got, err := assign(t, sn, n, provider.AssignRequest{Count: 8})
	if !errors.Is(err, provider.ErrExhausted) || len(got) != 5 {
		t.Fatalf("Assign(8) on a pool of 5 free: %v, %v; want the 5 and ErrExhausted", got, err)
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, sorted(got)) {
		t.Fatalf("port holds %v, Assign said %v", on, got)
	}
	got, err = assign(t, sn, n, provider.AssignRequest{Count: 1})
	if !errors.Is(err, provider.ErrExhausted) || len(got) != 0 {
		t.Fatalf("Assign on a full subnet: %v, %v; want ErrExhausted", got, err)
	}
	if !strings.Contains(err.Error(), sn.CIDR.String()) {
		t.Errorf("the exhaustion error does not name the subnet: %v", err)
	}
}

func restartOwnership(t *testing.T, ep Endpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNode(t, sn, nodeIP)
	hand := at(sn, 150)
	n.AddByHand(t, hand)
	got, err := assign(t, sn, n, provider.AssignRequest{Count: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("Assign(3) = %v, %v", got, err)
	}
	// A new agent process finds what the node holds, and only that.
	p2 := n.Reopen(t)
	h, err := held(t, sn, Node{Provider: p2, PortID: n.PortID})
	if err != nil || !slices.Equal(h, sorted(got)) {
		t.Fatalf("after restart Held = %v, %v; want %v (not the hand-added %s)", h, err, sorted(got), hand)
	}
	// Releasing everything, the hand-added address included, leaves it.
	err = p2.Release(ctx(t), append(slices.Clone(got), hand))
	if err == nil || !strings.Contains(err.Error(), hand.String()) {
		t.Errorf("Release of a hand-added address should say it was left alone: %v", err)
	}
	if on := podIPs(t, n, nodeIP); !slices.Equal(on, []netip.Addr{hand}) {
		t.Fatalf("port holds %v, want only the hand-added %s", on, hand)
	}
}

// othersGaveBack: a node that found the subnet full gets addresses another
// node gave back since (its view of the subnet is not stuck).
func othersGaveBack(t *testing.T, ep Endpoint) {
	sn := ep.NewSubnet(t, nextCIDR(28), 6) // .2-.7, the nodes at .4 and .5
	a, b := ep.NewNode(t, sn, at(sn, 4)), ep.NewNode(t, sn, at(sn, 5))
	got, err := assign(t, sn, b, provider.AssignRequest{Count: 4})
	if err != nil || len(got) != 4 {
		t.Fatalf("node b takes the last 4: %v, %v", got, err)
	}
	if _, err := assign(t, sn, a, provider.AssignRequest{Count: 1}); !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("node a on a full subnet: %v, want ErrExhausted", err)
	}
	if err := b.Provider.Release(ctx(t), got[:2]); err != nil {
		t.Fatal(err)
	}
	mine, err := assign(t, sn, a, provider.AssignRequest{Count: 1})
	if err != nil || len(mine) != 1 || !slices.Contains(got[:2], mine[0]) {
		t.Fatalf("node a after b gave %v back: %v, %v", got[:2], mine, err)
	}
}
