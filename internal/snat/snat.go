// Package snat masquerades pod traffic that leaves the VPC to the node's
// address, for clouds whose router does not SNAT the subnet (an AWS-style
// VPC maps only a node's primary address to a public one). OpenStack's
// Neutron router SNATs the whole subnet itself, so there it stays off.
//
// It owns one nftables table, ip vpcni_snat, written through
// sigs.k8s.io/knftables (which runs the nft binary), and never looks at
// any other table:
//
//	set pods     the node's pod addresses (what is masqueraded)
//	set vpc      snat.vpcCIDRs (never masqueraded: the VPC sees pods by their own IPs)
//	set exclude  snat.excludeCIDRs (never masqueraded either)
//	chain prerouting:  ip saddr @pods, daddr in neither set -> meta mark |= Mark
//	chain postrouting: ip saddr @pods, daddr in neither set -> masquerade
//
// and one policy rule, Mark → the main table (route.go): pod traffic
// leaving the VPC goes out by the node's uplink, as the node, also from a
// pod whose address lives on a secondary NIC (whose own route table would
// send it out of that NIC, as the NIC's address — on AWS a secondary
// ENI's address has no public IPv4, so the internet gateway would drop
// it; aws-vpc-cni does the same with its connmark 0x80).
//
// Matching the pods' own source addresses, not a CIDR or an interface,
// leaves the node's own traffic (its address is never a pod's) and every
// datapath mode's naming alone.
package snat

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"
)

// Table is the name of vpcni's own nftables table (family ip).
const Table = "vpcni_snat"

// Config is the agent's snat section (vpcnid.yaml `snat:`).
type Config struct {
	// Enabled masquerades pod traffic to destinations outside VPCCIDRs and
	// ExcludeCIDRs to the node's address. Unset, the provider decides:
	// off for OpenStack, whose router SNATs the subnet already (a pod
	// keeps its own source address wherever the network routes it), on
	// for AWS, whose VPC maps only an instance's primary address to a
	// public one (provider.Registration.SNATByDefault).
	Enabled *bool `json:"enabled,omitempty"`
	// VPCCIDRs is the whole VPC (every subnet, peered ones too): traffic
	// to it keeps the pod's address. Required when enabled, unless the
	// provider reports the VPC's CIDRs (AWS: from the instance metadata)
	// — masquerading traffic to a sibling subnet would hide the pod from
	// the VPC.
	VPCCIDRs []netip.Prefix `json:"vpcCIDRs,omitempty"`
	// ExcludeCIDRs are further destinations reached with the pod's own
	// address (a VPN, a peered network, an on-premises range).
	ExcludeCIDRs []netip.Prefix `json:"excludeCIDRs,omitempty"`
}

// On says whether SNAT is on: as the file says, else byDefault (the
// provider's default).
func (c Config) On(byDefault bool) bool {
	if c.Enabled == nil {
		return byDefault
	}
	return *c.Enabled
}

// ErrNoVPC is what Validate's caller reports when SNAT is on without
// vpcCIDRs and the provider does not report the VPC's CIDRs.
var ErrNoVPC = errors.New("vpcCIDRs: must list the VPC's CIDRs when SNAT is enabled (traffic to them keeps the pod's address)")

// Validate names every bad field, relative to the section. (Whether
// vpcCIDRs may be empty depends on the provider: see ErrNoVPC.)
func (c Config) Validate() error {
	var errs []error
	check := func(field string, list []netip.Prefix) {
		for i, p := range list {
			switch {
			case !p.IsValid():
				errs = append(errs, fmt.Errorf("%s[%d]: not a CIDR", field, i))
			case !p.Addr().Is4():
				errs = append(errs, fmt.Errorf("%s[%d]: %s is not IPv4 (pods are IPv4 only)", field, i, p))
			case p.Masked() != p:
				errs = append(errs, fmt.Errorf("%s[%d]: %q has host bits set (did you mean %s?)", field, i, p, p.Masked()))
			}
		}
	}
	check("vpcCIDRs", c.VPCCIDRs)
	check("excludeCIDRs", c.ExcludeCIDRs)
	return errors.Join(errs...)
}

