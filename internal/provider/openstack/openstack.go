// Package openstack takes pod addresses from Neutron: extra fixed IPs on
// the node's VM port (and, past maxAddresses, on secondary NICs), allowed
// address pairs, or ports of their own attached to the VM through Nova
// (passthrough).
//
// What the real neutron-server does (../shared NEUTRON-FACTS, checked by
// the contract tests) shapes every write here: a PUT replaces the whole
// fixed_ips list and concurrent PUTs race, so there is one writer per VM
// port inside the agent, every new address is named explicitly (a
// subnet-only entry can hand one IP to two callers), every PUT carries
// If-Match: revision_number=N and a 412 re-reads and retries, and adds or
// removes go in batches. vpcni marks the addresses it owns in the port's
// description in the same PUT; an address without the mark — one a person
// added — is never removed.
package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// Provider is one node's view of Neutron.
type Provider struct {
	nc      *gophercloud.ServiceClient
	cc      *gophercloud.ServiceClient // Nova, when the mode attaches NICs
	cfg     Config
	calls   *callCounter
	subnet  netip.Prefix
	gateway netip.Addr
	pools   [][2]netip.Addr
	// subnetHow says how the pods' subnet was settled: configured, or
	// discovered from the VM port (for status and doctor).
	subnetHow string
	portID    string
	// nodeIP is the address the VM port was looked up by (portLookup ip).
	nodeIP netip.Addr
	// nets: the subnets read so far by ID (the pods' subnet, those
	// selected, those secondary NICs are on); selected: the IDs subnets or
	// subnetTags select, in order (see subnets.go).
	nets     map[string]*subnetInfo
	selected []string
	podMACs  bool // pairs carry each pod's own MAC (see podmacs.go)
	// instanceID is the node's Nova server: where NICs are attached.
	instanceID string
	// network is the PodNetwork this provider serves ("": the node's
	// default network), groups its security groups: every address is on
	// a NIC of the network's own, never on the VM port (podnetwork.go).
	network string
	groups  []string
	// slotsFree is the VM's free NIC slots at the last count, plus one (0:
	// never counted), and ownNICs this provider's NICs at its last
	// listing: Info reads them without the lock.
	slotsFree atomic.Int64
	ownNICs   atomic.Int64
	// notify is told of races with other writers (provider.Node.Notify);
	// nil: nobody listens.
	notify func(provider.Notice)
	// v6 is the IPv6 side of a dual-stack node (nil: IPv4 only), and
	// parent, on that side, the IPv4 side whose mu guards both (v6.go).
	v6, parent *Provider
	// block is, on the IPv6 side in modeV6 prefix-pair, the node's /96
	// (prefixpair.go).
	block netip.Prefix

	mu     sync.Mutex // one writer per VM port
	port   *ports.Port
	portAt time.Time           // when port was read
	used   map[netip.Addr]bool // addresses of the subnet others hold, as last seen
	usedAt time.Time
	// usedListing: a background listing of used is under way.
	usedListing bool
}

var _ provider.Provider = (*Provider)(nil)

func init() {
	provider.Register(provider.Registration{
		Name:        "openstack",
		NewSettings: func() provider.Settings { return &Config{} },
		Families:    []family.Family{family.V4, family.V6},
		Doctor: &provider.Doctor{API: "neutron", Diagnose: func(ctx context.Context, s provider.Settings, node provider.DoctorNode) []provider.Step {
			return Diagnose(ctx, *s.(*Config), node)
		}},
		NetworkNICs: true,
		NetworkRoom: func(s provider.Settings, spec json.RawMessage, def provider.Info) (int, bool) {
			return networkRoom(*s.(*Config), spec, def)
		},
		Network: func(ctx context.Context, node provider.Node, s provider.Settings, name string, spec json.RawMessage) (provider.Provider, error) {
			p, err := NewNetwork(ctx, *s.(*Config), node.IP, name, spec)
			if err != nil {
				return nil, err
			}
			p.(*network).p.notify = node.Notify
			return p, nil
		},
		New: func(ctx context.Context, node provider.Node, s provider.Settings) (provider.Provider, error) {
			p, err := NewFamilies(ctx, *s.(*Config), node.IP, node.Families)
			if err != nil {
				return nil, err
			}
			p.notify = node.Notify
			if p.v6 != nil {
				p.v6.notify = node.Notify
			}
			if err := p.matchMACs(ctx, node.PodMACs); err != nil {
				return nil, err
			}
			return p, nil
		},
	})
}

