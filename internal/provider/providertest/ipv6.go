package providertest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// DualStack is an endpoint that serves IPv6 pod addresses beside IPv4
// ones: the agent runs a pool per family over one provider, asking with
// AssignRequest.Family and reading Held of both.
type DualStack interface {
	Endpoint
	// NewSubnet6 adds an IPv6 subnet to sn's network: the gateway its
	// first address, an allocation pool of pool addresses after it.
	NewSubnet6(t *testing.T, sn Subnet, cidr string, pool int) Subnet
	// NewDualNode makes a VM port with nodeIP on sn and nodeIP6 on sn6,
	// and a provider serving both families; its AddByHand puts an
	// address on the subnet of its family.
	NewDualNode(t *testing.T, sn, sn6 Subnet, nodeIP, nodeIP6 netip.Addr) Node
}

// RunIPv6 runs the contract's IPv6 part: each family's addresses come
// from its own subnet, are held and released by family, and both
// families' pools work one port at once.
func RunIPv6(t *testing.T, ep DualStack) {
	t.Run("DualStackAssignHeldRelease", func(t *testing.T) { t.Parallel(); dualStack(t, ep) })
	t.Run("IPv6Explicit", func(t *testing.T) { t.Parallel(); explicit6(t, ep) })
	t.Run("IPv6OutsideWriter", func(t *testing.T) { t.Parallel(); outsideWriter6(t, ep) })
	t.Run("IPv6Exhaustion", func(t *testing.T) { t.Parallel(); exhaustion6(t, ep) })
	t.Run("BothFamiliesAtOnce", func(t *testing.T) { t.Parallel(); bothAtOnce(t, ep) })
}

// nextCIDR6 is an IPv6 /64 of its own for a test.
func nextCIDR6() string {
	netMu.Lock()
	defer netMu.Unlock()
	netN++
	return fmt.Sprintf("fd00:%x:%x::/64", 0x200+netN/200, netN%200)
}

