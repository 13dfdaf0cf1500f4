package bridge

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// Prepare sets and checks what the mode needs of the node's kernel:
// IPv4 forwarding (br_netfilter re-routes DNAT'ed bridged packets, and
// drops them with forwarding off), and br_netfilter itself. It writes a
// sysctl only when it differs, so an agent without a writable /proc/sys
// starts once a privileged step (vpcnictl install-cni) ran this.
func Prepare() error {
	if err := checkBrNetfilter(); err != nil {
		return err
	}
	return nlutil.WriteSysctls(needs.Sysctls)
}

// needs: the bridge and its pods' veths, forwarding, and br_netfilter
// (checkBrNetfilter).
var needs = datapath.Needs{Links: []string{"bridge", "veth"}, Sysctls: []datapath.Sysctl{datapath.Forwarding,
	{Key: brNetfilterDir, Why: "br_netfilter runs kube-proxy's rules on bridged pod traffic (modprobe br_netfilter)"}}}

// brNetfilterDir is what the kernel shows only with br_netfilter.
const brNetfilterDir = "net/bridge"

// checkBrNetfilter: without br_netfilter the bridge's nf_call_iptables
// option is accepted and does nothing, and pods silently lose Services.
// The kernel shows net.bridge only when it has br_netfilter (per network
// namespace).
func checkBrNetfilter() error {
	if _, err := os.Stat("/proc/sys/" + brNetfilterDir); err != nil {
		return errors.New("the kernel has no br_netfilter (no /proc/sys/net/bridge): bridged pod traffic would bypass iptables and pods could not reach Services; load it (modprobe br_netfilter) or choose another datapath mode")
	}
	return nil
}

// findUplink names the interface the bridge takes: the configured one, or
// the default route's — which, once the bridge holds the uplink, is the
// bridge itself: then its one port vpcni did not make.
func findUplink(name, bridge string) (string, error) {
	link, err := nlutil.Uplink(name)
	if err != nil {
		return "", err
	}
	if name = link.Attrs().Name; name == bridge || link.Attrs().Alias == BridgeAlias {
		return bridgePort(link)
	}
	if m := link.Attrs().MasterIndex; m != 0 {
		master, err := netlink.LinkByIndex(m)
		if err != nil {
			return "", fmt.Errorf("uplink %s has master %d: %w", name, m, err)
		}
		if master.Attrs().Name != bridge {
			return "", fmt.Errorf("uplink %s is already a port of %s: bridge mode needs it free (or set datapath.bridge.bridge to %s if vpcni made it)", name, master.Attrs().Name, master.Attrs().Name)
		}
	}
	return name, nil
}

// bridgePort is the bridge's uplink: its one port without a vpcni alias.
func bridgePort(br netlink.Link) (string, error) {
	if br.Attrs().Alias != BridgeAlias {
		return "", fmt.Errorf("%s is not a bridge vpcni made (alias %q)", br.Attrs().Name, br.Attrs().Alias)
	}
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	var found []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && !strings.HasPrefix(l.Attrs().Alias, AliasPrefix) {
			found = append(found, l.Attrs().Name)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("bridge %s should hold exactly one uplink, holds %v: set uplink in the config", br.Attrs().Name, found)
	}
	return found[0], nil
}

// takeUplink makes the bridge hold the uplink and the node's IPv4 life.
// Every step is skipped when already done, so a restart changes nothing,
// a move cut short is finished, and an address the node's DHCP client
// re-added on the uplink moves again with its renewed lifetimes. The
// order keeps the node reachable:
//
//  1. the bridge is made, with the uplink's MAC and MTU, passing bridged
//     IPv4 to iptables (and IPv6 to ip6tables with v6: pods of that
//     family), up;
//  2. the uplink becomes its port: frames now arrive on the bridge, but
//     the kernel still answers ARP and delivers to the node's address,
//     which is local on any interface, and replies leave through the
//     uplink's routes (sending on a port is fine);
//  3. the addresses are added to the bridge (one it holds already takes
//     the uplink's lifetimes: a DHCP renewal, see moveIP), each route
//     is replaced by the same route through the bridge (one atomic
//     replace each), the permanent neighbours are copied;
//  4. only then do the uplink's addresses and neighbours go.
func takeUplink(uplink, name string, v6 bool) (netlink.Link, error) {
	up, err := netlink.LinkByName(uplink)
	if err != nil {
		return nil, fmt.Errorf("uplink %q: %w", uplink, err)
	}
	br, err := ensureBridge(name, up, uplink, v6)
	if err != nil {
		return nil, err
	}
	if up.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMasterByIndex(up, br.Attrs().Index); err != nil {
			return nil, fmt.Errorf("make %s a port of %s: %w", uplink, name, err)
		}
	}
	if err := moveIP(up, br, netlink.FAMILY_V4, true); err != nil {
		return nil, fmt.Errorf("move the node's IPv4 from %s to %s: %w", uplink, name, err)
	}
	if err := moveIP(up, br, netlink.FAMILY_V6, true); err != nil {
		return nil, fmt.Errorf("move the node's IPv6 from %s to %s: %w", uplink, name, err)
	}
	return br, nil
}

