// Package static is the cloud-less provider: addresses come from ranges in
// the agent's configuration. What the node holds is kept in a small state
// file so that it survives restarts exactly like a cloud's port would.
package static

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/provider"
)

// Provider hands out addresses from static ranges.
type Provider struct {
	ranges []ipam.Range
	nics   []*alloc.NIC // per range: the NIC it lives on (nil: the uplink)
	path   string
	// network is the PodNetwork the provider serves ("": the node's
	// default network, provider.static), see podnetwork.go.
	network string

	// sizes are the usable addresses of each family's ranges (saturated
	// at MaxInt: an IPv6 /64 is 2^64), maxAddrs the most the node holds
	// of one family (maxAddresses).
	sizes    map[family.Family]int
	maxAddrs int

	// blocks, when set, is where the node's blocks come from: addresses
	// are taken only from them (config blocks:); wait bounds one wait
	// for another block.
	blocks BlockSource
	wait   time.Duration

	// guard keeps node addresses and those other hosts answer for out of
	// the pool (guard.go).
	guard Guard

	mu   sync.Mutex
	held map[netip.Addr]bool
	// Under mu, the guard's view: the uplink's addresses, the Nodes'
	// (listed at nodesAt), and what other hosts answered for.
	ownAddrs  []netip.Prefix
	nodeAddrs []netip.Addr
	nodesAt   time.Time
	foreign   map[netip.Addr]inUse
}

// BlockSource is the node's blocks of the ranges, assigned by
// vpcni-controller (nodeblocks.Source, over NodeBlock objects): IPv4
// blocks, IPv6 blocks, or both for a dual-stack node, each family asked
// for on its own.
type BlockSource interface {
	// Blocks lists the node's blocks now, in address order.
	Blocks() []netip.Prefix
	// Taken lists the other nodes' blocks now.
	Taken() []netip.Prefix
	// Want asks for n blocks of family f in all; alone: the node's
	// ranges are of family f only.
	Want(ctx context.Context, f family.Family, n int, alone bool) error
	// WaitFor waits until the node has n blocks of family f or ctx ends,
	// and returns its blocks of f then.
	WaitFor(ctx context.Context, f family.Family, n int) []netip.Prefix
}

var _ provider.Provider = (*Provider)(nil)

func init() {
	provider.Register(provider.Registration{
		Name:        "static",
		NewSettings: func() provider.Settings { return &Config{} },
		New: func(ctx context.Context, node provider.Node, s provider.Settings) (provider.Provider, error) {
			cfg := s.(*Config)
			if err := checkFamilies(cfg, node.Families); err != nil {
				return nil, err
			}
			g, err := nodeGuard(node, cfg)
			if err != nil {
				return nil, err
			}
			var p *Provider
			if cfg.Blocks == nil {
				p, err = New(cfg, node.StateDir)
			} else {
				var src *nodeblocks.Source
				if src, err = connectBlocks(ctx, node); err != nil {
					return nil, err
				}
				p, err = NewInBlocks(cfg, node.StateDir, src)
			}
			if err != nil {
				return nil, err
			}
			p.SetGuard(g)
			return p, nil
		},
		Network:     network,
		NetworkRoom: networkRoom,
		Families:    family.All,
	})
}

// nodeGuard is the guard on a node: its uplink (addresses, ARP) and, with
// Kubernetes on, the Nodes. The uplink's socket lives as long as the
// agent (a provider is never closed).
func nodeGuard(node provider.Node, cfg *Config) (Guard, error) {
	g := Guard{Probe: cfg.Probe.On(), Recheck: cfg.Probe.RecheckDuration(), Notify: node.Notify, Log: node.Log}
	if node.Uplink != "" {
		timeout := cfg.Probe.TimeoutDuration()
		if !g.Probe {
			timeout = 0 // its addresses only: no ARP socket
		}
		u, err := OpenUplink(node.Uplink, timeout)
		if err != nil {
			return g, fmt.Errorf("static provider: %w (probe.enabled: false turns the probe off)", err)
		}
		g.Segment = u
	}
	if node.Kubernetes {
		rc, err := nodeblocks.RestConfig(node.Kubeconfig)
		if err != nil {
			return g, fmt.Errorf("static provider: the Nodes' addresses: %w", err)
		}
		if g.Nodes, err = ClusterNodes(rc); err != nil {
			return g, fmt.Errorf("static provider: %w", err)
		}
	}
	return g, nil
}

