// Package ipam is the address bookkeeping of one node: the pool of addresses
// the provider holds for the node, each free, cooling down or allocated.
// Pure logic, no I/O: the agent persists and the provider obtains.
package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// State of an address the node holds.
type State int

// The states an address moves through: Free → Allocated → Cooling → Free;
// an address whose wiring keeps failing goes from Allocated to Aside, and
// back to Free (last in line) when its time out is over.
const (
	Unknown State = iota
	Free
	Allocated
	Cooling
	Aside
)

func (s State) String() string {
	return [...]string{"unknown", "free", "allocated", "cooling", "aside"}[s]
}

// Counts of held addresses by state.
type Counts struct {
	Free, Cooling, Allocated, Aside int
}

// Held is every address the node holds.
func (c Counts) Held() int { return c.Free + c.Cooling + c.Allocated + c.Aside }

// Pool tracks held addresses. It is not safe for concurrent use.
type Pool struct {
	cooldown  time.Duration
	free      []netip.Addr // oldest first: the longest-rested address goes out first
	state     map[netip.Addr]State
	owner     map[netip.Addr]string
	coolUntil map[netip.Addr]time.Time
	asideTill map[netip.Addr]time.Time
}

// NewPool returns an empty pool whose released addresses rest for cooldown.
func NewPool(cooldown time.Duration) *Pool {
	return &Pool{
		cooldown:  cooldown,
		state:     map[netip.Addr]State{},
		owner:     map[netip.Addr]string{},
		coolUntil: map[netip.Addr]time.Time{},
		asideTill: map[netip.Addr]time.Time{},
	}
}

// Cooldown is how long released addresses rest.
func (p *Pool) Cooldown() time.Duration { return p.cooldown }

// State of a.
func (p *Pool) State(a netip.Addr) State { return p.state[a] }

// Owner of an allocated address.
func (p *Pool) Owner(a netip.Addr) string { return p.owner[a] }

// AddFree records addresses the provider now holds for the node.
func (p *Pool) AddFree(addrs ...netip.Addr) error {
	for i, a := range addrs {
		if s := p.state[a]; s != Unknown {
			return fmt.Errorf("address %s is already in the pool (%s)", a, s)
		}
		if slices.Contains(addrs[:i], a) {
			return fmt.Errorf("address %s is given twice", a)
		}
	}
	for _, a := range addrs {
		p.state[a] = Free
		p.free = append(p.free, a)
	}
	return nil
}

// Restore records an address found allocated in the store at start.
func (p *Pool) Restore(a netip.Addr, owner string) error {
	if s := p.state[a]; s != Unknown {
		return fmt.Errorf("address %s restored for %s is already %s (owner %q)", a, owner, s, p.owner[a])
	}
	p.state[a] = Allocated
	p.owner[a] = owner
	return nil
}

// RestoreCooling records an address found cooling in the store at start.
func (p *Pool) RestoreCooling(a netip.Addr, until time.Time) error {
	if s := p.state[a]; s != Unknown {
		return fmt.Errorf("address %s restored as cooling is already %s", a, s)
	}
	p.state[a] = Cooling
	p.coolUntil[a] = until
	return nil
}

// Take allocates the longest-rested free address to owner. It does not
// promote cooled addresses: the caller does (Promote), so that it learns
// which ones stopped cooling and can forget them where it persists them.
func (p *Pool) Take(owner string) (netip.Addr, bool) {
	if len(p.free) == 0 {
		return netip.Addr{}, false
	}
	a := p.free[0]
	p.free = p.free[1:]
	p.state[a] = Allocated
	p.owner[a] = owner
	return a, true
}

// Claim allocates a specific free address to owner.
func (p *Pool) Claim(a netip.Addr, owner string) error {
	if s := p.state[a]; s != Free {
		return fmt.Errorf("claim %s: address is %s, not free", a, s)
	}
	p.free = slices.DeleteFunc(p.free, func(x netip.Addr) bool { return x == a })
	p.state[a] = Allocated
	p.owner[a] = owner
	return nil
}

// Release moves an allocated address to cooling and says until when it
// rests. With no cooldown it is free at once (until is the zero time).
func (p *Pool) Release(a netip.Addr, now time.Time) (until time.Time, err error) {
	if s := p.state[a]; s != Allocated {
		return time.Time{}, fmt.Errorf("release %s: address is %s, not allocated", a, s)
	}
	delete(p.owner, a)
	if p.cooldown <= 0 {
		p.state[a] = Free
		p.free = append(p.free, a)
		return time.Time{}, nil
	}
	until = now.Add(p.cooldown)
	p.state[a] = Cooling
	p.coolUntil[a] = until
	return until, nil
}