// bridgeIPv6Sysctls gives the bridge the uplink's IPv6 life before its
// addresses move: IPv6 on when the uplink has it, and router
// advertisements taken (accept_ra 2, which holds with forwarding on too)
// when the uplink took them, so the node's RA default route and SLAAC
// addresses renew on the bridge. The bridge carries the uplink's MAC, so
// its link-local and EUI-64 SLAAC addresses are the uplink's own. An
// uplink with IPv6 off (or a kernel without it) leaves the bridge alone.
func bridgeIPv6Sysctls(uplink, bridge string) error {
	read := func(k string) string {
		v, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + uplink + "/" + k)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(v))
	}
	if read("disable_ipv6") != "0" {
		return nil
	}
	conf := "net/ipv6/conf/" + bridge + "/"
	want := []datapath.Sysctl{{Key: conf + "disable_ipv6", Value: "0", Why: "the node's IPv6 moves onto the bridge"}}
	// No duplicate address detection: the bridge's link-local address is
	// the uplink's (same MAC) by design, and while it is tentative (~2 s)
	// the node did not answer a pod's neighbour solicitation (measured:
	// pod -> node over IPv6 timed out right after the move).
	want = append(want, datapath.Sysctl{Key: conf + "accept_dad", Value: "0", Why: "the bridge's link-local address is the uplink's, and a tentative one leaves pods unanswered"})
	if ra := read("accept_ra"); ra == "1" || ra == "2" {
		want = append(want, datapath.Sysctl{Key: conf + "accept_ra", Value: "2", Why: "the bridge takes the router advertisements the uplink took (its default route), forwarding on or off"})
	}
	if err := nlutil.WriteSysctls(want); err != nil {
		return fmt.Errorf("ready %s for the node's IPv6: %w", bridge, err)
	}
	return nil
}