// connectBlocks starts the node's view of its NodeBlocks; it runs as long
// as ctx, the agent's. Listing them once is bounded, so an API server that
// cannot be reached fails the connect (the agent retries it).
func connectBlocks(ctx context.Context, node provider.Node) (*nodeblocks.Source, error) {
	rc, err := nodeblocks.RestConfig(node.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("blocks: the static provider's blocks are NodeBlock objects of the cluster: %w", err)
	}
	src, err := nodeblocks.NewSource(rc, node.Name)
	if err != nil {
		return nil, fmt.Errorf("blocks: %w", err)
	}
	listed, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := src.StartUntil(ctx, listed); err != nil {
		return nil, fmt.Errorf("blocks: %w: %w", err, provider.ErrUnavailable)
	}
	return src, nil
}

// NewInBlocks builds the provider in blocks mode: addresses only from the
// node's blocks that src lists (inside cfg's ranges), and another block
// asked for when they are full.
func NewInBlocks(cfg *Config, stateDir string, src BlockSource) (*Provider, error) {
	if cfg.Blocks == nil {
		return nil, errors.New("blocks: not configured")
	}
	p, err := New(cfg, stateDir)
	if err != nil {
		return nil, err
	}
	p.blocks, p.wait = src, cfg.Blocks.WaitDuration()
	return p, nil
}

type stateFile struct {
	Held []netip.Addr `json:"held"`
}

// buildRanges turns the configured ranges into the pool's ranges, each
// with the NIC it lives on (nil: the uplink).
func buildRanges(cfg *Config) (ranges []ipam.Range, nics []*alloc.NIC, err error) {
	for i, r := range cfg.Ranges {
		prefix, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			return nil, nil, fmt.Errorf("ranges[%d]: %w", i, err)
		}
		var gw netip.Addr
		if r.Gateway != "" {
			if gw, err = netip.ParseAddr(r.Gateway); err != nil {
				return nil, nil, fmt.Errorf("ranges[%d].gateway: %w", i, err)
			}
		}
		var nic *alloc.NIC
		if r.NIC != nil {
			hw, err := net.ParseMAC(r.NIC.MAC)
			if err != nil {
				return nil, nil, fmt.Errorf("ranges[%d].nic.mac: %w", i, err)
			}
			a, err := netip.ParseAddr(r.NIC.Address)
			if err != nil {
				return nil, nil, fmt.Errorf("ranges[%d].nic.address: %w", i, err)
			}
			nic = &alloc.NIC{MAC: hw.String(), Address: a}
		}
		var ex []netip.Prefix
		for _, other := range cfg.Ranges { // a NIC's own address is never a pod's
			if a, err := netip.ParseAddr(nicAddress(other)); err == nil {
				ex = append(ex, family.Host(a))
			}
		}
		for _, e := range r.Exclude {
			pe, err := ParseAddrOrPrefix(e)
			if err != nil {
				return nil, nil, fmt.Errorf("ranges[%d].exclude: %w", i, err)
			}
			ex = append(ex, pe)
		}
		rg, err := ipam.NewRange(prefix, gw, ex)
		if err != nil {
			return nil, nil, err
		}
		ranges = append(ranges, rg)
		nics = append(nics, nic)
	}
	return ranges, nics, nil
}

// New builds the provider from config; its state lives in stateDir.
func New(cfg *Config, stateDir string) (*Provider, error) {
	p := &Provider{path: filepath.Join(stateDir, "static-provider.json"), held: map[netip.Addr]bool{}, foreign: map[netip.Addr]inUse{}}
	var err error
	if p.ranges, p.nics, err = buildRanges(cfg); err != nil {
		return nil, err
	}
	p.sizes, p.maxAddrs = sizes(p.ranges), cfg.MaxAddresses
	if p.maxAddrs <= 0 {
		p.maxAddrs = DefaultMaxAddresses
	}
	data, err := os.ReadFile(p.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read static provider state: %w", err)
	default:
		var st stateFile
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("static provider state %s is corrupt: %w", p.path, err)
		}
		for _, a := range st.Held {
			// An address the ranges no longer cover stays held until the
			// agent releases it: nothing in use is dropped silently.
			p.held[a] = true
		}
	}
	return p, nil
}