// New logs in, finds the subnet and this node's VM port. cfg has had its
// Defaults. It serves IPv4, and IPv6 too when cfg names subnetIDv6.
func New(ctx context.Context, cfg Config, nodeIP netip.Addr) (*Provider, error) {
	return open(ctx, cfg, nodeIP, nil)
}

// NewFamilies is New for a node whose pods get fams (ipFamilies): with
// IPv6 among them, it settles the pods' IPv6 subnet too (v6.go).
func NewFamilies(ctx context.Context, cfg Config, nodeIP netip.Addr, fams []family.Family) (*Provider, error) {
	return openFamilies(ctx, cfg, nodeIP, nil, fams)
}

// open is New with its requests going through rt (nil: the transport
// cfg's caBundle, insecure and proxy make).
func open(ctx context.Context, cfg Config, nodeIP netip.Addr, rt http.RoundTripper) (*Provider, error) {
	return openFamilies(ctx, cfg, nodeIP, rt, nil)
}

func openFamilies(ctx context.Context, cfg Config, nodeIP netip.Addr, rt http.RoundTripper, fams []family.Family) (*Provider, error) {
	if wantsV6(cfg, fams) {
		if err := cfg.v6Refused(); err != nil {
			return nil, err // before any request: it is the configuration's
		}
	}
	p, err := connect(ctx, cfg, rt)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	if p.cfg.SubnetID != "" {
		networkID, err := p.readSubnet(ctx)
		if err != nil {
			return nil, err
		}
		if err := p.findPort(ctx, networkID, nodeIP); err != nil {
			return nil, err
		}
	} else {
		if err := p.findPort(ctx, "", nodeIP); err != nil {
			return nil, err
		}
		if err := p.discoverSubnet(ctx); err != nil {
			return nil, err
		}
	}
	if err := p.findInstance(); err != nil {
		return nil, err
	}
	if _, err := p.checkPolicy(ctx); err != nil {
		return nil, err
	}
	if wantsV6(p.cfg, fams) {
		if err := p.setupV6(ctx); err != nil {
			return nil, err
		}
	}
	// Learn the subnet's used addresses now, not on the first ADD that
	// finds the pool empty (it is read again only on a conflict).
	_ = p.refreshUsed(ctx)
	return p, nil
}

// connect logs in (Keystone) or readies the noauth clients; its requests
// go through rt (nil: cfg's transport).
func connect(ctx context.Context, cfg Config, rt http.RoundTripper) (*Provider, error) {
	rt, err := cfg.roundTripper(rt)
	if err != nil {
		return nil, err
	}
	calls := &callCounter{next: rt}
	nc, cc, err := clients(ctx, cfg, calls)
	if err != nil {
		return nil, err
	}
	return &Provider{nc: nc, cc: cc, cfg: cfg, calls: calls}, nil
}

// readSubnet reads the pods' subnet: its CIDR, gateway and allocation
// pools; it returns its network.
func (p *Provider) readSubnet(ctx context.Context) (networkID string, err error) {
	s, err := p.subnetInfo(ctx, p.cfg.SubnetID)
	if err != nil {
		return "", err
	}
	p.subnet, p.gateway, p.pools = s.prefix, s.gateway, s.pools
	if p.subnetHow == "" {
		p.subnetHow = "configured (subnetID)"
	}
	return s.networkID, nil
}

// findInstance settles the node's Nova server: the configured one, else
// the VM port's device.
func (p *Provider) findInstance() error {
	if p.instanceID = p.cfg.InstanceID; p.instanceID == "" {
		p.instanceID = p.port.DeviceID
	}
	if p.cfg.usesNova() && p.instanceID == "" {
		return fmt.Errorf("VM port %s has no device_id: set instanceID (the node's Nova server), which mode %s needs to attach NICs", p.portID, p.cfg.Mode)
	}
	return nil
}