// ensureBridge finds or makes vpcni's bridge, with the uplink's MAC so the
// cloud port's MAC stays the node's source MAC, and nf_call_iptables on
// (nf_call_ip6tables too when v6: the node's pods have IPv6 addresses).
func ensureBridge(name string, up netlink.Link, uplink string, v6 bool) (netlink.Link, error) {
	br, err := netlink.LinkByName(name)
	switch {
	case nlutil.IsNotFound(err):
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU, attrs.HardwareAddr = name, up.Attrs().MTU, up.Attrs().HardwareAddr
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if br, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("find new bridge %s: %w", name, err)
		}
		// The kernel ignores an alias given at creation.
		if err := netlink.LinkSetAlias(br, BridgeAlias); err != nil {
			return nil, fmt.Errorf("mark bridge %s: %w", name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("look up bridge %s: %w", name, err)
	case br.Type() != "bridge" || br.Attrs().Alias != BridgeAlias:
		return nil, fmt.Errorf("%s exists and is not a bridge vpcni made (type %s, alias %q): set datapath.bridge.bridge to a free name", name, br.Type(), br.Attrs().Alias)
	}
	if br.Attrs().HardwareAddr.String() != up.Attrs().HardwareAddr.String() {
		if err := netlink.LinkSetHardwareAddr(br, up.Attrs().HardwareAddr); err != nil {
			return nil, fmt.Errorf("give %s the uplink's MAC: %w", name, err)
		}
	}
	opts := []int{unix.IFLA_BR_NF_CALL_IPTABLES}
	if v6 {
		opts = append(opts, unix.IFLA_BR_NF_CALL_IP6TABLES)
	}
	for _, opt := range opts {
		if on, err := nfCall(br.Attrs().Index, opt); err != nil {
			return nil, err
		} else if !on {
			if err := setBridgeOpt(br.Attrs().Index, opt, 1); err != nil {
				return nil, err
			}
		}
	}
	if err := bridgeIPv6Sysctls(uplink, name); err != nil {
		return nil, err
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return nil, fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return netlink.LinkByName(name)
}

// moveIP moves what the node's addresses of one family need of one interface to another:
// its addresses (with their flags, scope, labels and remaining lifetimes),
// its routes in every table (metric, protocol, scope, source, type kept;
// the kernel's own prefix and local routes follow the addresses), and its
// permanent neighbours. Nothing to move: nothing done.
//
// An address both hold follows the uplink's copy: the node's DHCP client
// writes only the uplink, and a lease renewal re-adds the address there
// with fresh lifetimes while the bridge's copy counts down the old ones —
// when those end, the kernel deletes the node's address. So with renew
// (taking the uplink) to's copy is replaced: the kernel sets its
// lifetimes from from's and keeps its own flags (a replace changes
// valid_lft and preferred_lft, not noprefixroute: measured on 6.18;
// changing flags would take the node's address away for a moment).
// Without renew (giving back), a copy the uplink holds already is newer
// than the bridge's and is kept.
//
// IPv6 (family FAMILY_V6) moves its global addresses only: each interface
// has its own link-local address (the bridge's, from the same MAC, is the
// uplink's), and routes through fe80::/64 are the kernel's.
func moveIP(from, to netlink.Link, fam int, renew bool) error {
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(from, fam) })
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	if fam == netlink.FAMILY_V6 {
		global := addrs[:0]
		for _, a := range addrs {
			if a.Scope == int(netlink.SCOPE_UNIVERSE) {
				global = append(global, a)
			}
		}
		addrs = global
	}
	all, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	neighs, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return netlink.NeighList(from.Attrs().Index, fam) })
	if err != nil {
		return fmt.Errorf("list neighbours: %w", err)
	}
	fromIdx, toIdx := from.Attrs().Index, to.Attrs().Index
	for _, a := range addrs {
		moved := a
		moved.LinkIndex = toIdx
		moved.Label = relabel(a.Label, from.Attrs().Name, to.Attrs().Name)
		if fam == netlink.FAMILY_V4 && moved.Broadcast == nil {
			// The library would invent one; 0.0.0.0 tells it to send none.
			moved.Broadcast = net.IPv4zero
		}
		if renew {
			// Adds it, or sets the lifetimes of to's copy (see above).
			if err := netlink.AddrReplace(to, &moved); err != nil {
				return fmt.Errorf("add or renew %s on %s: %w", a.IPNet, to.Attrs().Name, err)
			}
		} else if err := netlink.AddrAdd(to, &moved); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s to %s: %w", a.IPNet, to.Attrs().Name, err)
		}
	}
	for _, r := range all {
		if !movable(r, fromIdx) {
			continue
		}
		moved := r
		moved.Flags &^= unix.RTNH_F_DEAD | unix.RTNH_F_LINKDOWN // state, refused as input
		if moved.LinkIndex == fromIdx {
			moved.LinkIndex = toIdx
		}
		moved.MultiPath = nil
		for _, nh := range r.MultiPath {
			n := *nh
			if n.LinkIndex == fromIdx {
				n.LinkIndex = toIdx
			}
			n.Flags &^= unix.RTNH_F_DEAD | unix.RTNH_F_LINKDOWN
			moved.MultiPath = append(moved.MultiPath, &n)
		}
		if err := netlink.RouteReplace(&moved); err != nil {
			return fmt.Errorf("move route %s: %w", r, err)
		}
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 {
			continue // learnt, not configured
		}
		moved := n
		moved.LinkIndex = toIdx
		if err := netlink.NeighSet(&moved); err != nil {
			return fmt.Errorf("add neighbour %s to %s: %w", n.IP, to.Attrs().Name, err)
		}
	}
	// Secondaries first: deleting a primary takes its secondaries with it
	// unless the kernel promotes one.
	for i := len(addrs) - 1; i >= 0; i-- {
		if err := netlink.AddrDel(from, &addrs[i]); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove %s from %s: %w", addrs[i].IPNet, from.Attrs().Name, err)
		}
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 {
			if err := netlink.NeighDel(&n); err != nil && !nlutil.IsNotFound(err) {
				return fmt.Errorf("remove neighbour %s from %s: %w", n.IP, from.Attrs().Name, err)
			}
		}
	}
	return nil
}