// rule is the postrouting chain's one rule. Masquerade takes the address
// of the interface the packet leaves by: the uplink's (the node IP), where
// the mark's policy rule sends it.
const rule = "ip saddr @pods ip daddr != @vpc ip daddr != @exclude masquerade"

// markRule is the prerouting chain's one rule: before routing, pod traffic that
// will be masqueraded is marked, so it is routed by the main table.
var markRule = fmt.Sprintf("ip saddr @pods ip daddr != @vpc ip daddr != @exclude meta mark set meta mark | 0x%x", Mark)

// comment marks a rule with a digest of its text, so Sync can tell its
// own current rule from anything else without parsing nft's output
// (knftables lists a rule's comment, not its text): a release that changes
// the rule replaces the old one.
func comment(what, rule string) string {
	sum := sha256.Sum256([]byte(rule))
	return fmt.Sprintf("vpcni: %s [%x]", what, sum[:4])
}

// chains are vpcni's two chains, each with its one rule.
var chains = []struct {
	chain         *knftables.Chain
	rule, comment string
}{
	{&knftables.Chain{Name: "prerouting", Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.ManglePriority)},
		markRule, comment("pod traffic leaving the VPC is routed by the main table", markRule)},
	{&knftables.Chain{Name: "postrouting", Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)},
		rule, comment("pod traffic leaving the VPC goes out as the node", rule)},
}

// NAT is the node's SNAT table.
type NAT struct {
	nft knftables.Interface
	mu  sync.Mutex
	cfg Config
}

// WaitingForVPC says whether the table waits for the VPC's CIDRs: the
// file listed none, and the provider has not reported them yet. Until
// then nothing is written (a table an earlier run left stays as it was):
// masquerading with an empty vpc set would hide pods from their own VPC.
func (n *NAT) WaitingForVPC() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.cfg.VPCCIDRs) == 0
}

// SetVPC gives the table the VPC's CIDRs the provider reported, when the
// file listed none.
func (n *NAT) SetVPC(cidrs []netip.Prefix) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.cfg.VPCCIDRs) == 0 {
		n.cfg.VPCCIDRs = slices.Clone(cidrs)
	}
}

// Open connects to nftables in the caller's network namespace. It fails
// when the nft binary is missing or the kernel lacks nf_tables, saying so.
func Open(cfg Config) (*NAT, error) {
	nft, err := knftables.New(knftables.IPv4Family, Table)
	if err != nil {
		return nil, fmt.Errorf("snat needs nftables (the nft binary, 1.0.1 or later, and nf_tables in the kernel): %w", err)
	}
	return &NAT{nft: nft, cfg: cfg}, nil
}