// at6 is the subnet's address at offset n.
func at6(sn Subnet, n int) netip.Addr {
	a := sn.CIDR.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// dual is a dual-stack test bed: both subnets and a node at .10 / ::a.
type dual struct {
	sn, sn6 Subnet
	ip, ip6 netip.Addr
	n       Node
}

func newDual(t *testing.T, ep DualStack, bits4, pool4, pool6 int, host int) dual {
	d := dual{sn: ep.NewSubnet(t, nextCIDR(bits4), pool4)}
	d.sn6 = ep.NewSubnet6(t, d.sn, nextCIDR6(), pool6)
	d.ip, d.ip6 = at(d.sn, byte(host)), at6(d.sn6, host)
	d.n = ep.NewDualNode(t, d.sn, d.sn6, d.ip, d.ip6)
	return d
}

// pods is what the port holds of a family, the node's own addresses aside.
func (d dual) pods(t *testing.T, f family.Family) []netip.Addr {
	return sorted(slices.DeleteFunc(d.n.PortIPs(t), func(a netip.Addr) bool {
		return a == d.ip || a == d.ip6 || family.Of(a) != f
	}))
}

// held is Held split by family, each lease checked against its subnet.
func (d dual) held(t *testing.T, p provider.Provider) (v4, v6 []netip.Addr, err error) {
	t.Helper()
	ls, err := p.Held(ctx(t))
	node := Node{PortID: d.n.PortID}
	for _, l := range ls {
		if family.Of(l.Address) == family.V6 {
			v6 = append(v6, leased(t, d.sn6, node, []alloc.Lease{l})...)
		} else {
			v4 = append(v4, leased(t, d.sn, node, []alloc.Lease{l})...)
		}
	}
	return sorted(v4), sorted(v6), err
}

func dualStack(t *testing.T, ep DualStack) {
	d := newDual(t, ep, 24, 200, 200, 10)
	batch := d.n.BatchCall
	if batch == "" {
		batch = "PUT"
	}
	puts := totalCalls(d.n.Provider, batch)
	six, err := assign(t, d.sn6, d.n, provider.AssignRequest{Count: 3, Family: family.V6})
	if err != nil || len(six) != 3 {
		t.Fatalf("Assign(3, ipv6) = %v, %v", six, err)
	}
	if c := totalCalls(d.n.Provider, batch); puts >= 0 && c-puts != 1 {
		t.Errorf("3 IPv6 addresses took %d %s calls, want 1 (one batch)", c-puts, batch)
	}
	for _, a := range six {
		if !d.sn6.CIDR.Contains(a) || a == d.sn6.Gateway || a == d.ip6 {
			t.Fatalf("assigned %s: not a free address of %s", a, d.sn6.CIDR)
		}
	}
	four, err := assign(t, d.sn, d.n, provider.AssignRequest{Count: 2})
	if err != nil || len(four) != 2 || !d.sn.CIDR.Contains(four[0]) {
		t.Fatalf("Assign(2) (IPv4, Family unset) beside IPv6 ones = %v, %v", four, err)
	}
	if on4, on6 := d.pods(t, family.V4), d.pods(t, family.V6); !slices.Equal(on4, sorted(four)) || !slices.Equal(on6, sorted(six)) {
		t.Fatalf("port holds %v and %v, Assign said %v and %v", on4, on6, four, six)
	}
	h4, h6, err := d.held(t, d.n.Provider)
	if err != nil || !slices.Equal(h4, sorted(four)) || !slices.Equal(h6, sorted(six)) {
		t.Fatalf("Held = %v + %v, %v; want %v + %v", h4, h6, err, four, six)
	}
	if i := d.n.Provider.Info(); i.Capacities == nil || i.Capacities[family.V6].Max < 3 || i.Capacities[family.V4].Max < 2 {
		t.Errorf("Info().Capacities = %v: want each family's capacity", i.Capacities)
	} else {
		t.Logf("vpcni-test: capacities %v", i.Capacities)
	}
	// One Release of both families.
	if err := d.n.Provider.Release(ctx(t), []netip.Addr{four[0], six[0]}); err != nil {
		t.Fatalf("Release of one address of each family: %v", err)
	}
	if on4, on6 := d.pods(t, family.V4), d.pods(t, family.V6); !slices.Equal(on4, sorted(four[1:])) || !slices.Equal(on6, sorted(six[1:])) {
		t.Fatalf("after releasing %s and %s the port holds %v and %v", four[0], six[0], on4, on6)
	}
	// A new agent process finds both families' addresses.
	p2 := d.n.Reopen(t)
	h4, h6, err = d.held(t, p2)
	if err != nil || !slices.Equal(h4, sorted(four[1:])) || !slices.Equal(h6, sorted(six[1:])) {
		t.Fatalf("after restart Held = %v + %v, %v; want %v + %v", h4, h6, err, four[1:], six[1:])
	}
	if err := p2.Release(ctx(t), append(slices.Clone(four[1:]), six[1:]...)); err != nil {
		t.Fatal(err)
	}
	if on := append(d.pods(t, family.V4), d.pods(t, family.V6)...); len(on) != 0 {
		t.Fatalf("port still holds %v after Release", on)
	}
	if h4, h6, _ := d.held(t, p2); len(h4)+len(h6) != 0 {
		t.Fatalf("Held after Release = %v + %v", h4, h6)
	}
}

func explicit6(t *testing.T, ep DualStack) {
	a := newDual(t, ep, 24, 200, 200, 10)
	b := ep.NewDualNode(t, a.sn, a.sn6, at(a.sn, 11), at6(a.sn6, 11))
	want := at6(a.sn6, 0x77)
	got, err := assign(t, a.sn6, a.n, provider.AssignRequest{Addresses: []netip.Addr{want}, Family: family.V6})
	if err != nil || !slices.Equal(got, []netip.Addr{want}) {
		t.Fatalf("Assign(%s) = %v, %v", want, got, err)
	}
	if got, err := assign(t, a.sn6, a.n, provider.AssignRequest{Addresses: []netip.Addr{want}, Family: family.V6}); err != nil || !slices.Equal(got, []netip.Addr{want}) {
		t.Fatalf("repeated Assign(%s) = %v, %v", want, got, err)
	}
	got, err = assign(t, a.sn6, b, provider.AssignRequest{Addresses: []netip.Addr{want}, Count: 1, Family: family.V6})
	if !errors.Is(err, provider.ErrTaken) {
		t.Fatalf("another node asking for %s: %v, want ErrTaken", want, err)
	}
	if len(got) != 1 || got[0] == want || !a.sn6.CIDR.Contains(got[0]) {
		t.Fatalf("the count part of the request should still succeed with an IPv6 address: %v", got)
	}
	// An IPv4 address asked for as IPv6 is outside the subnet.
	if _, err := a.n.Provider.Assign(ctx(t), provider.AssignRequest{Addresses: []netip.Addr{at(a.sn, 50)}, Family: family.V6}); !errors.Is(err, provider.ErrOutside) {
		t.Fatalf("an IPv4 address in an IPv6 request: %v, want ErrOutside", err)
	}
}

func outsideWriter6(t *testing.T, ep DualStack) {
	d := newDual(t, ep, 24, 200, 200, 10)
	var wg sync.WaitGroup
	var mine4, mine6 []netip.Addr
	var errs [2]error
	wg.Go(func() {
		for range 2 {
			got, err := assign(t, d.sn6, d.n, provider.AssignRequest{Count: 2, Family: family.V6})
			mine6, errs[0] = append(mine6, got...), errors.Join(errs[0], err)
		}
	})
	wg.Go(func() {
		got, err := assign(t, d.sn, d.n, provider.AssignRequest{Count: 2})
		mine4, errs[1] = got, err
	})
	hand := []netip.Addr{at6(d.sn6, 0xc9), at6(d.sn6, 0xca)}
	wg.Go(func() {
		for _, h := range hand {
			d.n.AddByHand(t, h)
		}
	})
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	if on := d.pods(t, family.V6); !slices.Equal(on, sorted(append(slices.Clone(mine6), hand...))) {
		t.Fatalf("lost update: port holds %v, want vpcni's %v and the hand-added %v", on, mine6, hand)
	}
	h4, h6, err := d.held(t, d.n.Provider)
	if err != nil || !slices.Equal(h6, sorted(mine6)) || !slices.Equal(h4, sorted(mine4)) {
		t.Fatalf("Held = %v + %v, %v; want only vpcni's %v + %v", h4, h6, err, mine4, mine6)
	}
	err = d.n.Provider.Release(ctx(t), append(slices.Clone(mine6), hand[0]))
	if err == nil || !strings.Contains(err.Error(), hand[0].String()) {
		t.Errorf("Release of a hand-added IPv6 address should say it was left alone: %v", err)
	}
	if on := d.pods(t, family.V6); !slices.Equal(on, sorted(hand)) {
		t.Fatalf("port holds %v, want only the hand-added %v", on, hand)
	}
}

func exhaustion6(t *testing.T, ep DualStack) {
	// ::2-::7, the node at ::4.
	d := newDual(t, ep, 24, 200, 6, 4)
	got, err := assign(t, d.sn6, d.n, provider.AssignRequest{Count: 8, Family: family.V6})
	if !errors.Is(err, provider.ErrExhausted) || len(got) != 5 {
		t.Fatalf("Assign(8, ipv6) on a pool of 5 free: %v, %v; want the 5 and ErrExhausted", got, err)
	}
	if !strings.Contains(err.Error(), d.sn6.CIDR.String()) {
		t.Errorf("the exhaustion error does not name the IPv6 subnet: %v", err)
	}
	// The IPv4 pool is another pool.
	if got, err := assign(t, d.sn, d.n, provider.AssignRequest{Count: 2}); err != nil || len(got) != 2 {
		t.Fatalf("IPv4 addresses with the IPv6 subnet full: %v, %v", got, err)
	}
}

// bothAtOnce: the agent's two pools refill on one port at the same time.
func bothAtOnce(t *testing.T, ep DualStack) {
	d := newDual(t, ep, 24, 200, 200, 10)
	var wg sync.WaitGroup
	res := make([][]netip.Addr, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			req := provider.AssignRequest{Count: 3}
			sn := d.sn
			if i%2 == 1 {
				req.Family, sn = family.V6, d.sn6
			}
			res[i], errs[i] = assign(t, sn, d.n, req)
		})
	}
	wg.Wait()
	var want4, want6 []netip.Addr
	for i := range 4 {
		if errs[i] != nil {
			t.Errorf("caller %d: %v", i, errs[i])
		}
		if i%2 == 1 {
			want6 = append(want6, res[i]...)
		} else {
			want4 = append(want4, res[i]...)
		}
	}
	h4, h6, err := d.held(t, d.n.Provider)
	if err != nil || len(want4) != 6 || len(want6) != 6 || !slices.Equal(h4, sorted(want4)) || !slices.Equal(h6, sorted(want6)) {
		t.Fatalf("Held = %v + %v, %v; callers were told %v + %v (6 each)", h4, h6, err, want4, want6)
	}
	if on4, on6 := d.pods(t, family.V4), d.pods(t, family.V6); !slices.Equal(on4, h4) || !slices.Equal(on6, h6) {
		t.Fatalf("port holds %v + %v, Held %v + %v", on4, on6, h4, h6)
	}
}