func nicAddress(r Range) string {
	if r.NIC == nil {
		return ""
	}
	return r.NIC.Address
}

// Assign implements provider.Provider. The pool calls it to grow, not on
// a pod's ADD from a warm pool: the probe's wait (guard.go) is paid here.
// It hands out addresses of the request's family only (req.Fam()).
func (p *Provider) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	fam := req.Fam()
	if !p.serves(fam) {
		return nil, fmt.Errorf("%s has no %s range: %w", p.rangesField(), name(fam), provider.ErrExhausted)
	}
	if p.blocks != nil {
		return p.assignInBlocks(ctx, req)
	}
	p.refreshNodes(ctx)
	got, errs := p.takeRequested(ctx, fam, req.Addresses, nil)
	want := req.Count
	for want > 0 {
		p.mu.Lock()
		picked, full := p.pick(fam, want, func(yield func(netip.Addr) bool) {
			for _, r := range p.ranges {
				if family.Of(r.Prefix.Addr()) != fam {
					continue // an IPv6 range would be walked for ever
				}
				stop := false
				r.All(func(a netip.Addr) bool { stop = !yield(a); return !stop })
				if stop {
					return
				}
			}
		})
		held := p.heldOf(fam)
		p.mu.Unlock()
		if len(picked) == 0 {
			if full {
				errs = append(errs, p.fullError(fam, held))
			} else {
				errs = append(errs, fmt.Errorf("static %s ranges are used up (%d of %d addresses held): %w", name(fam), held, p.capacityOf(fam).Max, provider.ErrExhausted))
			}
			break
		}
		kept, _, err := p.vet(ctx, picked)
		if err != nil {
			errs = append(errs, err)
			break
		}
		got, want = append(got, kept...), want-len(kept)
	}
	return p.finish(got, errs)
}

// takeRequested takes the addresses a request for family fam names, each
// if it is of fam, free, usable, in one of blocks (when blocks is not
// nil), no node's, no other host answers for it, and the node holds fewer
// than maxAddresses of fam.
func (p *Provider) takeRequested(ctx context.Context, fam family.Family, addrs []netip.Addr, blocks []netip.Prefix) (got []netip.Addr, errs []error) {
	p.mu.Lock()
	var picked []netip.Addr
	held := p.heldOf(fam)
	for _, a := range addrs {
		why := p.avoided(a)
		switch {
		case family.Of(a) != fam:
			errs = append(errs, fmt.Errorf("%s is not an %s address, which this request is for: %w", a, name(fam), provider.ErrOutside))
		case p.held[a]:
			errs = append(errs, fmt.Errorf("%s: %w", a, provider.ErrTaken))
		case !p.usable(a):
			errs = append(errs, fmt.Errorf("%s is not in the configured ranges: %w", a, provider.ErrOutside))
		case blocks != nil && !inAny(blocks, a):
			errs = append(errs, fmt.Errorf("%s is not in one of this node's blocks %v (another node's, or none's yet): %w", a, blocks, provider.ErrTaken))
		case why != "":
			errs = append(errs, fmt.Errorf("%s: %s: %w", a, why, provider.ErrTaken))
		case held+len(picked) >= p.maxAddrs:
			errs = append(errs, fmt.Errorf("%s: %w", a, p.fullError(fam, held+len(picked))))
		default:
			p.held[a] = true
			picked = append(picked, a)
		}
	}
	p.mu.Unlock()
	kept, refused, err := p.vet(ctx, picked)
	if err != nil {
		return nil, append(errs, err)
	}
	if len(refused) > 0 {
		errs = append(errs, fmt.Errorf("%s: %w", describe(refused), provider.ErrTaken))
	}
	return kept, errs
}

