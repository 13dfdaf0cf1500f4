package veth

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

// Addresses on a secondary NIC (seed 002). When the node's primary port is
// full the provider attaches more ports, and an address that lives on one
// (Lease.NIC) must leave the node by that NIC: the cloud's port security
// allows it there and nowhere else. So each such NIC gets a route table of
// its own — its subnet on-link and a default route via the subnet's
// gateway, out of that NIC — and the node's rules say:
//
//	512:  lookup main suppress_prefixlength 31
//	      traffic for any pod of this node (its /32 route in main)
//	      reaches the pod's veth, also from a pod on a NIC;
//	1536: from <pod> lookup <NIC's table>
//	      a pod on a NIC leaves by it (one rule per such pod, and one
//	      for the NIC's own address, from which it ARPs).
//
// The seed gives every pod a "to <pod> lookup main" rule at 512; the one
// rule that accepts only /32 answers from main does the same for every
// local pod, without a rule per pod for each packet to walk. The node
// answers ARP for a NIC's pod on that NIC, not on the uplink. The NIC is
// found by its MAC: a hot-plugged NIC comes up under any name.
//
// IPv6 addresses on a NIC are wired the same way, with the same code and
// the same table number (a route table is per family): the NIC's own IPv6
// address (a /64 of its port's IPv6 subnet, no DAD, no prefix route), its
// IPv6 subnet and a default route via the subnet's IPv6 gateway in the
// table, "512: lookup main suppress_prefixlength 127" (the pods' /128s),
// "1536: from <pod>/128 lookup <table>", and proxy NDP for the pod on the
// NIC. A pod's leases are routed one at a time, each by its own NIC (or
// the uplink): a dual-stack pod's two addresses need not share a NIC.
const (
	ruleLocalPods = 512
	ruleFromPod   = 1536
	// nicTableBase + the NIC's ifindex is its route table: stable while
	// the NIC is attached, recomputed from the kernel after a restart.
	nicTableBase = 28000
)

// nicTable is the route table of a NIC.
func nicTable(link netlink.Link) int { return nicTableBase + link.Attrs().Index }

// findNIC finds the node's interface with the lease's NIC MAC among links
// (not one of vpcni's own veths).
func findNIC(links []netlink.Link, nic *alloc.NIC) (netlink.Link, error) {
	for _, l := range links {
		if strings.EqualFold(l.Attrs().HardwareAddr.String(), nic.MAC) && !strings.HasPrefix(l.Attrs().Alias, AliasPrefix) {
			return l, nil
		}
	}
	return nil, fmt.Errorf("no interface with MAC %s on the node: the provider attached its port but the NIC has not appeared", nic.MAC)
}

func (v *Veth) nicOf(a *alloc.Allocation) (netlink.Link, error) {
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return findNIC(links, a.NIC)
}

// prepareNIC makes a NIC ready to carry pods of a.Address's family: up,
// its own address of that family without a prefix route (the subnet
// stays routed by the uplink in the main table), the family's sysctls
// (nicSysctls), and its route table for the family. Idempotent.
func (v *Veth) prepareNIC(link netlink.Link, a *alloc.Allocation) error {
	if !a.Prefix.IsValid() || !a.Gateway.IsValid() || !a.NIC.Address.IsValid() {
		return fmt.Errorf("address %s on NIC %s: the provider gave no subnet, gateway or NIC address to route it by", a.Address, a.NIC.MAC)
	}
	f := family.Of(a.Address)
	if family.Of(a.Prefix.Addr()) != f || family.Of(a.Gateway) != f || family.Of(a.NIC.Address) != f {
		return fmt.Errorf("address %s on NIC %s: its subnet %s, gateway %s and the NIC's address %s must all be %s: the provider mixed families", a.Address, a.NIC.MAC, a.Prefix, a.Gateway, a.NIC.Address, f)
	}
	name := link.Attrs().Name
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set NIC %s up: %w", name, err)
		}
	}
	// The sysctls first: an IPv6 address on a NIC whose IPv6 is off
	// cannot be added.
	if err := nicSysctls(name, f); err != nil {
		return err
	}
	own := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a.NIC.Address, a.Prefix.Bits())), Flags: unix.IFA_F_NOPREFIXROUTE}
	if f == family.V6 {
		// The port's address is Neutron's to give: no duplicate
		// detection to wait ~2 s for.
		own.Flags |= unix.IFA_F_NODAD
	}
	if err := netlink.AddrReplace(link, own); err != nil {
		return fmt.Errorf("address %s on NIC %s: %w", a.NIC.Address, name, err)
	}
	table, idx := nicTable(link), link.Attrs().Index
	for _, r := range []*netlink.Route{
		{LinkIndex: idx, Table: table, Dst: ipNet(a.Prefix.Masked()), Scope: netlink.SCOPE_LINK, Src: a.NIC.Address.AsSlice(), Protocol: RouteProtocol},
		{LinkIndex: idx, Table: table, Dst: ipNet(f.Default()), Gw: a.Gateway.AsSlice(), Protocol: RouteProtocol},
	} {
		if f == family.V6 {
			r.Scope = netlink.SCOPE_UNIVERSE // IPv6 routes have no scope
		}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s in table %d of NIC %s: %w", r.Dst, table, name, err)
		}
	}
	return errors.Join(addRule(localPodsRule(f)), addRule(fromRule(a.NIC.Address, table)))
}

