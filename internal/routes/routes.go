package routes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure a Reconciler.
type Options struct {
	// Ranges are the block ranges: a route to, or a pair of, a CIDR
	// inside them is vpcni's; everything else is someone else's, counted
	// against the limits and never touched.
	Ranges []netip.Prefix
	// MaxRoutes is the router's max_routes when known (config); 0: learn
	// it from Neutron's RoutesExhausted answer, and try again every
	// Probe while blocks wait (the limit may have been raised).
	MaxRoutes int
	// MaxPairs is max_allowed_address_pair (10 by default in Neutron);
	// 0: the cloud's (Cloud.MaxPairs).
	MaxPairs int
	// Probe: see MaxRoutes.
	Probe time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Reconciler keeps a router's routes and the VM ports' pairs in line
// with the blocks handed to Sync. One Sync at a time (the controller's
// queue has one key for the router).
type Reconciler struct {
	opts Options
	nt   Cloud
	log  *slog.Logger

	mu        sync.Mutex
	learned   int // max_routes from Neutron's last RoutesExhausted (0: none)
	learnedAt time.Time
	last      Result
}

// New makes a reconciler writing through nt.
func New(nt Cloud, opts Options, log *slog.Logger) (*Reconciler, error) {
	if opts.MaxPairs == 0 {
		opts.MaxPairs = nt.MaxPairs()
	}
	if len(opts.Ranges) == 0 {
		return nil, errors.New("routes: no block ranges")
	}
	if opts.MaxRoutes < 0 || opts.MaxPairs < 1 {
		return nil, fmt.Errorf("routes: maxRoutes %d must not be negative and maxAddressPairs %d must be positive", opts.MaxRoutes, opts.MaxPairs)
	}
	if opts.Probe <= 0 {
		opts.Probe = 10 * time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Reconciler{opts: opts, nt: nt, log: log}, nil
}

// Result is what a Sync left: each block's state (with a message for a
// person), the counts, and the fix when blocks wait for a route.
type Result struct {
	States   map[string]State
	Messages map[string]string
	// Routes: our routes on the router; Others: everyone else's.
	Routes, Others int
	// Limit is max_routes as known (0: not known).
	Limit int
	Shortfall
}

// Last is the result of the last Sync that got through.
func (r *Reconciler) Last() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *Reconciler) ours(p netip.Prefix) bool {
	return slices.ContainsFunc(r.opts.Ranges, func(rg netip.Prefix) bool {
		return rg.Bits() <= p.Bits() && rg.Contains(p.Addr())
	})
}

// limit is max_routes as known: the configured one, lowered by what
// Neutron said; a learned one is forgotten after Probe so that a raised
// limit is found (one atomic add of the waiting routes: it either all
// lands or teaches the limit again, changing nothing).
func (r *Reconciler) limit() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := math.MaxInt
	if r.opts.MaxRoutes > 0 {
		l = r.opts.MaxRoutes
	}
	if r.learned > 0 {
		if r.opts.MaxRoutes == 0 && r.last.Waiting > 0 && r.opts.Now().Sub(r.learnedAt) > r.opts.Probe {
			r.learned = 0
		} else {
			l = min(l, r.learned)
		}
	}
	return l
}

func (r *Reconciler) learn(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learned, r.learnedAt = n, r.opts.Now()
}

// Sync makes the router and the VM ports agree with blocks: one pass of
// read, plan, write (pairs, then stale routes out, then new routes in, in
// one atomic add). A RoutesExhausted answer teaches the limit and plans
// again at once, so no block is left with a pair and no route.
func (r *Reconciler) Sync(ctx context.Context, blocks []Block) (Result, error) {
	for attempt := 0; ; attempt++ {
		res, err := r.pass(ctx, blocks)
		var ex *ExhaustedError
		if errors.As(err, &ex) && attempt < 3 {
			r.log.Info("the router is full: Neutron named its limit; planning within it", "max_routes", ex.Max)
			r.learn(ex.Max)
			continue
		}
		if err != nil {
			return Result{}, err
		}
		r.mu.Lock()
		r.last = res
		r.mu.Unlock()
		return res, nil
	}
}

