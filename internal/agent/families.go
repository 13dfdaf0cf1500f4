package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// Address families: a node whose pods get more than one family (ipFamilies
// [ipv4, ipv6]) runs one address manager per family on the default
// network — its own warm pool, cooldown, refill and capacity — over one
// provider, which each manager sees through its family alone (onFamily).
// An ADD takes one address of every family or none (takeAll), and the
// record holds them all: its first family's where every release reads
// it (Lease), the others beside it (Others). A.addrs is the first
// family's manager, which everything that speaks of "the pool" reads;
// PodNetworks serve one family, the node's first.

// checkFamilies refuses families the provider or the datapath mode does
// not serve, naming those that do, before either starts.
func checkFamilies(fams []family.Family, provName string, prov provider.Registration, modeName string, mode datapath.Registration) error {
	has := func(declared []family.Family, f family.Family) bool {
		if declared == nil {
			return f == family.V4
		}
		return family.Has(declared, f)
	}
	for _, f := range fams {
		if !has(prov.Families, f) {
			var ok []string
			for _, n := range provider.Names() {
				if r, err := provider.Lookup(n); err == nil && has(r.Families, f) {
					ok = append(ok, n)
				}
			}
			return fmt.Errorf("ipFamilies names %s, which provider %s does not serve (providers that do: %v)", f, provName, ok)
		}
		if !has(mode.Families, f) {
			var ok []string
			for _, n := range datapath.Names() {
				if r, err := datapath.Lookup(n); err == nil && has(r.Families, f) {
					ok = append(ok, n)
				}
			}
			return fmt.Errorf("ipFamilies names %s, which datapath %s does not wire (modes that do: %v)", f, modeName, ok)
		}
	}
	return nil
}

// sharedProvider connects the node's provider once for the managers of
// every family: the first to need it connects, a failure is retried by
// the next.
type sharedProvider struct {
	connect addresses.Connect
	mu      sync.Mutex
	p       provider.Provider
}

func (s *sharedProvider) get(ctx context.Context) (provider.Provider, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		return s.p, nil
	}
	p, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	s.p = p
	return p, nil
}

// family is a manager's connect: the shared provider, seen through f.
func (s *sharedProvider) family(f family.Family) addresses.Connect {
	return func(ctx context.Context) (provider.Provider, error) {
		p, err := s.get(ctx)
		if err != nil {
			return nil, err
		}
		return onFamily{p, f}, nil
	}
}

// onFamily is a provider as one family's manager sees it: asked for
// addresses of that family, holding only those, with that family's
// capacity.
type onFamily struct {
	provider.Provider
	fam family.Family
}

func (o onFamily) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	req.Family = o.fam
	var out []netip.Addr
	for _, a := range req.Addresses {
		if family.Of(a) == o.fam {
			out = append(out, a)
		}
	}
	req.Addresses = out
	return o.Provider.Assign(ctx, req)
}

func (o onFamily) Held(ctx context.Context) ([]alloc.Lease, error) {
	ls, err := o.Provider.Held(ctx)
	return slices.DeleteFunc(ls, func(l alloc.Lease) bool { return family.Of(l.Address) != o.fam }), err
}

func (o onFamily) Info() provider.Info {
	i := o.Provider.Info()
	if c, ok := i.Capacities[o.fam]; ok {
		i.Capacity, i.CapacityReason = c.Max, c.Reason
	}
	return i
}

// familyPool is the manager that gives out lease l of record rec: its
// PodNetwork's, or the default network's pool of l's family.
func (a *Agent) familyPool(rec *alloc.Allocation, l alloc.Lease) *addresses.Manager {
	if rec.PodNetwork != "" || l.Address == rec.Address {
		return a.pool(rec)
	}
	if m := a.fams[family.Of(l.Address)]; m != nil {
		return m
	}
	// A family the node no longer serves (ipFamilies changed with pods
	// on it): the first family's manager knows nothing of the address
	// and lets it go as unknown.
	return a.addrs
}

// otherPools are the default network's managers of the families after
// the first, in the configured order.
func (a *Agent) otherPools() []*addresses.Manager {
	var out []*addresses.Manager
	for _, f := range a.cfg.Families()[1:] {
		out = append(out, a.fams[f])
	}
	return out
}

// view is rec as the manager of its lease l sees it: that lease alone,
// under the record's key.
func view(rec *alloc.Allocation, l alloc.Lease) *alloc.Allocation {
	v := *rec
	v.Lease, v.Others = l, nil
	return &v
}