// nicSysctls: a NIC's reverse-path filter must not be strict, and its
// proxy ARP answers should come at once. The agent's container may not
// write /proc/sys (the DaemonSet's is read-only): a NIC hot-plugged after
// the init step (vpcnictl install-cni) inherits neigh/default/proxy_delay 0
// from it (defaultProxyDelay), and an rp_filter of 0 or 2 — the kernel's and
// most distributions' default, counted as the larger of conf/all and the
// NIC's — needs no write at all. So only a strict filter must be written,
// and its failure is an error that says how to fix the node; a proxy
// delay that cannot be written (a NIC that was there before the init step
// ran) only delays the first ARP answer for a pod by up to 0.8 s.
//
// IPv6 (f V6) has no reverse-path filter; it needs the NIC's IPv6 on and
// proxy NDP on it (or on conf/all), and no router advertisements taken on
// it (a default route in main by the NIC would take the node's own
// traffic there): with forwarding on (ipv6Sysctls) an accept_ra of 1
// takes none already, 2 would, so only a 2 is written to 0.
func nicSysctls(name string, f family.Family) error {
	read := func(key string) string {
		v, _ := os.ReadFile("/proc/sys/" + key)
		return strings.TrimSpace(string(v))
	}
	strict := func(key string) bool { return read(key) == "1" }
	if f == family.V6 {
		conf := "net/ipv6/conf/" + name + "/"
		for _, s := range []struct{ key, want, why string }{
			{conf + "disable_ipv6", "0", "its IPv6 is off"},
			{conf + "proxy_ndp", "1", "the node answers neighbour solicitations for its pods there"},
		} {
			if read(s.key) == s.want || s.key == conf+"proxy_ndp" && read("net/ipv6/conf/all/proxy_ndp") == "1" {
				continue
			}
			if err := nlutil.WriteSysctl(s.key, s.want); err != nil {
				return fmt.Errorf("%w: NIC %s carries IPv6 pods and %s: set net.ipv6.conf.%s.%s (or net.ipv6.conf.default's, before the NIC is attached) to %s on the node",
					err, name, s.why, name, s.key[len(conf):], s.want)
			}
		}
		if read(conf+"accept_ra") == "2" {
			if err := nlutil.WriteSysctl(conf+"accept_ra", "0"); err != nil {
				return fmt.Errorf("%w: NIC %s takes router advertisements (accept_ra 2), whose default route would pull the node's own IPv6 traffic onto it: set net.ipv6.conf.%s.accept_ra to 0", err, name, name)
			}
		}
		if err := nlutil.WriteSysctl("net/ipv6/neigh/"+name+"/proxy_delay", "0"); err != nil && !errors.Is(err, syscall.EROFS) {
			return err
		}
		return nil
	}
	if strict("net/ipv4/conf/all/rp_filter") || strict("net/ipv4/conf/"+name+"/rp_filter") {
		if err := nlutil.WriteSysctl("net/ipv4/conf/"+name+"/rp_filter", "2"); err != nil {
			return fmt.Errorf("%w: replies to pods on NIC %s arrive there while the main table routes their source by the uplink, so strict reverse-path filtering drops them: set net.ipv4.conf.all.rp_filter and net.ipv4.conf.default.rp_filter to 2 (or 0) on the node", err, name)
		}
		if strict("net/ipv4/conf/all/rp_filter") {
			return fmt.Errorf("net.ipv4.conf.all.rp_filter is 1 (strict), which overrides NIC %s's: replies to its pods would be dropped; set it to 2 (or 0) on the node", name)
		}
	}
	if err := nlutil.WriteSysctl("net/ipv4/neigh/"+name+"/proxy_delay", "0"); err != nil && !errors.Is(err, syscall.EROFS) {
		return err
	}
	return nil
}