func (r *Reconciler) pass(ctx context.Context, blocks []Block) (Result, error) {
	// Blocks of other ranges are not routed here (another controller's,
	// or a static range's).
	blocks = slices.DeleteFunc(slices.Clone(blocks), func(b Block) bool { return !r.ours(b.CIDR) })
	routes, err := r.nt.Routes(ctx)
	if err != nil {
		return Result{}, err
	}
	// The ports: every live node's, and the next hop of each of our
	// routes (a gone node's port still carries its pairs).
	ips := map[netip.Addr]bool{}
	for _, b := range blocks {
		if b.NodeIP.IsValid() && !b.NodeGone {
			ips[b.NodeIP] = true
		}
	}
	for _, rt := range routes {
		if r.ours(rt.Destination) {
			ips[rt.NextHop] = true
		}
	}
	list := make([]netip.Addr, 0, len(ips))
	for ip := range ips {
		list = append(list, ip)
	}
	portOf, noPort, err := r.nt.PortsByIP(ctx, list)
	if err != nil {
		return Result{}, err
	}
	// A port is planned and written once, under its first address, whatever
	// the number of its addresses the blocks name (a dual-stack node's IPv4
	// and IPv6 ones): its pair budget is one for both families.
	first := map[string]netip.Addr{}
	for _, ip := range slices.SortedFunc(maps.Keys(portOf), netip.Addr.Compare) {
		if _, ok := first[portOf[ip].ID]; !ok {
			first[portOf[ip].ID] = ip
		}
	}
	room, alias := map[netip.Addr]int{}, map[netip.Addr]netip.Addr{}
	for ip, p := range portOf {
		if f := first[p.ID]; f != ip {
			alias[ip] = f
			continue
		}
		_, foreign := r.split(p.Pairs)
		room[ip] = max(r.opts.MaxPairs-len(foreign), 0)
	}
	in := planInput{blocks: blocks, routes: routes, limit: r.limit(), pairRoom: room, port: alias, ours: r.ours}
	pl := makePlan(in)
	// Order: first the pairs that stay (dropping the stale ones: a stale
	// route keeps naming its port until its pair is gone), then stale
	// routes out, then the new routes in one atomic add, then their pairs.
	// A refused add (the limit learned or probed) thus changes nothing,
	// and a new block is half set only between the add and its pair's
	// write, milliseconds apart, before its pods could have been reached.
	fresh := map[netip.Prefix]bool{}
	for _, rt := range pl.add {
		fresh[rt.Destination] = true
	}
	written := func(ip netip.Addr, p Port) { // every address of the port sees it as written
		for a, q := range portOf {
			if q.ID == p.ID || a == ip {
				portOf[a] = p
			}
		}
	}
	for ip, want := range pl.pairs {
		stay := slices.DeleteFunc(slices.Clone(want), func(c netip.Prefix) bool { return fresh[c] })
		p, err := r.setPairs(ctx, ip, portOf[ip], stay)
		if err != nil {
			return Result{}, err
		}
		written(ip, p)
	}
	if err := r.nt.RemoveRoutes(ctx, pl.remove); err != nil {
		return Result{}, err
	}
	for _, rt := range pl.remove {
		r.log.Info("route removed: no block of its node needs it", "route", rt.String())
	}
	if err := r.nt.AddRoutes(ctx, pl.add); err != nil {
		return Result{}, err
	}
	for _, rt := range pl.add {
		r.log.Info("route added", "route", rt.String())
	}
	for ip, want := range pl.pairs {
		p, err := r.setPairs(ctx, ip, portOf[ip], want)
		if err != nil {
			return Result{}, err
		}
		written(ip, p)
	}
	res := Result{States: pl.states, Messages: map[string]string{}, Routes: pl.ours, Others: pl.others}
	if in.limit != math.MaxInt {
		res.Limit = in.limit
	}
	res.Shortfall = shortfall(in, pl)
	for _, b := range blocks {
		res.Messages[b.Name] = r.message(b, pl.states[b.Name], res, portOf[b.NodeIP], noPort[b.NodeIP])
	}
	return res, nil
}

// split parts a port's pairs into ours (block CIDRs inside the ranges)
// and the rest.
func (r *Reconciler) split(pairs []Pair) (ours, foreign []Pair) {
	for _, ap := range pairs {
		if p, err := netip.ParsePrefix(ap.Address); err == nil && strings.Contains(ap.Address, "/") && r.ours(p) {
			ours = append(ours, ap)
			continue
		}
		foreign = append(foreign, ap)
	}
	return ours, foreign
}

// setPairs makes the port allow exactly want of ours, keeping every pair
// of others; a 412 reads the port again and retries. It returns the port
// as written.
func (r *Reconciler) setPairs(ctx context.Context, ip netip.Addr, port Port, want []netip.Prefix) (Port, error) {
	for attempt := 0; ; attempt++ {
		ours, foreign := r.split(port.Pairs)
		have := make([]string, 0, len(ours))
		for _, ap := range ours {
			p, _ := netip.ParsePrefix(ap.Address)
			have = append(have, p.Masked().String())
		}
		wantS := make([]string, 0, len(want))
		for _, p := range want {
			wantS = append(wantS, p.String())
		}
		slices.Sort(have)
		slices.Sort(wantS)
		if slices.Equal(have, wantS) {
			return port, nil
		}
		list := slices.Clone(foreign)
		for _, c := range wantS {
			list = append(list, Pair{Address: c})
		}
		written, err := r.nt.SetPairs(ctx, port.ID, port.Revision, list)
		if err == nil {
			r.log.Info("VM port pairs set", "port", port.ID, "node_ip", ip, "blocks", wantS, "had", have)
			return written, nil
		}
		if !errors.Is(err, ErrStale) || attempt >= 5 {
			return port, err
		}
		if port, err = r.nt.PortByIP(ctx, ip); err != nil {
			return port, err
		}
	}
}

func (r *Reconciler) message(b Block, st State, res Result, port Port, noPort error) string {
	switch st {
	case Routed:
		return fmt.Sprintf("route %s via %s on the router, pair %s on VM port %s", b.CIDR, b.NodeIP, b.CIDR, port.ID)
	case NoRouteBudget:
		return fmt.Sprintf("no room on the router for a route to %s: %d routes of vpcni and %d of others fill max_routes %d, %d blocks wait: %s",
			b.CIDR, res.Routes, res.Others, res.Limit, res.Waiting, res.Fix)
	case NoPairBudget:
		return fmt.Sprintf("VM port %s of node %s has no room for the pair %s (max_allowed_address_pair %d, counting the pairs of others): raise it in neutron.conf, remove other pairs, or use larger blocks so the node needs fewer",
			port.ID, b.Node, b.CIDR, r.opts.MaxPairs)
	case NoNodeAddress:
		if !b.NodeIP.IsValid() {
			return "node " + b.Node + " has no InternalIP address: its route has no next hop"
		}
		return fmt.Sprintf("node %s: %v, so neither route nor pair is set", b.Node, noPort)
	case NodeGone:
		return "node " + b.Node + " is gone: its route and pair stay until the block is reclaimed"
	}
	return ""
}