// findPort finds this node's VM port by its IP or by instance ID, on
// networkID ("": on any network, the subnet being discovered from the
// port).
func (p *Provider) findPort(ctx context.Context, networkID string, nodeIP netip.Addr) error {
	opts := ports.ListOpts{NetworkID: networkID}
	what := ""
	switch p.cfg.PortLookup {
	case "instance":
		opts.DeviceID = p.cfg.InstanceID
		what = "device_id " + p.cfg.InstanceID
	default:
		if p.cfg.NodeIP != "" {
			// Validate checks it, but callers that build a Config in code
			// may not have run it: an error, never a panic.
			ip, err := netip.ParseAddr(p.cfg.NodeIP)
			if err != nil {
				return fmt.Errorf("nodeIP %q is not an IP address", p.cfg.NodeIP)
			}
			nodeIP = ip
		}
		if !nodeIP.IsValid() {
			return errors.New("no node IP to find the VM port by: set provider.openstack.nodeIP or instanceID")
		}
		opts.FixedIPs = []ports.FixedIPOpts{{IPAddress: nodeIP.String()}}
		what = "fixed IP " + nodeIP.String()
		p.nodeIP = nodeIP
	}
	pages, err := ports.List(p.nc, opts).AllPages(ctx)
	if err != nil {
		return explain(fmt.Errorf("look up the VM port by %s: %w", what, err))
	}
	found, err := ports.ExtractPorts(pages)
	if err != nil {
		return err
	}
	if networkID == "" {
		// On every network, the VM's own NICs that vpcni attached
		// (secondary, passthrough) carry its device_id too: they are not
		// the VM port.
		found = slices.DeleteFunc(found, func(port ports.Port) bool { _, ours := NICOf(port.Name); return ours })
	}
	switch {
	case len(found) == 0 && networkID == "":
		return fmt.Errorf("no Neutron port has %s: is this node's IP (or instanceID) right?", what)
	case len(found) > 1 && networkID == "":
		ids := make([]string, len(found))
		for i := range found {
			ids[i] = found[i].ID
		}
		return fmt.Errorf("%d Neutron ports have %s (%v): set subnetID (the pods' subnet), or portLookup: ip with the node's address", len(found), what, ids)
	}
	switch len(found) {
	case 0:
		return fmt.Errorf("no Neutron port on network %s has %s: is this node's IP (or instanceID) right, and is the node on the pods' network?", networkID, what)
	case 1:
		p.portID, p.port = found[0].ID, &found[0]
		return nil
	default:
		ids := make([]string, len(found))
		for i := range found {
			ids[i] = found[i].ID
		}
		return fmt.Errorf("%d Neutron ports have %s (%v): set portLookup: instance", len(found), what, ids)
	}
}

// PortID is the VM port the provider writes to.
func (p *Provider) PortID() string { return p.portID }