func hostNet(ip netip.Addr) *net.IPNet { return ipNet(family.Host(ip)) }

// localPodsRule sends traffic for any local pod of family f by main's
// host routes (/32, /128): it suppresses every shorter answer.
func localPodsRule(f family.Family) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority, r.Table, r.SuppressPrefixlen, r.Protocol = ruleLocalPods, unix.RT_TABLE_MAIN, f.Bits()-1, uint8(RouteProtocol)
	r.Family = nlFamilyOf(f)
	return r
}

func fromRule(ip netip.Addr, table int) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority, r.Table, r.Src, r.Protocol = ruleFromPod, table, hostNet(ip), uint8(RouteProtocol)
	return r
}

func addRule(r *netlink.Rule) error {
	if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("rule %s: %w", r, err)
	}
	return nil
}

func delRule(r *netlink.Rule) error {
	if err := netlink.RuleDel(r); err != nil && !nlutil.IsNotFound(err) {
		return fmt.Errorf("delete rule %s: %w", r, err)
	}
	return nil
}

// wireNIC routes a pod's address through its NIC and has the node answer
// ARP for it there; it returns the NIC's index for the proxy entry.
func (v *Veth) wireNIC(a *alloc.Allocation) (int, error) {
	link, err := v.nicOf(a)
	if err != nil {
		return 0, err
	}
	if err := v.prepareNIC(link, a); err != nil {
		return 0, err
	}
	if err := addRule(fromRule(a.Address, nicTable(link))); err != nil {
		return 0, err
	}
	return link.Attrs().Index, nil
}

// unwireNIC removes a pod's rule and its proxy entry on its NIC; the
// NIC's own table and rules stay while the NIC is attached (the next pod
// on it needs them; a detached NIC takes its routes with it).
func (v *Veth) unwireNIC(a *alloc.Allocation) error {
	var errs []error
	link, err := v.nicOf(a)
	if err != nil {
		// The NIC is gone: its table went with it; the from-rule names a
		// table that no longer exists, so any table of ours will do.
		errs = append(errs, v.delFromRules(a.Address))
		return errors.Join(errs...)
	}
	errs = append(errs, delRule(fromRule(a.Address, nicTable(link))))
	if err := netlink.NeighDel(proxyOn(link.Attrs().Index, a.Address)); err != nil && !nlutil.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete %s %s on %s: %w", proxyKind(a.Address), a.Address, link.Attrs().Name, err))
	}
	return errors.Join(errs...)
}

// delFromRules deletes vpcni's from-rules of ip, whatever their table.
func (v *Veth) delFromRules(ip netip.Addr) error {
	rules, err := nlutil.RetryDump(func() ([]netlink.Rule, error) { return netlink.RuleList(nlFamily(ip)) })
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	var errs []error
	for _, r := range rules {
		if ours(r) && r.Priority == ruleFromPod && r.Src != nil && r.Src.IP.Equal(ip.AsSlice()) {
			errs = append(errs, delRule(&r))
		}
	}
	return errors.Join(errs...)
}

// ours says whether a rule is one vpcni made.
func ours(r netlink.Rule) bool {
	return r.Protocol == uint8(RouteProtocol) && (r.Priority == ruleLocalPods || r.Priority == ruleFromPod)
}

// proxyOn is the proxy neighbour entry by which the node answers ARP (NDP,
// for an IPv6 address) for ip on a link.
func proxyOn(linkIdx int, ip netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{LinkIndex: linkIdx, Family: nlFamily(ip), Flags: netlink.NTF_PROXY, IP: ip.AsSlice()}
}