// Unallocate puts an address that never reached a pod (its ADD failed for
// a reason of its own, not the address's) back at the head of the free
// list, without a cooldown.
func (p *Pool) Unallocate(a netip.Addr) error {
	if s := p.state[a]; s != Allocated {
		return fmt.Errorf("unallocate %s: address is %s, not allocated", a, s)
	}
	delete(p.owner, a)
	p.state[a] = Free
	p.free = slices.Insert(p.free, 0, a)
	return nil
}

// Requeue puts an address that never reached a pod back at the end of the
// free list: its wiring failed, so every other free address goes out
// before it is tried again.
func (p *Pool) Requeue(a netip.Addr) error {
	if s := p.state[a]; s != Allocated {
		return fmt.Errorf("requeue %s: address is %s, not allocated", a, s)
	}
	delete(p.owner, a)
	p.state[a] = Free
	p.free = append(p.free, a)
	return nil
}

// SetAside takes an allocated address that never reached a pod out of use
// until the given time: held, but handed to nobody.
func (p *Pool) SetAside(a netip.Addr, until time.Time) error {
	if s := p.state[a]; s != Allocated {
		return fmt.Errorf("set aside %s: address is %s, not allocated", a, s)
	}
	delete(p.owner, a)
	p.state[a] = Aside
	p.asideTill[a] = until
	return nil
}

// Unaside puts the addresses set aside whose time is over at now back at
// the end of the free list, and returns them.
func (p *Pool) Unaside(now time.Time) []netip.Addr {
	var done []netip.Addr
	for a, until := range p.asideTill {
		if !now.Before(until) {
			done = append(done, a)
		}
	}
	slices.SortFunc(done, netip.Addr.Compare)
	for _, a := range done {
		delete(p.asideTill, a)
		p.state[a] = Free
		p.free = append(p.free, a)
	}
	return done
}

// Promote frees every address whose cooldown is over and returns them.
func (p *Pool) Promote(now time.Time) []netip.Addr {
	var done []netip.Addr
	for a, until := range p.coolUntil {
		if !now.Before(until) {
			done = append(done, a)
		}
	}
	slices.SortFunc(done, func(x, y netip.Addr) int { return p.coolUntil[x].Compare(p.coolUntil[y]) })
	for _, a := range done {
		delete(p.coolUntil, a)
		p.state[a] = Free
		p.free = append(p.free, a)
	}
	return done
}

// Remove forgets a free, cooling or set-aside address the provider no
// longer holds.
func (p *Pool) Remove(a netip.Addr) error {
	switch p.state[a] {
	case Free:
		p.free = slices.DeleteFunc(p.free, func(x netip.Addr) bool { return x == a })
	case Cooling:
		delete(p.coolUntil, a)
	case Aside:
		delete(p.asideTill, a)
	case Allocated:
		return fmt.Errorf("remove %s: address is allocated to %s", a, p.owner[a])
	default:
		return fmt.Errorf("remove %s: address is not in the pool", a)
	}
	delete(p.state, a)
	return nil
}

// Counts returns how many addresses are in each state.
func (p *Pool) Counts() Counts {
	c := Counts{Free: len(p.free), Cooling: len(p.coolUntil), Aside: len(p.asideTill)}
	c.Allocated = len(p.state) - c.Free - c.Cooling - c.Aside
	return c
}

// Held lists every address in the pool, sorted.
func (p *Pool) Held() []netip.Addr {
	out := make([]netip.Addr, 0, len(p.state))
	for a := range p.state {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Due counts the cooling addresses whose rest is over at now: free once
// promoted. It changes nothing (readers such as STATUS use it).
func (p *Pool) Due(now time.Time) int {
	n := 0
	for _, until := range p.coolUntil {
		if !now.Before(until) {
			n++
		}
	}
	return n
}

// NextCooled is when the earliest cooling address becomes free (ok=false
// when none is cooling).
func (p *Pool) NextCooled() (t time.Time, ok bool) {
	for _, until := range p.coolUntil {
		if !ok || until.Before(t) {
			t, ok = until, true
		}
	}
	return t, ok
}