// pick takes up to want addresses of family f of each's that are free,
// usable and avoided by nothing, never past maxAddresses of f (full: that
// bound cut want); called with p.mu held.
func (p *Provider) pick(f family.Family, want int, each func(yield func(netip.Addr) bool)) (out []netip.Addr, full bool) {
	if room := p.maxAddrs - p.heldOf(f); want > room {
		want, full = room, true
	}
	if want <= 0 {
		return nil, full
	}
	each(func(a netip.Addr) bool {
		if family.Of(a) == f && !p.held[a] && p.usable(a) && p.avoided(a) == "" {
			p.held[a] = true
			out = append(out, a)
		}
		return len(out) < want
	})
	return out, full
}

// finish saves what a request took; if the state cannot be written
// nothing is taken.
func (p *Provider) finish(got []netip.Addr, errs []error) ([]alloc.Lease, error) {
	if len(got) > 0 {
		p.mu.Lock()
		err := p.save()
		if err != nil {
			for _, a := range got {
				delete(p.held, a)
			}
		}
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return p.leases(got), errors.Join(errs...)
}

// Release implements provider.Provider.
func (p *Provider) Release(_ context.Context, addrs []netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gone []netip.Addr
	for _, a := range addrs {
		if p.held[a] {
			delete(p.held, a)
			gone = append(gone, a)
		}
	}
	if err := p.save(); err != nil {
		for _, a := range gone {
			p.held[a] = true
		}
		return err
	}
	return nil
}

// Held implements provider.Provider.
func (p *Provider) Held(context.Context) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocks != nil {
		if err := p.dropOutsideBlocks(); err != nil {
			return nil, err
		}
	}
	out := make([]netip.Addr, 0, len(p.held))
	for a := range p.held {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return p.leases(out), nil
}

// leases says where each address lives: the range's subnet, gateway and
// NIC. An address the ranges no longer cover (held from an older config)
// has none of them.
func (p *Provider) leases(addrs []netip.Addr) []alloc.Lease {
	out := make([]alloc.Lease, len(addrs))
	for i, a := range addrs {
		out[i] = alloc.Lease{Address: a}
		// The range that hands the address out, else one whose subnet
		// has it (ranges may share a subnet and split it by excludes).
		j := slices.IndexFunc(p.ranges, func(r ipam.Range) bool { return r.Usable(a) })
		if j < 0 {
			j = slices.IndexFunc(p.ranges, func(r ipam.Range) bool { return r.Prefix.Contains(a) })
		}
		if j >= 0 {
			r := p.ranges[j]
			out[i].Prefix, out[i].Gateway, out[i].NIC = r.Prefix, r.Gateway, p.nics[j]
		}
	}
	return out
}

// Info implements provider.Provider: each family's capacity in
// Capacities, and the first family's (IPv4 when there are IPv4 ranges) in
// Capacity, as a single-family agent reads it. Counted in closed form:
// nothing walks an IPv6 range.
func (p *Provider) Info() provider.Info {
	info := provider.Info{Name: "static", Capacities: map[family.Family]provider.Capacity{}}
	for _, f := range p.families() {
		info.Capacities[f] = p.capacityOf(f)
	}
	if fams := p.families(); len(fams) > 0 {
		c := info.Capacities[fams[0]]
		info.Capacity, info.CapacityReason = c.Max, c.Reason
	}
	if p.network != "" {
		var rs []string
		for _, r := range p.ranges {
			rs = append(rs, fmt.Sprintf("%s (gateway %s)", r.Prefix, r.Gateway))
		}
		info.Subnet = fmt.Sprintf("pod network %s: ranges %s", p.network, strings.Join(rs, ", "))
	}
	return info
}

func (p *Provider) usable(a netip.Addr) bool {
	for _, r := range p.ranges {
		if r.Usable(a) {
			return true
		}
	}
	return false
}

// save writes the held set atomically: temp file, fsync, rename.
func (p *Provider) save() error {
	st := stateFile{Held: make([]netip.Addr, 0, len(p.held))}
	for a := range p.held {
		st.Held = append(st.Held, a)
	}
	slices.SortFunc(st.Held, netip.Addr.Compare)
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return WriteFileAtomic(p.path, data, 0o600)
}

// WriteFileAtomic replaces path with data so that a crash leaves either the
// old or the new content, never a torn file.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err = tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