// traceNIC lists the pieces of a NIC pod's node-side wiring: the policy
// rules, the NIC's table and its proxy ARP (NDP) entry, of the address's
// family.
func (v *Veth) traceNIC(a *alloc.Allocation) []datapath.Hop {
	var h hops
	link, err := v.nicOf(a)
	if err != nil {
		h.add(datapath.HopNode, "secondary NIC of "+a.Address.String(), false, datapath.HopMissing, err.Error())
		return h
	}
	f := family.Of(a.Address)
	rules, err := nlutil.RetryDump(func() ([]netlink.Rule, error) { return netlink.RuleList(nlFamily(a.Address)) })
	if err != nil {
		h.add(datapath.HopNode, "policy rules", false, datapath.HopWrong, fmt.Sprintf("list rules: %v", err))
		return h
	}
	table, nic := nicTable(link), link.Attrs().Name
	h.add(datapath.HopNode, fmt.Sprintf("rule %d: lookup main suppress_prefixlength %d", ruleLocalPods, f.Bits()-1), hasLocalPodsRule(rules, f),
		datapath.HopMissing, fmt.Sprintf("no %s rule %d: lookup main suppress_prefixlength %d", f, ruleLocalPods, f.Bits()-1))
	h.add(datapath.HopNode, fmt.Sprintf("rule %d: from %s lookup %d", ruleFromPod, a.Address, table), hasRule(rules, a.Address, table),
		datapath.HopMissing, fmt.Sprintf("no rule %d: from %s lookup %d (NIC %s)", ruleFromPod, a.Address, table, nic))
	h.add(datapath.HopNode, fmt.Sprintf("table %d %s default route (NIC %s)", table, f, nic), hasTableDefault(table, f),
		datapath.HopMissing, fmt.Sprintf("table %d of NIC %s has no default route (%s)", table, nic, f))
	h.add(datapath.HopNode, fmt.Sprintf("%s %s on NIC %s", proxyKind(a.Address), a.Address, nic), v.hasProxyOn(link.Attrs().Index, a.Address),
		datapath.HopMissing, fmt.Sprintf("no %s for %s on NIC %s", proxyKind(a.Address), a.Address, nic))
	return h
}

// hasRule finds vpcni's from-rule of ip pointing at table.
func hasRule(rules []netlink.Rule, ip netip.Addr, table int) bool {
	for _, r := range rules {
		if ours(r) && r.Priority == ruleFromPod && r.Table == table && r.Src != nil && r.Src.IP.Equal(ip.AsSlice()) && isHostMask(r.Src.Mask) {
			return true
		}
	}
	return false
}

// hasTableDefault says whether a NIC's table routes family f by its
// gateway.
func hasTableDefault(table int, f family.Family) bool {
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(nlFamilyOf(f), &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return true // unreadable: do not rewrite on a guess
	}
	for _, r := range routes {
		if r.Dst == nil || nlutil.IsZeroMask(r.Dst.Mask) {
			return true
		}
	}
	return false
}

// hasLocalPodsRule finds the rule to local pods of family f among rules
// (of any family).
func hasLocalPodsRule(rules []netlink.Rule, f family.Family) bool {
	for _, r := range rules {
		if ours(r) && r.Family == nlFamilyOf(f) && r.Priority == ruleLocalPods && r.SuppressPrefixlen == f.Bits()-1 && r.Table == unix.RT_TABLE_MAIN {
			return true
		}
	}
	return false
}

func (v *Veth) hasProxyOn(linkIdx int, ip netip.Addr) bool {
	// One entry asked for (RTM_GETNEIGH with NTF_PROXY), not the table
	// dumped: the health probe asks for every pod of the node, and a dump
	// per pod made each pass O(pods²) — 62,500 entries decoded every 30 s
	// at 250 pods (bench node-scale).
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.AddData(&netlink.Ndmsg{Family: uint8(nlFamily(ip)), Index: uint32(linkIdx), Flags: netlink.NTF_PROXY})
	req.AddData(nl.NewRtAttr(unix.NDA_DST, ip.AsSlice()))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	return err == nil && len(msgs) > 0
}