// Sync makes the table what it should be for these pod addresses, in one
// nft transaction (atomic: packets see the old table or the new one):
// the chain and sets are rewritten whole, so a rule or element someone
// added or removed by hand is put right (level-triggered). fixed says
// what was missing or wrong of the table, chain or rule ("" if they were
// as made; the sets are rewritten every time and not compared).
func (n *NAT) Sync(ctx context.Context, pods []netip.Addr) (fixed string, err error) {
	if n.WaitingForVPC() {
		return "", nil
	}
	n.mu.Lock()
	vpc := slices.Clone(n.cfg.VPCCIDRs)
	n.mu.Unlock()
	tx := n.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("vpcni: masquerade pod traffic leaving the VPC")})
	sets := []struct {
		name, comment string
		flags         []knftables.SetFlag
		elems         []string
	}{
		{"pods", "the node's pod addresses", nil, addrs(pods)},
		{"vpc", "snat.vpcCIDRs: reached with the pod's own address", []knftables.SetFlag{knftables.IntervalFlag}, prefixes(vpc)},
		{"exclude", "snat.excludeCIDRs: reached with the pod's own address", []knftables.SetFlag{knftables.IntervalFlag}, prefixes(n.cfg.ExcludeCIDRs)},
	}
	for _, s := range sets {
		// auto-merge lets overlapping CIDRs in the file coexist in one
		// interval set instead of failing the transaction.
		set := &knftables.Set{Name: s.name, Type: "ipv4_addr", Flags: s.flags, Comment: knftables.PtrTo(s.comment)}
		if len(s.flags) > 0 {
			set.AutoMerge = knftables.PtrTo(true)
		}
		tx.Add(set)
		tx.Flush(set)
		for _, e := range s.elems {
			tx.Add(&knftables.Element{Set: s.name, Key: []string{e}})
		}
	}
	var missing []string
	for _, c := range chains {
		tx.Add(c.chain)
		// A rule is rewritten only when its chain holds anything else than
		// it: the agent's kernel watch (kwatch) reconciles on every rule
		// deleted from a vpcni table, and a reconcile that flushed and
		// re-added an unchanged rule would kick the next one, forever.
		// (Set elements are not watched: the sets are simply rewritten.)
		rules, err := n.nft.ListRules(ctx, c.chain.Name)
		switch {
		case knftables.IsNotFound(err):
			missing = append(missing, fmt.Sprintf("nftables table ip %s or its chain %s", Table, c.chain.Name))
		case err != nil:
			return "", fmt.Errorf("nftables table ip %s: %w", Table, err)
		case len(rules) != 1 || rules[0].Comment == nil || *rules[0].Comment != c.comment:
			missing = append(missing, fmt.Sprintf("nftables table ip %s: the %s rule (chain held %d rules, not vpcni's one)", Table, c.chain.Name, len(rules)))
		default:
			continue
		}
		tx.Flush(c.chain)
		tx.Add(&knftables.Rule{Chain: c.chain.Name, Rule: c.rule, Comment: knftables.PtrTo(c.comment)})
	}
	if err := n.nft.Run(ctx, tx); err != nil {
		return "", fmt.Errorf("nftables table ip %s: %w", Table, err)
	}
	ruleFixed, err := ensureRule()
	if ruleFixed != "" {
		missing = append(missing, ruleFixed)
	}
	return strings.Join(missing, "; "), err
}

// Remove deletes vpcni's table (nothing else). Gone already is fine, and
// so is a node without nft: nothing of vpcni's can be there then.
func Remove(ctx context.Context) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	nft, err := knftables.New(knftables.IPv4Family, Table)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("delete nftables table ip %s: %w", Table, err)
	}
	return removeRule()
}

func addrs(list []netip.Addr) []string {
	out := make([]string, 0, len(list))
	for _, a := range list {
		if a.Is4() {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func prefixes(list []netip.Prefix) []string {
	out := make([]string, len(list))
	for i, p := range list {
		out[i] = p.String()
	}
	return out
}

// HasPod says whether the pods set holds ip (vpcnictl trace).
func (n *NAT) HasPod(ctx context.Context, ip netip.Addr) (bool, error) {
	elems, err := n.nft.ListElements(ctx, "set", "pods")
	if err != nil {
		return false, fmt.Errorf("nftables set ip %s pods: %w", Table, err)
	}
	return slices.ContainsFunc(elems, func(e *knftables.Element) bool { return len(e.Key) == 1 && e.Key[0] == ip.String() }), nil
}

// AddPod adds one pod address to the pods set (an ADD between two Syncs).
// While the table waits for the VPC's CIDRs the first Sync adds it.
func (n *NAT) AddPod(ctx context.Context, ip netip.Addr) error {
	if n.WaitingForVPC() {
		return nil
	}
	tx := n.nft.NewTransaction()
	tx.Add(&knftables.Element{Set: "pods", Key: []string{ip.String()}})
	if err := n.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables set ip %s pods: %w", Table, err)
	}
	return nil
}
