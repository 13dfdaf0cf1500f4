package neutron

import (
	"context"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// churn is one node's provider adding and giving back addresses in a loop,
// as an agent under pod churn does, and what it was told it holds.
type churn struct {
	p      provider.Provider
	subnet netip.Prefix

	mu      sync.Mutex
	held    map[netip.Addr]bool // Assign returned them, no Release took them back
	writes  int
	errs    []error
	notices []provider.Notice
}

func (c *churn) notify(n provider.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notices = append(c.notices, n)
}

// run assigns 3 addresses and, past 6 held, releases the 3 lowest, until
// stop is closed; each round is one or two writes of the VM port.
func (c *churn) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		got, err := c.p.Assign(ctx, provider.AssignRequest{Count: 3})
		c.mu.Lock()
		c.writes++
		for _, a := range provider.Addresses(got) {
			c.held[a] = true
		}
		if err != nil {
			c.errs = append(c.errs, err)
		}
		var give []netip.Addr
		if len(c.held) > 6 {
			give = addrs(c.held)[:3]
		}
		c.mu.Unlock()
		if give == nil {
			continue
		}
		err = c.p.Release(ctx, give)
		c.mu.Lock()
		c.writes++
		if err != nil {
			c.errs = append(c.errs, err) // what it holds is unknown now: the check below says so
		} else {
			for _, a := range give {
				delete(c.held, a)
			}
		}
		c.mu.Unlock()
	}
}

