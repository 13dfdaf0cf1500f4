// Package fake is a stateful datapath for tests without root: it keeps
// what a node's kernel would hold — a link per wired allocation with its
// routes, and a piece per address (as the routed modes' proxy ARP or NDP
// entry or eBPF map entry, keyed by the address alone), for every address
// of the allocation (a dual-stack pod's two) — and lets a test damage it
// as a person or a crash would. It obeys the same rules as a real mode:
// Setup refuses a pod namespace that does not exist, Teardown is
// idempotent and takes the address's piece down with the link, Reconcile
// repairs node-side pieces, reports missing links and removes what
// nothing wants.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/family"
)

// Datapath is the fake node. The zero value is not usable: call New.
type Datapath struct {
	mu    sync.Mutex
	links map[string]link // by allocation key
	// neigh holds the per-address pieces (a proxy entry): they carry no
	// attachment, so whoever tears an address down takes its piece.
	neigh map[netip.Addr]bool
	fail  map[string]error // the next Setup of a key fails so
	// failAddr: every Setup of an address fails so (an address the node
	// cannot wire: its NIC never shows up).
	failAddr map[netip.Addr]error
	calls    map[string]int // by method
	// NoPodVeth makes Info say the pod's interface is no veth (as in
	// macvlan mode); by default the fake is veth-like. Atomic: the agent's
	// loops may ask Info while a test flips it.
	NoPodVeth atomic.Bool
}

type link struct {
	netns     string
	addresses []netip.Addr // first family first
	// route: the node-side piece Reconcile can put back alone.
	route bool
}

// New returns an empty node.
func New() *Datapath {
	return &Datapath{links: map[string]link{}, neigh: map[netip.Addr]bool{}, fail: map[string]error{},
		failAddr: map[netip.Addr]error{}, calls: map[string]int{}}
}

var _ datapath.Datapath = (*Datapath)(nil)

// The fake registers as mode "fake", so a test's config can name it; only
// test binaries import this package.
func init() {
	datapath.Register(datapath.Registration{
		Name:        "fake",
		NewSettings: func() datapath.Settings { return &Settings{} },
		Families:    []family.Family{family.V4, family.V6},
		New:         func(datapath.Node, datapath.Settings) (datapath.Datapath, error) { return New(), nil },
	})
}

// Settings is the fake's (empty) config section.
type Settings struct{}

// Defaults implements datapath.Settings.
func (*Settings) Defaults() {}

// Validate implements datapath.Settings.
func (*Settings) Validate() error { return nil }

// wiring is one IPConfig per address, each alone (a /32, a /128).
func wiring(a *alloc.Allocation) alloc.Wiring {
	w := alloc.Wiring{
		Interfaces: []alloc.Interface{{Name: "fake-" + a.IfName}, {Name: a.IfName, MAC: "02:00:00:00:00:01", Sandbox: a.Netns}},
	}
	for _, l := range a.Leases() {
		w.IPs = append(w.IPs, alloc.IPConfig{Interface: 1, Address: family.Host(l.Address), Gateway: l.Gateway})
	}
	return w
}

// Setup implements datapath.Datapath.
func (d *Datapath) Setup(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls["Setup"]++
	if err := d.fail[a.Key()]; err != nil {
		delete(d.fail, a.Key())
		return alloc.Wiring{}, &datapath.SetupError{Step: "fake setup", Err: err}
	}
	ips := a.Addresses()
	for _, ip := range ips {
		if err := d.failAddr[ip]; err != nil {
			return alloc.Wiring{}, &datapath.SetupError{Step: "fake setup of " + ip.String(), Err: err}
		}
	}
	if _, err := os.Stat(a.Netns); err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "open pod netns " + a.Netns, BadRequest: true, Err: err}
	}
	for k, l := range d.links {
		for _, ip := range ips {
			if slices.Contains(l.addresses, ip) && k != a.Key() {
				return alloc.Wiring{}, fmt.Errorf("address %s is wired for %s already", ip, k)
			}
		}
	}
	d.links[a.Key()] = link{netns: a.Netns, addresses: ips, route: true}
	for _, ip := range ips {
		d.neigh[ip] = true
	}
	return wiring(a), nil
}

// Check implements datapath.Datapath.
func (d *Datapath) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls["Check"]++
	l, ok := d.links[a.Key()]
	switch {
	case !ok:
		return wiring(a), fmt.Errorf("%s has no link", a.Key())
	case l.netns != a.Netns || !slices.Equal(l.addresses, a.Addresses()):
		return wiring(a), fmt.Errorf("%s is wired to %v in %s", a.Key(), l.addresses, l.netns)
	case !l.route:
		return wiring(a), fmt.Errorf("%s has no route", a.Key())
	}
	for _, ip := range l.addresses {
		if !d.neigh[ip] {
			return wiring(a), fmt.Errorf("%s has no proxy entry", ip)
		}
	}
	return wiring(a), nil
}