// Info implements provider.Provider: the VM port, what bounds the
// addresses it may hold, and the HTTP requests made so far by method.
func (p *Provider) Info() provider.Info {
	i := provider.Info{Name: "openstack", Port: p.portID, Calls: p.calls.snapshot()}
	limit, why := p.cfg.MaxAddresses, fmt.Sprintf("maxAddresses %d", p.cfg.MaxAddresses)
	switch {
	case p.cfg.Mode == "passthrough":
		limit = min(p.cfg.MaxAddresses, p.cfg.MaxNICs-1)
		why = fmt.Sprintf("maxNICs %d less the VM's primary NIC: one NIC per passthrough pod", p.cfg.MaxNICs)
		if limit == p.cfg.MaxAddresses {
			why = fmt.Sprintf("maxAddresses %d", p.cfg.MaxAddresses)
		}
	case p.cfg.SecondaryNICs > 0:
		limit = min(p.cfg.MaxAddresses, marksFit(p.subnet)) + p.cfg.SecondaryNICs*p.cfg.MaxAddresses
		why = fmt.Sprintf("maxAddresses %d on the VM port and on each of %d secondary NICs (secondaryNICs)", p.cfg.MaxAddresses, p.cfg.SecondaryNICs)
	case p.cfg.Mode == "address-pairs":
		if p.cfg.MaxAddressPairs < limit {
			limit, why = p.cfg.MaxAddressPairs, fmt.Sprintf("Neutron's max_allowed_address_pair %d (maxAddressPairs)", p.cfg.MaxAddressPairs)
		}
	default:
		if fit := marksFit(p.subnet); fit < limit {
			limit, why = fit, fmt.Sprintf("the ownership marks of %d addresses that fit the port's description on subnet %s", fit, p.subnet)
		}
	}
	i.Capacity, i.CapacityReason = limit, why
	if p.v6 != nil {
		i.Capacities = map[family.Family]provider.Capacity{family.V4: {Max: limit, Reason: why}, family.V6: p.capacityV6()}
	}
	i.FreeNICs = -1
	if free, ok := p.freeSlots(); ok {
		i.FreeNICs = free
	} else if p.cc == nil {
		i.FreeNICs = 0 // without Nova no NIC is attached
	}
	if p.subnet.IsValid() {
		i.Subnet = p.SubnetSource()
	}
	if p.v6 != nil {
		i.Subnet += fmt.Sprintf("; IPv6 subnet %s (%s), %s", p.v6.cfg.SubnetID, p.v6.subnet, p.v6.subnetHow)
	}
	return i
}

// lease says where an address of the node lives: the subnet, its gateway,
// and the VM port (in address-pairs mode too: the pair is on the VM port).
func (p *Provider) lease(a netip.Addr) alloc.Lease {
	return alloc.Lease{Address: a, Prefix: p.subnet, Gateway: p.gateway, Interface: p.portID}
}

func (p *Provider) leases(addrs []netip.Addr) []alloc.Lease {
	out := make([]alloc.Lease, len(addrs))
	for i, a := range addrs {
		out[i] = p.lease(a)
	}
	return out
}