// movable: a route through link that is not the kernel's own (local
// table, prefix routes of addresses: they follow the addresses).
func movable(r netlink.Route, link int) bool {
	if r.Table == unix.RT_TABLE_LOCAL || r.Protocol == unix.RTPROT_KERNEL {
		return false
	}
	if r.LinkIndex == link {
		return true
	}
	for _, nh := range r.MultiPath {
		if nh.LinkIndex == link {
			return true
		}
	}
	return false
}

// relabel carries an address label ("eth0", "eth0:1") to another
// interface: the kernel wants a label to start with its interface's name.
func relabel(label, from, to string) string {
	if rest, ok := strings.CutPrefix(label, from); ok {
		return to + rest
	}
	return label
}

// nfCallIptables reads the bridge's own nf_call_iptables option.
func nfCallIptables(index int) (bool, error) { return nfCall(index, unix.IFLA_BR_NF_CALL_IPTABLES) }

// nfCallIp6tables reads the bridge's own nf_call_ip6tables option.
func nfCallIp6tables(index int) (bool, error) { return nfCall(index, unix.IFLA_BR_NF_CALL_IP6TABLES) }

// nfCall reads one of the bridge's own nf_call_* options (opt: an
// IFLA_BR_NF_CALL_* attribute).
func nfCall(index, opt int) (bool, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return false, fmt.Errorf("read bridge %d: %w", index, err)
	}
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return false, err
		}
		for _, a := range attrs {
			if a.Attr.Type != unix.IFLA_LINKINFO {
				continue
			}
			info, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return false, err
			}
			for _, i := range info {
				if i.Attr.Type != nl.IFLA_INFO_DATA {
					continue
				}
				data, err := nl.ParseRouteAttr(i.Value)
				if err != nil {
					return false, err
				}
				for _, d := range data {
					if int(d.Attr.Type) == opt && len(d.Value) > 0 {
						return d.Value[0] == 1, nil
					}
				}
			}
		}
	}
	return false, fmt.Errorf("bridge %d reports no nf_call option %d", index, opt)
}

func setBridgeOpt(index, opt int, v byte) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("bridge"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(opt, []byte{v})
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set bridge option %d on link %d: %w", opt, index, err)
	}
	return nil
}

// Uninstall gives the uplink back what the bridge took: its addresses,
// routes and permanent neighbours move back, it leaves the bridge, its MTU
// is the bridge's (the node's MTU, as the uplink had it), and the bridge
// goes with any pod link still on it. No bridge: nothing to undo.
func Uninstall(uplink string, s Settings) error {
	s.Defaults()
	br, err := netlink.LinkByName(s.Bridge)
	if nlutil.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up bridge %s: %w", s.Bridge, err)
	}
	if br.Type() != "bridge" || br.Attrs().Alias != BridgeAlias {
		return fmt.Errorf("%s is not a bridge vpcni made (type %s, alias %q): left alone", s.Bridge, br.Type(), br.Attrs().Alias)
	}
	if uplink == "" || uplink == s.Bridge {
		if uplink, err = bridgePort(br); err != nil {
			return err
		}
	}
	up, err := netlink.LinkByName(uplink)
	if err != nil {
		return fmt.Errorf("uplink %q: %w", uplink, err)
	}
	if up.Attrs().MTU != br.Attrs().MTU {
		if err := netlink.LinkSetMTU(up, br.Attrs().MTU); err != nil {
			return fmt.Errorf("give %s its MTU %d back: %w", uplink, br.Attrs().MTU, err)
		}
	}
	if err := moveIP(br, up, netlink.FAMILY_V4, false); err != nil {
		return fmt.Errorf("move the node's IPv4 back from %s to %s: %w", s.Bridge, uplink, err)
	}
	if err := moveIP(br, up, netlink.FAMILY_V6, false); err != nil {
		return fmt.Errorf("move the node's IPv6 back from %s to %s: %w", s.Bridge, uplink, err)
	}
	if err := netlink.LinkSetNoMaster(up); err != nil {
		return fmt.Errorf("release %s from %s: %w", uplink, s.Bridge, err)
	}
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && strings.HasPrefix(l.Attrs().Alias, AliasPrefix) {
			if err := netlink.LinkDel(l); err != nil && !nlutil.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete pod link %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if err := netlink.LinkDel(br); err != nil && !nlutil.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete bridge %s: %w", s.Bridge, err))
	}
	return errors.Join(errs...)
}