// newChurn builds the node's provider as the agent does (the registered
// openstack provider, with a Notify hook).
func newChurn(t *testing.T, subnetID string, subnet netip.Prefix, nodeIP netip.Addr) *churn {
	t.Helper()
	c := &churn{subnet: subnet, held: map[netip.Addr]bool{}}
	reg, err := provider.Lookup("openstack")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &openstack.Config{Endpoint: endpoint, SubnetID: subnetID}
	cfg.Defaults()
	if c.p, err = reg.New(ctx(t), provider.Node{Name: "n-" + nodeIP.String(), IP: nodeIP, Notify: c.notify}, cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// portState reads a port's addresses on the subnet and vpcni's marks.
func portState(t *testing.T, portID string, subnet netip.Prefix) (on, marked map[netip.Addr]bool, rev int) {
	t.Helper()
	p, err := ports.Get(ctx(t), nc, portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	on = map[netip.Addr]bool{}
	for _, f := range p.FixedIPs {
		on[netip.MustParseAddr(f.IPAddress)] = true
	}
	if marked, err = openstack.Marked(p.Description, subnet); err != nil {
		t.Fatal(err)
	}
	return on, marked, p.RevisionNumber
}

// byHand is the third writer: GET, then PUT with If-Match, retried on 412,
// adding (or removing) one address. It returns the revision its write
// produced and whether the address was on the port before it wrote.
func byHand(t *testing.T, portID, subnetID string, ip netip.Addr, add bool) (rev int, wasOn bool) {
	t.Helper()
	for range 60 {
		p, err := ports.Get(ctx(t), nc, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		fixed := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.IPAddress == ip.String() })
		wasOn = len(fixed) < len(p.FixedIPs)
		if add {
			fixed = append(fixed, ports.IP{SubnetID: subnetID, IPAddress: ip.String()})
		}
		r := p.RevisionNumber
		u, err := ports.Update(ctx(t), nc, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &r}).Extract()
		if err == nil {
			return u.RevisionNumber, wasOn
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Fatalf("third writer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("third writer: still 412 after 60 tries on %s", ip)
	return 0, false
}

// TestAnotherWritersRemovalHolds: two nodes add and give back addresses on
// one subnet while a third writer (GET, PUT with If-Match) adds and then
// removes a hand-made fixed IP on one node's VM port, cycle after cycle.
// Each removal that Neutron accepted must hold: vpcni never puts back an
// address it does not own, so the address is neither back when the third
// writer next reads the port nor there at the end. Nothing of vpcni's is
// lost or doubled: every address Assign returned and no Release took back
// is on its node's port and marked, and on no other. A node alone reports
// no race (the revisions of its own writes are what Neutron's bumps
// predict), and the races it reports with the third writer are logged.
func TestAnotherWritersRemovalHolds(t *testing.T) {
	r := realNeutron{}
	sn := r.NewSubnet(t, "10.203.24.0/24", 150) // pool .2-.151
	ipA, ipB := netip.MustParseAddr("10.203.24.10"), netip.MustParseAddr("10.203.24.20")
	portA := r.NewNode(t, sn, ipA).PortID
	portB := r.NewNode(t, sn, ipB).PortID
	a, b := newChurn(t, sn.ID, sn.CIDR, ipA), newChurn(t, sn.ID, sn.CIDR, ipB)
	c := ctx(t)

	// Alone: vpcni's own writes are no race.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { a.run(c, stop) })
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	a.mu.Lock()
	alone, aloneWrites := len(a.notices), a.writes
	for _, n := range a.notices {
		t.Errorf("a node writing its port alone reported a race: %s/%s: %s", n.Reason, n.Kind, n.Message)
	}
	a.notices = nil
	a.mu.Unlock()

	// With the other node and the third writer.
	const cycles = 8
	x := netip.MustParseAddr("10.203.24.200") // the hand-made address, outside vpcni's picks below .152
	stop = make(chan struct{})
	wg.Go(func() { a.run(c, stop) })
	wg.Go(func() { b.run(c, stop) })
	back := 0 // times x was found back after a removal Neutron accepted
	var lastRemoved int
	for i := range cycles {
		time.Sleep(150 * time.Millisecond)
		if _, wasOn := byHand(t, portA, sn.ID, x, true); wasOn && i > 0 {
			back++
			t.Logf("vpcni-test: cycle %d: %s was back on the port before the third writer added it again", i, x)
		}
		time.Sleep(150 * time.Millisecond)
		lastRemoved, _ = byHand(t, portA, sn.ID, x, false)
	}
	// Let the nodes finish a round or two after the last removal.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	on, marked, rev := portState(t, portA, sn.CIDR)
	if on[x] {
		back++
		t.Errorf("%s is on VM port %s at revision %d although the third writer's last removal was accepted at revision %d", x, portA, rev, lastRemoved)
	}
	if back > 0 {
		t.Errorf("the third writer's accepted removal of %s did not hold %d times in %d cycles: vpcni put back an address it does not own", x, back, cycles)
	}
	onB, markedB, _ := portState(t, portB, sn.CIDR)
	for _, n := range []struct {
		name        string
		c           *churn
		on, marked  map[netip.Addr]bool
		other       map[netip.Addr]bool
		nodeAddress netip.Addr
	}{{"A", a, on, marked, onB, ipA}, {"B", b, onB, markedB, on, ipB}} {
		n.c.mu.Lock()
		for _, err := range n.c.errs {
			t.Errorf("node %s: %v", n.name, err)
		}
		for h := range n.c.held {
			if !n.on[h] || !n.marked[h] {
				t.Errorf("node %s: vpcni's %s: on its port %v, marked %v", n.name, h, n.on[h], n.marked[h])
			}
			if n.other[h] {
				t.Errorf("node %s: vpcni's %s is on the other node's port too", n.name, h)
			}
		}
		for m := range n.marked {
			if n.on[m] && !n.c.held[m] {
				t.Errorf("node %s: %s is on the port marked as vpcni's, but no Assign left it held", n.name, m)
			}
		}
		t.Logf("vpcni-test: node %s: %d provider calls, %d held at the end, races reported: %v", n.name, n.c.writes, len(n.c.held), raceKinds(n.c.notices))
		n.c.mu.Unlock()
		h, err := n.c.p.Held(c)
		if err != nil {
			t.Fatal(err)
		}
		n.c.mu.Lock()
		if want := addrs(n.c.held); !slices.Equal(provider.Addresses(h), want) {
			t.Errorf("node %s: Held = %v, want %v", n.name, provider.Addresses(h), want)
		}
		n.c.mu.Unlock()
	}
	t.Logf("vpcni-test: alone: %d provider calls, %d races reported; %d third-writer cycles, %s found back %d times", aloneWrites, alone, cycles, x, back)
	if aloneWrites < 3 {
		t.Errorf("node A made only %d provider calls alone: the check of its own writes proves little", aloneWrites)
	}
}

func raceKinds(ns []provider.Notice) map[string]int {
	out := map[string]int{}
	for _, n := range ns {
		out[n.Kind]++
	}
	return out
}

// addrs is a set's addresses, lowest first.
func addrs(set map[netip.Addr]bool) []netip.Addr {
	return slices.SortedFunc(maps.Keys(set), netip.Addr.Compare)
}