// reconcileNICs is Reconcile's part for secondary NICs, in one rule dump
// per family:
// the NIC tables, rules and proxy entries of desired allocations on NICs
// put back; vpcni's rules of addresses no allocation has removed (a NIC's
// own rule stays while the NIC carries that address); proxy entries of
// idle addresses on the NICs removed.
func (v *Veth) reconcileNICs(links []netlink.Link, want []*alloc.Allocation, idle []netip.Addr, live map[netip.Addr]string, rep *reportBuilder) error {
	var rules []netlink.Rule
	for _, f := range family.All {
		if f == family.V6 && !v.has(f) {
			continue // a node without IPv6 pods (whose kernel may have no IPv6 to list)
		}
		rs, err := nlutil.RetryDump(func() ([]netlink.Rule, error) { return netlink.RuleList(nlFamilyOf(f)) })
		if err != nil {
			return fmt.Errorf("list %s rules: %w", f, err)
		}
		rules = append(rules, rs...)
	}
	nics := map[int]netlink.Link{}     // by index: NICs vpcni routes by
	routed := map[family.Family]bool{} // families some NIC carries
	for _, a := range want {
		if a.NIC == nil {
			continue
		}
		link, err := findNIC(links, a.NIC)
		if err != nil {
			rep.fail(fmt.Errorf("%s: %w", a.Key(), err))
			continue
		}
		nics[link.Attrs().Index] = link
		f := family.Of(a.Address)
		routed[f] = true
		table := nicTable(link)
		// A NIC that went down and up lost its table's routes (the kernel
		// flushes them) while the rules stayed: prepare it again then too.
		if !hasRule(rules, a.NIC.Address, table) || !hasTableDefault(table, f) {
			if err := v.prepareNIC(link, a); err != nil {
				rep.fail(fmt.Errorf("%s: %w", a.Key(), err))
				continue
			}
			rep.repaired(datapath.RepairRoute, "%s: NIC %s table %d (%s)", a.Key(), link.Attrs().Name, table, f)
		}
		if !hasLocalPodsRule(rules, f) {
			if err := addRule(localPodsRule(f)); err != nil {
				rep.fail(err)
			} else {
				rules = append(rules, *localPodsRule(f))
				rep.repaired(datapath.RepairRule, "%s rule %d to local pods", f, ruleLocalPods)
			}
		}
		if !hasRule(rules, a.Address, table) {
			if err := addRule(fromRule(a.Address, table)); err != nil {
				rep.fail(fmt.Errorf("%s: %w", a.Key(), err))
			} else {
				rep.repaired(datapath.RepairRule, "%s: rule %d from %s lookup %d", a.Key(), ruleFromPod, a.Address, table)
			}
		}
		if !v.hasProxyOn(link.Attrs().Index, a.Address) {
			if err := netlink.NeighSet(proxyOn(link.Attrs().Index, a.Address)); err != nil {
				rep.fail(fmt.Errorf("%s %s on %s: %w", proxyKind(a.Address), a.Address, link.Attrs().Name, err))
			} else {
				rep.repaired(datapath.RepairNeighbour, "%s: %s %s on NIC %s", a.Key(), proxyKind(a.Address), a.Address, link.Attrs().Name)
			}
		}
	}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	for _, r := range rules {
		if !ours(r) || r.Priority != ruleFromPod || r.Src == nil {
			continue
		}
		ip, _ := addrOf(r.Src.IP)
		if _, ok := live[ip]; ok {
			continue
		}
		if nic, ok := byIndex[r.Table-nicTableBase]; ok && r.Priority == ruleFromPod && hasAddr(nic, ip) {
			nics[nic.Attrs().Index] = nic // a NIC's own rule
			routed[family.Of(ip)] = true
			continue
		}
		if err := delRule(&r); err != nil {
			rep.fail(err)
			continue
		}
		rep.removed("stale rule %d of %s", r.Priority, ip)
	}
	// A family's rule to local pods goes with the last NIC vpcni routes
	// that family by.
	for _, f := range family.All {
		if routed[f] || !hasLocalPodsRule(rules, f) {
			continue
		}
		if err := delRule(localPodsRule(f)); err != nil {
			rep.fail(err)
		} else {
			rep.removed("%s rule %d to local pods: no NIC left", f, ruleLocalPods)
		}
	}
	for idx, nic := range nics {
		for _, ip := range idle {
			if _, ok := live[ip]; ok || !v.hasProxyOn(idx, ip) {
				continue
			}
			if err := netlink.NeighDel(proxyOn(idx, ip)); err != nil && !nlutil.IsNotFound(err) {
				rep.fail(fmt.Errorf("delete %s %s on %s: %w", proxyKind(ip), ip, nic.Attrs().Name, err))
				continue
			}
			rep.removed("%s of idle address %s on NIC %s", proxyKind(ip), ip, nic.Attrs().Name)
		}
	}
	return nil
}

// hasAddr says whether link carries ip.
func hasAddr(link netlink.Link, ip netip.Addr) bool {
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, nlFamily(ip)) })
	if err != nil {
		return true // unreadable: keep the rule rather than guess
	}
	for _, a := range addrs {
		if a.IP.Equal(ip.AsSlice()) {
			return true
		}
	}
	return false
}
