package neutron

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/config"
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

// run does rounds until stop is closed.
func (c *churn) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
			c.round(ctx)
		}
	}
}

// round assigns 3 addresses and, past 6 held, releases the 3 lowest: one
// or two writes of the VM port.
func (c *churn) round(ctx context.Context) {
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
		return
	}
	err = c.p.Release(ctx, give)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	if err != nil {
		c.errs = append(c.errs, err) // what it holds is unknown now: the checks at the end say so
		return
	}
	for _, a := range give {
		delete(c.held, a)
	}
}

// newChurn builds the node's provider as the agent does (the registered
// openstack provider, with a Notify hook).
func newChurn(t *testing.T, url, subnetID string, subnet netip.Prefix, nodeIP netip.Addr) *churn {
	t.Helper()
	c := &churn{subnet: subnet, held: map[netip.Addr]bool{}}
	reg, err := provider.Lookup("openstack")
	if err != nil {
		t.Fatal(err)
	}
	// The shared neutron-server may be slow under other tests' load: a
	// call that times out leaves what a node holds unknown to the test.
	cfg := &openstack.Config{Endpoint: url, SubnetID: subnetID, Timeout: config.Duration{Duration: time.Minute}}
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
// produced and whether the address was on the port before it wrote. (It
// runs in the proxy's goroutine too: errors are returned, not Fatal.)
func byHand(c context.Context, portID, subnetID string, ip netip.Addr, add bool) (rev int, wasOn bool, err error) {
	for range 60 {
		p, err := ports.Get(c, nc, portID).Extract()
		if err != nil {
			return 0, false, fmt.Errorf("third writer: read the port: %w", err)
		}
		fixed := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.IPAddress == ip.String() })
		wasOn = len(fixed) < len(p.FixedIPs)
		if add {
			fixed = append(fixed, ports.IP{SubnetID: subnetID, IPAddress: ip.String()})
		}
		r := p.RevisionNumber
		u, err := ports.Update(c, nc, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &r}).Extract()
		if err == nil {
			return u.RevisionNumber, wasOn, nil
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			return 0, false, fmt.Errorf("third writer: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, false, fmt.Errorf("third writer: still 412 after 60 tries on %s", ip)
}

// afterWrite is a loopback proxy to the real neutron-server for one
// node's provider: once armed, when a PUT of the node's VM port checked
// against (If-Match) the armed revision or a later one is answered 200, it
// holds the answer, runs the armed function (the third writer's removal)
// and only then lets the provider read the answer. So the removal lands
// between a write of vpcni's made on a port that had the address and
// vpcni's read-back, where the free-running race put it in about half of
// the runs.
type afterWrite struct {
	portID string
	done   chan struct{}
	writes atomic.Int64 // PUTs of the port answered 200

	mu      sync.Mutex
	fromRev int    // the revision a write must be checked against, at least
	armed   func() // nil: not armed
}

func newAfterWrite(t *testing.T, portID string) (*afterWrite, string) {
	t.Helper()
	target, _ := url.Parse(endpoint)
	w := &afterWrite{portID: portID, done: make(chan struct{}, 1)}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		r := resp.Request
		if r.Method != http.MethodPut || !strings.HasSuffix(r.URL.Path, "/ports/"+portID) || resp.StatusCode != http.StatusOK {
			return nil
		}
		rev, _ := strconv.Atoi(strings.TrimPrefix(r.Header.Get("If-Match"), "revision_number="))
		w.mu.Lock()
		f := w.armed
		if f != nil && rev >= w.fromRev {
			w.armed = nil
		} else {
			f = nil
		}
		w.mu.Unlock()
		if f != nil {
			f()
		}
		w.writes.Add(1)
		if f != nil {
			w.done <- struct{}{}
		}
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return w, srv.URL + "/"
}

// arm runs f after the next write checked against fromRev or later.
func (w *afterWrite) arm(fromRev int, f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fromRev, w.armed = fromRev, f
}

// TestAnotherWritersRemovalHolds: two nodes add and give back addresses on
// one subnet while a third writer (GET, PUT with If-Match) adds and then
// removes a hand-made fixed IP on one node's VM port, cycle after cycle,
// each removal landing between a write of vpcni's and its read-back. Each
// removal that Neutron accepted must hold: vpcni never puts back an
// address it does not own, so the address is neither back when the third
// writer next reads the port nor there at the end. Nothing of vpcni's is
// lost or doubled: every address Assign returned and no Release took back
// is on its node's port and marked, and on no other. A node alone reports
// no race (the revisions of its own writes are what Neutron's bumps
// predict); the races it reports with the third writer are logged.
func TestAnotherWritersRemovalHolds(t *testing.T) {
	r := realNeutron{}
	sn := r.NewSubnet(t, "10.203.24.0/24", 150) // pool .2-.151
	ipA, ipB := netip.MustParseAddr("10.203.24.10"), netip.MustParseAddr("10.203.24.20")
	portA := r.NewNode(t, sn, ipA).PortID
	portB := r.NewNode(t, sn, ipB).PortID
	hold, viaProxy := newAfterWrite(t, portA)
	a, b := newChurn(t, viaProxy, sn.ID, sn.CIDR, ipA), newChurn(t, endpoint, sn.ID, sn.CIDR, ipB)
	c := ctx(t)

	// Alone: vpcni's own writes (assign, assign, then assign and release)
	// are no race.
	for range 3 {
		a.round(c)
	}
	a.mu.Lock()
	alone, aloneWrites := len(a.notices), a.writes
	for _, n := range a.notices {
		t.Errorf("a node writing its port alone reported a race: %s/%s: %s", n.Reason, n.Kind, n.Message)
	}
	a.notices = nil
	a.mu.Unlock()

	// With the other node and the third writer.
	const cycles = 3
	x := netip.MustParseAddr("10.203.24.200") // the hand-made address, outside the pool vpcni picks from
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { a.run(c, stop) })
	wg.Go(func() { b.run(c, stop) })
	back := 0 // times x was found back after a removal Neutron accepted
	var lastRemoved int
	for i := range cycles {
		added, wasOn, err := byHand(c, portA, sn.ID, x, true)
		if err != nil {
			t.Fatal(err)
		}
		if wasOn {
			back++
			t.Logf("vpcni-test: cycle %d: %s was back on the port before the third writer added it again", i, x)
		}
		var removeErr error
		hold.arm(added, func() { lastRemoved, _, removeErr = byHand(c, portA, sn.ID, x, false) })
		select {
		case <-hold.done:
		case <-time.After(time.Minute):
			t.Fatalf("cycle %d: node A made no write in a minute", i)
		}
		if removeErr != nil {
			t.Fatal(removeErr)
		}
		// One more write of node A's before the third writer looks again:
		// the one that would put the address back.
		n := hold.writes.Load()
		waitFor(t, time.Minute, "another write of node A", func() bool { return hold.writes.Load() > n })
	}
	// Let the nodes finish a round after the last removal.
	time.Sleep(time.Second)
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
		name              string
		c                 *churn
		on, marked, other map[netip.Addr]bool
	}{{"A", a, on, marked, onB}, {"B", b, onB, markedB, on}} {
		h, err := n.c.p.Held(c)
		if err != nil {
			t.Fatal(err)
		}
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
		if want := addrs(n.c.held); !slices.Equal(provider.Addresses(h), want) {
			t.Errorf("node %s: Held = %v, want %v", n.name, provider.Addresses(h), want)
		}
		t.Logf("vpcni-test: node %s: %d provider calls, %d held at the end, races reported: %v", n.name, n.c.writes, len(n.c.held), raceKinds(n.c.notices))
		for _, x := range n.c.notices {
			t.Logf("vpcni-test: node %s reported %s/%s: %s", n.name, x.Reason, x.Kind, x.Message)
		}
		n.c.mu.Unlock()
	}
	t.Logf("vpcni-test: alone: %d provider calls, %d races reported; %d third-writer cycles, %s found back %d times", aloneWrites, alone, cycles, x, back)
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