// Trace implements datapath.Datapath: the pod as a whole, as Check sees
// it (one hop per problem).
func (d *Datapath) Trace(ctx context.Context, a *alloc.Allocation) []datapath.Hop {
	_, err := d.Check(ctx, a)
	return datapath.HopsOf("fake wiring of "+a.Address.String(), err)
}

// Teardown implements datapath.Datapath. Like mode veth's, it removes
// the addresses' proxy entries whether or not the link was there.
func (d *Datapath) Teardown(_ context.Context, a *alloc.Allocation) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls["Teardown"]++
	if l, ok := d.links[a.Key()]; ok && slices.Contains(l.addresses, a.Address) {
		delete(d.links, a.Key())
	}
	for _, ip := range a.Addresses() {
		delete(d.neigh, ip)
	}
	return nil
}

// Reconcile implements datapath.Datapath.
func (d *Datapath) Reconcile(_ context.Context, want datapath.Desired) (datapath.Report, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls["Reconcile"]++
	var rep datapath.Report
	keep := map[string]bool{}
	for _, a := range want.Leave {
		keep[a.Key()] = true
	}
	for _, a := range want.Allocations {
		keep[a.Key()] = true
		l, ok := d.links[a.Key()]
		if !ok {
			rep.Broken = append(rep.Broken, a.Key())
			continue
		}
		if !l.route {
			l.route = true
			d.links[a.Key()] = l
			rep.AddRepair(datapath.RepairRoute, "%s: route", a.Key())
		}
		for _, ip := range a.Addresses() {
			if !d.neigh[ip] {
				d.neigh[ip] = true
				rep.AddRepair(datapath.RepairNeighbour, "%s: proxy entry %s", a.Key(), ip)
			}
		}
	}
	for k := range d.links {
		if !keep[k] {
			delete(d.links, k)
			rep.Removed = append(rep.Removed, "orphan link "+k)
		}
	}
	for _, ip := range want.Idle {
		if d.neigh[ip] {
			delete(d.neigh, ip)
			rep.Removed = append(rep.Removed, "stale piece of "+ip.String())
		}
	}
	return rep, nil
}

// Info implements datapath.Datapath. It names no uplink: there is no
// interface behind it, so a provider that probes its segment (static)
// has none to probe.
func (d *Datapath) Info() datapath.Info {
	return datapath.Info{Mode: "fake", MTU: 1500, NodeIP: netip.MustParseAddr("10.0.0.2"), PodVeth: !d.NoPodVeth.Load(), NICRoutes: true}
}

// Close implements datapath.Datapath.
func (d *Datapath) Close() error { return nil }

// FailNextSetup makes the next Setup of key fail with err.
func (d *Datapath) FailNextSetup(key string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail[key] = err
}

// FailAddress makes every Setup of ip fail with err (nil: wire it again).
func (d *Datapath) FailAddress(ip netip.Addr, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.failAddr, ip)
		return
	}
	d.failAddr[ip] = err
}

// DropRoute removes a wired allocation's node-side piece (a person
// deleting its route).
func (d *Datapath) DropRoute(key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.links[key]
	if !ok {
		return errors.New("no link " + key)
	}
	l.route = false
	d.links[key] = l
	return nil
}

// DropLink removes a wired allocation's link (its pod end with it).
func (d *Datapath) DropLink(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.links, key)
}

// Orphan adds a link of vpcni's, with its address's proxy entry, that
// no record knows (a crash between wiring and recording).
func (d *Datapath) Orphan(key, netns string, ip netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.links[key] = link{netns: netns, addresses: []netip.Addr{ip}, route: true}
	d.neigh[ip] = true
}

// Stale leaves a node-side piece for ip (a proxy entry of an address no
// pod holds).
func (d *Datapath) Stale(ip netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.neigh[ip] = true
}

// Links lists the wired keys, sorted.
func (d *Datapath) Links() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k := range d.links {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Wired says whether key is wired with each of ips (a dual-stack pod's
// two, or one of them), its route and each address's proxy entry
// included.
func (d *Datapath) Wired(key string, ips ...netip.Addr) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.links[key]
	if !ok || !l.route || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !slices.Contains(l.addresses, ip) || !d.neigh[ip] {
			return false
		}
	}
	return true
}

// DropPiece removes the node-side piece of one address (a person deleting
// its proxy entry).
func (d *Datapath) DropPiece(ip netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.neigh, ip)
}

// HasStale says whether a piece of ip is left that no link of ip's
// accounts for.
func (d *Datapath) HasStale(ip netip.Addr) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.neigh[ip] {
		return false
	}
	for _, l := range d.links {
		if slices.Contains(l.addresses, ip) {
			return false
		}
	}
	return true
}

// Calls counts calls by method name.
func (d *Datapath) Calls(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[method]
}
