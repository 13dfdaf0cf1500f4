package static

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/vpcni/vpcni/internal/provider"
)

// A static PodNetwork on a node: its pods take their addresses from the
// PodNetwork's ranges, held in a state file of the network's own
// (StateDir/podnetworks/<name>/static-provider.json), so no two networks
// and the default ever share one. The node's guard applies as to the
// default ranges: the node's own addresses, every Node's and those another
// host answers ARP for are never handed out. There are no blocks: every
// node that serves the network takes from all of its ranges, as
// provider.static.ranges does without blocks.

// NetworkSpec is a PodNetwork's static section.
type NetworkSpec struct {
	// Ranges are the prefixes the pods' addresses come from, IPv4 or
	// IPv6 (each family's addresses from its own ranges).
	Ranges []string `json:"ranges"`
	// Gateway is the pods' gateway on the network's segment, in the L2
	// modes (bridge, macvlan): the leases of the range that contains it
	// carry it, and it is never handed to a pod. A range without it uses
	// its first address, as provider.static.ranges does.
	Gateway string `json:"gateway,omitempty"`
}

// dnsName is a Kubernetes object name (a DNS subdomain), which a
// PodNetwork's is: it names a directory, so nothing else may pass.
var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// NetworkStateDir is where PodNetwork name keeps its state on a node
// whose state directory is stateDir.
func NetworkStateDir(stateDir, name string) string {
	return filepath.Join(stateDir, "podnetworks", name)
}