// Held implements provider.Provider: the port's fixed IPs on the subnet
// that carry vpcni's mark (and the pod addresses of vpcni's secondary
// NICs), or vpcni's passthrough NICs.
func (p *Provider) Held(ctx context.Context) ([]alloc.Lease, error) {
	if p.cfg.Mode == "passthrough" {
		return p.heldPassthrough(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	addrs, err := p.heldLocked(ctx)
	out := p.leases(addrs)
	if err == nil && p.v6 != nil {
		var more []alloc.Lease
		more, err = p.heldV6(ctx)
		out = append(out, more...)
	}
	if err == nil && p.cfg.SecondaryNICs > 0 {
		var more []alloc.Lease
		more, err = p.heldSecondary(ctx)
		out = append(out, more...)
	}
	if err == nil && p.cc != nil {
		// The VM's free NIC slots, for Info.FreeNICs: what a PodNetwork
		// the node does not serve yet could get. A failed count keeps the
		// last one; the addresses are what this call is for.
		_, _ = p.nicRoom(ctx)
	}
	return out, err
}

func (p *Provider) heldLocked(ctx context.Context) ([]netip.Addr, error) {
	if err := p.refresh(ctx); err != nil {
		return nil, err
	}
	if p.cfg.Mode == "address-pairs" {
		return p.heldPairs(ctx)
	}
	_, marked, on, err := p.state()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for a := range marked {
		if on[a] {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// state reads the cached port: its description without marks, the marked
// addresses, and its fixed IPs on the subnet.
func (p *Provider) state() (rest string, marked, on map[netip.Addr]bool, err error) {
	return p.stateOf(p.port)
}

// stateOf reads a copy of the VM port as state does.
func (p *Provider) stateOf(port *ports.Port) (rest string, marked, on map[netip.Addr]bool, err error) {
	rest, marked, err = splitMarks(port.Description, p.subnet)
	if err != nil {
		return "", nil, nil, fmt.Errorf("port %s: %w", p.portID, err)
	}
	on = map[netip.Addr]bool{}
	for _, f := range port.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == p.cfg.SubnetID {
			on[a] = true
		}
	}
	return rest, marked, on, nil
}

// refreshIfStale re-reads the VM port unless the provider read it back
// itself moments ago: a write on a stale copy fails its If-Match, and the
// read-back after every write catches what a racing write knocked out of
// vpcni's.
func (p *Provider) refreshIfStale(ctx context.Context) error {
	if p.port != nil && time.Since(p.portAt) < 10*time.Second {
		return nil
	}
	return p.refresh(ctx)
}

// refreshIfMissing reads the VM port when the provider has no copy of it.
// A write goes out on the copy the provider has, however old: it carries
// that copy's revision in If-Match, so a copy someone else's write made
// stale fails fast with a 412 (errStale), and the caller re-reads and
// plans again. The VM port has one writer per node, so the copy is almost
// always right, and a GET before every write (20–150 ms on the real
// server, more on a loaded one) bought nothing.
func (p *Provider) refreshIfMissing(ctx context.Context) error {
	if p.port != nil {
		return nil
	}
	return p.refresh(ctx)
}

// refresh re-reads the VM port.
func (p *Provider) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	port, err := answered(ports.Get(ctx, p.nc, p.portID).Extract())
	if err != nil {
		p.port = nil
		return explain(fmt.Errorf("read VM port %s: %w", p.portID, err))
	}
	p.port, p.portAt = port, time.Now()
	return nil
}

// Assign implements provider.Provider: new addresses are named
// explicitly and written in one batch per attempt; an address someone else
// took meanwhile (409) is skipped for another.
func (p *Provider) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	switch {
	case req.Fam() == family.V6:
		return p.assignV6(ctx, req)
	case p.cfg.Mode == "passthrough":
		return p.assignPassthrough(ctx, req)
	case p.cfg.SecondaryNICs > 0:
		return p.assignSpill(ctx, req)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	got, err := p.assignLocked(ctx, req)
	return p.leases(got), err
}

// assignLocked assigns on the VM port; the caller holds p.mu.
func (p *Provider) assignLocked(ctx context.Context, req provider.AssignRequest) ([]netip.Addr, error) {
	var m mode = fixedIPs{p}
	if p.cfg.Mode == "address-pairs" {
		m = addressPairs{p}
	}
	var assigned []netip.Addr
	var errs []error
	explicit := map[netip.Addr]bool{}
	for _, a := range req.Addresses {
		if p.subnet.Contains(a) {
			explicit[a] = true
		} else {
			errs = append(errs, fmt.Errorf("%s is outside subnet %s: %w", a, p.subnet, provider.ErrOutside))
		}
	}
	need := max(req.Count, 0)
	skip := map[netip.Addr]bool{} // found taken during this call
	freshUsed := false            // the used set was read during this call
	start := time.Now()
	for conflicts := 0; need > 0 || len(explicit) > 0; conflicts++ {
		if conflicts > 4*p.cfg.Retries {
			errs = append(errs, fmt.Errorf("gave up after %d address conflicts: %w", conflicts, provider.ErrUnavailable))
			break
		}
		// Named addresses may be found already vpcni's on the copy and
		// returned with no write to check it: that copy must be recent
		// (a pool's refill names none and writes on whatever copy it has).
		refresh := p.refreshIfMissing
		if len(explicit) > 0 {
			refresh = p.refreshIfStale
		}
		if err := refresh(ctx); err != nil {
			errs = append(errs, err)
			break
		}
		if need > 0 && p.used == nil {
			if err := p.refreshUsed(ctx); err != nil {
				errs = append(errs, err)
				break
			}
			freshUsed = true
		} else if need > 0 && time.Since(p.usedAt) > time.Minute {
			p.refreshUsedLater()
		}
		v, err := m.view(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		add := map[netip.Addr]bool{}
		for a := range explicit {
			switch {
			case v.ours[a]: // already this node's
				assigned = append(assigned, a)
				delete(explicit, a)
			case v.taken[a]:
				errs = append(errs, fmt.Errorf("%s is on the VM port but was not put there by vpcni: %w", a, provider.ErrTaken))
				delete(explicit, a)
			default:
				add[a] = true
			}
		}
		if len(add) > v.room {
			errs = append(errs, fmt.Errorf("%s: no room for %d more: %w", v.limit(0), len(add), provider.ErrExhausted))
			break
		}
		avoid := maps.Clone(v.taken)
		maps.Copy(avoid, v.ours)
		picked := p.pick(min(need, v.room-len(add)), avoid, skip, explicit)
		if len(picked) < min(need, v.room-len(add)) && !freshUsed {
			// Too few free addresses as last seen: others may have given
			// some back since. Look again before saying the subnet is full.
			p.used = nil
			continue
		}
		for _, a := range picked {
			add[a] = true
		}
		if len(add) == 0 && need > 0 && p.portAt.Before(start) {
			// No room as the copy has it: read the port before saying so.
			if err := p.refresh(ctx); err != nil {
				errs = append(errs, err)
				break
			}
			continue
		}
		if len(add) == 0 {
			switch {
			case need > 0 && v.room <= 0:
				errs = append(errs, fmt.Errorf("%s: %w", v.limit(0), provider.ErrExhausted))
			case need > 0:
				errs = append(errs, fmt.Errorf("no free address left in subnet %s (%s): %w", p.subnet, p.cfg.SubnetID, provider.ErrExhausted))
			}
			break
		}
		err = m.write(ctx, v, add)
		var taken netip.Addr
		switch {
		case err == nil:
		case isNeutronError(err, http.StatusConflict, "IpAddressAlreadyAllocated", &taken) && taken.IsValid():
			if explicit[taken] {
				errs = append(errs, fmt.Errorf("%s: %w", taken, provider.ErrTaken))
				delete(explicit, taken)
			}
			skip[taken] = true
			p.used = nil
			continue
		case errors.Is(err, errStale):
			// Someone else wrote the port since vpcni's copy: untilHeld
			// read it again; plan again on what it holds now.
			continue
		case isNeutronError(err, http.StatusConflict, "IpAddressGenerationFailure", nil):
			errs = append(errs, fmt.Errorf("subnet %s is full: %w", p.subnet, provider.ErrExhausted))
			return sorted(assigned), errors.Join(errs...)
		default:
			errs = append(errs, err)
			return sorted(assigned), errors.Join(errs...)
		}
		for a := range add {
			if p.used != nil {
				p.used[a] = true
			}
			delete(explicit, a)
			assigned = append(assigned, a)
		}
		if need -= len(picked); need > 0 {
			if v.room-len(add) <= 0 {
				errs = append(errs, fmt.Errorf("%s: %w", v.limit(len(add)), provider.ErrExhausted))
			} else {
				errs = append(errs, fmt.Errorf("subnet %s had only %d free addresses: %w", p.subnet, len(picked), provider.ErrExhausted))
			}
			break
		}
	}
	return sorted(assigned), errors.Join(errs...)
}

func sorted(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}

// mode is how an address mode sees and writes the VM port: write adds to
// what view saw.
type mode interface {
	view(ctx context.Context) (portView, error)
	write(ctx context.Context, v portView, add map[netip.Addr]bool) error
}

// portView: the addresses the node already holds (ours), those on the port
// that are someone else's (taken), how many more fit (room), and what the
// limit is once added more are on the port.
type portView struct {
	ours, taken map[netip.Addr]bool
	room        int
	limit       func(added int) string
}

// fixedIPs: pod addresses are fixed IPs of the VM port, ours when marked.
type fixedIPs struct{ p *Provider }

func (m fixedIPs) view(context.Context) (portView, error) {
	_, marked, on, err := m.p.state()
	if err != nil {
		return portView{}, err
	}
	v := portView{ours: map[netip.Addr]bool{}, taken: map[netip.Addr]bool{}, room: math.MaxInt,
		limit: func(int) string { return "VM port " + m.p.portID }}
	for a := range on {
		if marked[a] {
			v.ours[a] = true
		} else {
			v.taken[a] = true
		}
	}
	if m.p.cfg.SecondaryNICs > 0 {
		// Past maxAddresses, addresses go on secondary NICs (assignSpill).
		v.room = max(m.p.cfg.MaxAddresses-len(v.ours), 0)
		v.limit = func(added int) string {
			return fmt.Sprintf("VM port %s holds maxAddresses %d", m.p.portID, m.p.cfg.MaxAddresses)
		}
	}
	return v, nil
}

func (m fixedIPs) write(ctx context.Context, _ portView, add map[netip.Addr]bool) error {
	return m.p.apply(ctx, add, nil)
}

// Release implements provider.Provider: the addresses vpcni marked leave
// the port in one PUT; an address without the mark is never removed.
func (p *Provider) Release(ctx context.Context, addrs []netip.Addr) error {
	if p.cfg.Mode == "passthrough" {
		return p.releasePassthrough(ctx, addrs)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Mode == "address-pairs" {
		return p.releasePairs(ctx, addrs)
	}
	if p.v6 != nil {
		v4, v6 := byFamily(addrs)
		var err error
		if len(v4) > 0 {
			err = p.releaseFixed(ctx, v4)
		}
		return errors.Join(err, p.releaseV6(ctx, v6))
	}
	err := p.releaseFixed(ctx, addrs)
	if p.cfg.SecondaryNICs > 0 {
		err = errors.Join(err, p.releaseSecondary(ctx, addrs))
	}
	return err
}

// releaseFixed takes vpcni's addresses off the VM port; the caller holds
// p.mu. It plans on the provider's copy of the port and plans again when
// that copy turns out stale (see refreshIfMissing).
func (p *Provider) releaseFixed(ctx context.Context, addrs []netip.Addr) error {
	return p.replanned(ctx, func() error { return p.releaseFixedOnce(ctx, addrs) })
}

func (p *Provider) releaseFixedOnce(ctx context.Context, addrs []netip.Addr) error {
	if err := p.refreshIfMissing(ctx); err != nil {
		return err
	}
	_, marked, on, err := p.state()
	if err != nil {
		return err
	}
	drop := map[netip.Addr]bool{}
	var foreign []netip.Addr
	for _, a := range addrs {
		switch {
		case marked[a]:
			drop[a] = true
		case on[a]:
			foreign = append(foreign, a)
		}
	}
	keep, err := p.withFloatingIPs(ctx, map[string][]netip.Addr{p.portID: slices.Collect(maps.Keys(drop))})
	if err != nil {
		return err
	}
	for a := range keep {
		delete(drop, a)
	}
	if len(drop) > 0 {
		if err := p.apply(ctx, nil, drop); err != nil {
			return err
		}
		for a := range drop {
			delete(p.used, a)
		}
	}
	if len(foreign) > 0 {
		err = fmt.Errorf("left %v on port %s: vpcni did not put them there", foreign, p.portID)
	}
	return errors.Join(err, floatingErr(keep, p.portID))
}

// replanned runs a plan-and-write until it is not turned back as made on
// a stale copy of the port (errStale), at most Retries times.
func (p *Provider) replanned(ctx context.Context, f func() error) error {
	for n := 0; ; n++ {
		err := f()
		if !errors.Is(err, errStale) || n+1 >= p.cfg.Retries || ctx.Err() != nil {
			return err
		}
	}
}

// pick chooses n addresses of the subnet's allocation pools that nobody
// holds, lowest first.
func (p *Provider) pick(n int, on, skip, also map[netip.Addr]bool) []netip.Addr {
	var out []netip.Addr
	for _, pool := range p.pools {
		for a := pool[0]; len(out) < n && a.Compare(pool[1]) <= 0 && a.IsValid(); a = a.Next() {
			if a == p.gateway || on[a] || skip[a] || also[a] || p.used[a] {
				continue
			}
			out = append(out, a)
		}
	}
	return out
}