// restoreFamilies puts the default network's records, cooling and leaving
// addresses back into the pools of their families. A record goes to each
// family's pool with that family's lease; it conflicts when any of its
// addresses is another record's.
func (a *Agent) restoreFamilies(recs []*alloc.Allocation, cooling map[netip.Addr]time.Time, leaving []netip.Addr) ([]*alloc.Allocation, error) {
	now := time.Now()
	byKey := map[string]*alloc.Allocation{}
	views := map[family.Family][]*alloc.Allocation{}
	for _, r := range recs {
		byKey[r.Key()] = r
		for _, l := range r.Leases() {
			f := family.Of(l.Address)
			if a.fams[f] == nil {
				// A family the node serves no more: its address is
				// still the pod's, and goes at its DEL.
				a.log.Warn("record holds an address of a family ipFamilies no longer names; it is kept with its pod but no pool knows it", "record", r.Key(), "address", l.Address)
				continue
			}
			views[f] = append(views[f], view(r, l))
		}
	}
	cool := map[family.Family]map[netip.Addr]time.Time{}
	for ip, until := range cooling {
		f := family.Of(ip)
		if cool[f] == nil {
			cool[f] = map[netip.Addr]time.Time{}
		}
		cool[f][ip] = until
	}
	leave := map[family.Family][]netip.Addr{}
	for _, ip := range leaving {
		leave[family.Of(ip)] = append(leave[family.Of(ip)], ip)
	}
	var conflicts []*alloc.Allocation
	seen := map[string]bool{}
	for _, f := range a.cfg.Families() {
		c, err := a.fams[f].Restore(views[f], cool[f], leave[f], now)
		if err != nil {
			return nil, err
		}
		for _, v := range c {
			if !seen[v.Key()] {
				seen[v.Key()] = true
				conflicts = append(conflicts, byKey[v.Key()])
			}
		}
	}
	return conflicts, nil
}

// takeAll takes one address of each family for the attachment key, from
// pools (one per family, in fams' order): the one wants names for a
// family, else any. All or none: when one family has none, the addresses
// already taken go back first in line, and the error names the family.
func takeAll(ctx context.Context, key string, pools []*addresses.Manager, fams []family.Family, wants map[family.Family]netip.Addr) ([]alloc.Lease, error) {
	var got []alloc.Lease
	for i, pool := range pools {
		var l alloc.Lease
		var err error
		if w := wants[fams[i]]; w.IsValid() {
			l, err = pool.TakeAddress(ctx, key, w)
		} else {
			l, err = pool.Take(ctx, key)
		}
		if err != nil {
			for j, g := range got {
				if wants[fams[j]].IsValid() {
					// Asked for by name: the pod's, not the node's;
					// it leaves as a failed ADD's requested address does.
					_ = pools[j].GiveBackLater(key, g.Address)
				} else {
					pools[j].Untake(g.Address)
				}
			}
			if len(pools) > 1 {
				err = familyError(fams[i], err)
			}
			return nil, err
		}
		got = append(got, l)
	}
	return got, nil
}

// familyError says which family's address an ADD could not get, keeping
// the error's kind (a Shortage stays one, so the runtime tries again).
func familyError(f family.Family, err error) error {
	var s *addresses.Shortage
	if errors.As(err, &s) {
		c := *s
		c.Msg = fmt.Sprintf("no %s address: %s", f, s.Msg)
		return &c
	}
	var bad *addresses.BadRequest
	if errors.As(err, &bad) {
		c := *bad
		c.Msg = fmt.Sprintf("%s: %s", f, bad.Msg)
		return &c
	}
	return fmt.Errorf("%s: %w", f, err)
}

// addrList writes addresses for a message: "10.0.0.5, fd00::5".
func addrList(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// poolsReady: every family's pool could serve an ADD now; else why not
// (the first family's reason, or the family whose pool is not ready).
func (a *Agent) poolsReady(now time.Time) (bool, string) {
	s := a.addrs.Status(now)
	if !s.Ready {
		return false, s.Reason
	}
	for _, f := range a.cfg.Families()[1:] {
		if o := a.fams[f].Status(now); !o.Ready {
			return false, fmt.Sprintf("%s pool: %s", f, o.Reason)
		}
	}
	return true, s.Reason
}
