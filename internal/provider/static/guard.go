package static

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// Segment is the node's segment as the provider asks of it before an
// address enters the node's pool (Uplink on a node).
type Segment interface {
	// Addresses are the node's own addresses on it now, IPv4 and IPv6,
	// with their prefix lengths (the subnets on the segment: those ARP
	// and neighbour solicitations reach).
	Addresses() ([]netip.Prefix, error)
	// Probe asks who holds addrs (IPv4 by ARP, IPv6 by a DAD neighbour
	// solicitation) and returns those another host answered for, with
	// the MAC that answered.
	Probe(ctx context.Context, addrs []netip.Addr) (map[netip.Addr]net.HardwareAddr, error)
}

// Guard keeps the provider from handing out an address that a node, the
// gateway or another host on the segment holds. The gateway and the
// ranges' excludes are out of the ranges already (ipam.Range); the guard
// adds what changes at run time.
//
// In blocks mode the agent, not vpcni-controller, keeps node addresses
// out: the controller cuts aligned blocks and never learns of a host
// outside the cluster, while the node sees its segment and every Node; an
// address that becomes a node's after its block was cut (a node joining)
// is skipped the same way, with no block to re-cut. The cost is that
// address, inside a block: a block stays aligned.
type Guard struct {
	// Segment is the uplink (nil: none to ask, as in tests without a
	// kernel: no node address of its own and no probe).
	Segment Segment
	// Probe: probe each address on Segment before handing it out.
	Probe bool
	// Nodes lists every Node's addresses (nil: Kubernetes is off). It is
	// asked at most every nodesTTL.
	Nodes func(ctx context.Context) ([]netip.Addr, error)
	// Recheck is how long an address another host answered for stays set
	// aside before it is probed again.
	Recheck time.Duration
	// Notify hears of each address found in use (nil: nobody).
	Notify func(provider.Notice)
	Log    *slog.Logger
}

// nodesTTL bounds how stale the Nodes' addresses may be: a node that
// joins is avoided within it, and probed (it answers ARP) meanwhile.
const nodesTTL = 30 * time.Second

// inUse is an address another host answered for.
type inUse struct {
	mac   string
	until time.Time
}

// SetGuard arms the guard; call it before the provider is used.
func (p *Provider) SetGuard(g Guard) {
	if g.Log == nil {
		g.Log = slog.Default()
	}
	p.guard = g
}

// refreshNodes learns the node addresses to avoid: the segment's own now,
// the Nodes' when nodesTTL has passed. A failed read keeps what was known
// (and is logged): the probe still catches a node on the segment.
func (p *Provider) refreshNodes(ctx context.Context) {
	g := p.guard
	var own []netip.Prefix
	if g.Segment != nil {
		var err error
		if own, err = g.Segment.Addresses(); err != nil {
			g.Log.Warn("static provider: cannot read the uplink's addresses to keep them from pods", "err", err)
		}
	}
	p.mu.Lock()
	stale := g.Nodes != nil && time.Since(p.nodesAt) > nodesTTL
	p.mu.Unlock()
	var nodes []netip.Addr
	if stale {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		nodes, err = g.Nodes(c)
		cancel()
		if err != nil {
			g.Log.Warn("static provider: cannot list the Nodes' addresses to keep them from pods", "err", err)
			stale = false
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ownAddrs = own
	if stale {
		p.nodeAddrs, p.nodesAt = nodes, time.Now()
	}
}

// avoided says why a must not be handed out now ("" if it may), called
// with p.mu held.
func (p *Provider) avoided(a netip.Addr) string {
	switch {
	case slices.ContainsFunc(p.ownAddrs, func(o netip.Prefix) bool { return o.Addr() == a }):
		return "it is this node's own address (on the uplink)"
	case slices.Contains(p.nodeAddrs, a):
		return "it is a Node's address (InternalIP or ExternalIP)"
	}
	if u, ok := p.foreign[a]; ok {
		if time.Now().Before(u.until) {
			return fmt.Sprintf("host %s answered %s for it (probed again after %s)", u.mac, probeName(a), u.until.Format(time.RFC3339))
		}
		delete(p.foreign, a)
	}
	return ""
}

// vet probes picked (held already, so nothing else takes them meanwhile)
// and lets go of those another host answered for: they are set aside for
// Recheck and said. It returns the rest, and why each let go was.
func (p *Provider) vet(ctx context.Context, picked []netip.Addr) (kept []netip.Addr, refused map[netip.Addr]string, err error) {
	if !p.guard.Probe || p.guard.Segment == nil || len(picked) == 0 {
		return picked, nil, nil
	}
	// ARP and neighbour solicitations reach the uplink's own subnets
	// only: an address of a range on a second NIC (range.nic, another
	// segment) or off the uplink's subnets (a routed pod subnet, which no
	// host on the segment holds) is not asked for.
	p.mu.Lock()
	var onUplink []netip.Addr
	for _, a := range picked {
		j := slices.IndexFunc(p.ranges, func(r ipam.Range) bool { return r.Usable(a) })
		onLink := slices.ContainsFunc(p.ownAddrs, func(o netip.Prefix) bool { return o.Masked().Contains(a) })
		if j >= 0 && p.nics[j] == nil && onLink {
			onUplink = append(onUplink, a)
		}
	}
	p.mu.Unlock()
	if len(onUplink) == 0 {
		return picked, nil, nil
	}
	found, err := p.guard.Segment.Probe(ctx, onUplink)
	if err != nil {
		p.mu.Lock()
		for _, a := range picked {
			delete(p.held, a)
		}
		p.mu.Unlock()
		return nil, nil, fmt.Errorf("static provider: probe before handing addresses out: %w: %w", err, provider.ErrUnavailable)
	}
	if len(found) == 0 {
		return picked, nil, nil
	}
	refused = map[netip.Addr]string{}
	until := time.Now().Add(p.guard.Recheck)
	p.mu.Lock()
	for _, a := range picked {
		mac, ok := found[a]
		if !ok {
			kept = append(kept, a)
			continue
		}
		delete(p.held, a)
		p.foreign[a] = inUse{mac: mac.String(), until: until}
		refused[a] = fmt.Sprintf("host %s answered %s for it", mac, probeName(a))
	}
	p.mu.Unlock()
	for a, why := range refused {
		msg := fmt.Sprintf("%s is in the static ranges but %s on the node's segment: it is not handed to a pod, and is probed again in %s "+
			"(exclude it in provider.static.ranges[].exclude if that host keeps it)", a, why, p.guard.Recheck)
		if p.guard.Notify != nil {
			kind := "arp_reply"
			if a.Is6() {
				kind = "neighbour_advertisement"
			}
			p.guard.Notify(provider.Notice{Reason: provider.ReasonAddressInUse, Kind: kind, Message: msg,
				Attrs: []any{"address", a.String(), "mac", found[a].String()}})
		} else {
			p.guard.Log.Warn(msg, "reason", provider.ReasonAddressInUse, "address", a.String(), "mac", found[a].String())
		}
	}
	return kept, refused, nil
}

// describe lists refusals for an error.
func describe(refused map[netip.Addr]string) string {
	var out []string
	for a, why := range refused {
		out = append(out, a.String()+": "+why)
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// probeName names the probe another host answered for a.
func probeName(a netip.Addr) string {
	if a.Is6() {
		return "a neighbour solicitation (NDP)"
	}
	return "ARP"
}