// networkConfig checks a PodNetwork's static section and turns it into the
// provider's config: one range per prefix, the gateway on the range that
// contains it. Every bad field is named at once. defaults are the node's
// own ranges (provider.static.ranges), which no PodNetwork may overlap:
// two pools would hand out one address.
func networkConfig(raw json.RawMessage, defaults []Range) (*Config, error) {
	var spec NetworkSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("its static section: %w", err)
	}
	if len(spec.Ranges) == 0 {
		return nil, errors.New("static.ranges is empty")
	}
	var errs []error
	var gw netip.Addr
	if spec.Gateway != "" {
		var err error
		if gw, err = netip.ParseAddr(spec.Gateway); err != nil {
			errs = append(errs, fmt.Errorf("static.gateway: %q is not an IP address", spec.Gateway))
		}
	}
	cfg := &Config{}
	var prefixes []netip.Prefix
	for i, s := range spec.Ranges {
		field := fmt.Sprintf("static.ranges[%d]", i)
		r := Range{CIDR: s}
		if p, err := netip.ParsePrefix(s); err == nil && gw.IsValid() && p.Contains(gw) {
			r.Gateway = gw.String()
		}
		if bad := r.validate(field); len(bad) > 0 {
			for _, e := range bad {
				// A range of the spec is a string, not a Range's cidr.
				errs = append(errs, errors.New(strings.Replace(e.Error(), field+".cidr:", field+":", 1)))
			}
			continue
		}
		p := netip.MustParsePrefix(s)
		if j := slices.IndexFunc(prefixes, p.Overlaps); j >= 0 {
			errs = append(errs, fmt.Errorf("%s: %s overlaps static.ranges[%d] %s", field, p, j, prefixes[j]))
		}
		for j, d := range defaults {
			if dp, err := netip.ParsePrefix(d.CIDR); err == nil && dp.Overlaps(p) {
				errs = append(errs, fmt.Errorf("%s: %s overlaps this node's provider.static.ranges[%d] %s: the default network and the PodNetwork would hand out the same addresses", field, p, j, dp))
			}
		}
		prefixes = append(prefixes, p)
		cfg.Ranges = append(cfg.Ranges, r)
	}
	if gw.IsValid() && len(prefixes) == len(spec.Ranges) && !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(gw) }) {
		errs = append(errs, fmt.Errorf("static.gateway: %s is in none of the ranges %s: the L2 modes reach it on the range's subnet", gw, strings.Join(spec.Ranges, ", ")))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// served are the ranges of the static PodNetworks served on each node
// (by state directory) in this process: two PodNetworks whose ranges
// overlap would hand out one address twice, so the second is refused
// while the first is served (the agent serves a network until it stops).
var served = struct {
	sync.Mutex
	byDir map[string]map[string][]netip.Prefix
}{byDir: map[string]map[string][]netip.Prefix{}}

// claimRanges records name's ranges as served on the node of stateDir, or
// says which served network overlaps them. Claiming again under the same
// name (a restart of the agent in one process) replaces the old claim.
func claimRanges(stateDir, name string, cfg *Config) error {
	served.Lock()
	defer served.Unlock()
	dir := filepath.Clean(stateDir)
	nets := served.byDir[dir]
	if nets == nil {
		nets = map[string][]netip.Prefix{}
		served.byDir[dir] = nets
	}
	var mine []netip.Prefix
	for _, r := range cfg.Ranges {
		mine = append(mine, netip.MustParsePrefix(r.CIDR))
	}
	var errs []error
	for other, theirs := range nets {
		if other == name {
			continue
		}
		for _, p := range mine {
			if j := slices.IndexFunc(theirs, p.Overlaps); j >= 0 {
				errs = append(errs, fmt.Errorf("range %s overlaps %s of PodNetwork %s, which this node serves: the two would hand out the same addresses (give them ranges apart; a node keeps serving a network once it has, restarts included)", p, theirs[j], other))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	nets[name] = mine
	return nil
}

// NewNetwork builds the provider of static PodNetwork name from its spec,
// with state under stateDir/podnetworks/<name>; node is the node's own
// config (provider.static), whose ranges the network must keep clear of.
// The caller arms the guard (SetGuard). Its errors do not repeat the
// network's name: the agent's wrap says it.
func NewNetwork(node *Config, stateDir, name string, raw json.RawMessage) (*Provider, error) {
	if !dnsName.MatchString(name) || len(name) > 253 {
		return nil, fmt.Errorf("PodNetwork %q: not a Kubernetes object name", name)
	}
	cfg, err := networkConfig(raw, node.Ranges)
	if err != nil {
		return nil, err
	}
	cfg.MaxAddresses = node.MaxAddresses
	dir := NetworkStateDir(stateDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("its state directory: %w", err)
	}
	if err := claimRanges(stateDir, name, cfg); err != nil {
		return nil, err
	}
	p, err := New(cfg, dir)
	if err != nil {
		return nil, err
	}
	p.network = name
	return p, nil
}

// network is the provider.Registration's Network: the PodNetwork's
// provider behind the node's guard (its uplink and Nodes, probed as the
// node's settings say).
func network(_ context.Context, node provider.Node, s provider.Settings, name string, spec json.RawMessage) (provider.Provider, error) {
	cfg := s.(*Config)
	p, err := NewNetwork(cfg, node.StateDir, name, spec)
	if err != nil {
		return nil, err
	}
	g, err := nodeGuard(node, cfg)
	if err != nil {
		return nil, err
	}
	p.SetGuard(g)
	return p, nil
}

// networkRoom is how many pods a static PodNetwork has addresses for on
// the node before it serves any of them (Registration.NetworkRoom): the
// capacity its provider will say, of its tightest family (a dual-stack
// pod takes one address of each).
func networkRoom(s provider.Settings, spec json.RawMessage, _ provider.Info) (int, bool) {
	node := s.(*Config)
	cfg, err := networkConfig(spec, node.Ranges)
	if err != nil {
		return 0, false
	}
	ranges, _, err := buildRanges(cfg)
	if err != nil {
		return 0, false
	}
	p := &Provider{ranges: ranges, sizes: sizes(ranges), maxAddrs: node.MaxAddresses}
	if p.maxAddrs <= 0 {
		p.maxAddrs = DefaultMaxAddresses
	}
	room := -1
	for _, f := range p.families() {
		if n := p.capacityOf(f).Max; room < 0 || n < room {
			room = n
		}
	}
	return max(room, 0), true
}
