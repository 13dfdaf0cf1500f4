// Package svcpath is the service path of the modes whose pod interface
// bypasses the node's stack (macvlan, ipvlan, passthrough): a second veth
// pair per pod that carries what must pass through the node — the Service
// CIDRs, so kube-proxy's rules see it, and the node's own address, which
// an L2 sub-interface cannot reach (a macvlan or ipvlan parent never
// talks to its children):
//
//	pod:  vpcni-svc (veth), 169.254.1.1 scope link, permanent neighbour
//	      169.254.1.1 -> node end's MAC, <serviceCIDR> via 169.254.1.1
//	      src <podIP> and <nodeIP>/32 via 169.254.1.1 src <podIP>
//	node: vsv<hash> (alias "vpcni:<container>/<ifname>"), <podIP>/32 dev
//	      vsv<hash> (protocol vpcni), so node -> pod takes the same way
//	      back as pod -> node
//
// IPv6, for a pod with an IPv6 address, the same way: the IPv6 Service
// CIDRs and the node's global IPv6 address via fe80::1 (a permanent
// neighbour at the node end's MAC) src <podIPv6>; on the node
// <podIPv6>/128 dev vsv<hash> and a permanent neighbour <podIPv6> -> the
// pod end's MAC. The node needs that entry: the pod's address lives on
// its L2 interface, not on vpcni-svc, and the kernel answers a neighbour
// solicitation only for an address of the interface it arrives on (IPv4's
// ARP answers for any). IPv6 forwarding goes on with an IPv6 family
// (NeedsFor). Each family routes only the Service CIDRs of its own.
//
// Why a Service needs NAT here: a client pod's packet to a ClusterIP
// enters the node through its service veth and kube-proxy DNATs it to a
// backend pod. That pod's reply to the client's address would go straight
// over L2 (the client is on its subnet), never through the node's
// conntrack, and reach the client from the backend's address instead of
// the ClusterIP's: the client drops it. So what arrives from a service
// veth and leaves DNATed is masqueraded to the node, whose conntrack then
// sees both ways — IPv6 as IPv4: this is Service traffic's own NAT, as
// kube-proxy's DNAT is, not the pod's address hidden. The rule lives in
// nftables table ip vpcni_svcpath (and ip6 vpcni_svcpath with IPv6),
// programmed over netlink (the agent's image has no nft or iptables) and
// put back by Reconcile when it goes missing.
package svcpath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

// PodIfName is the service veth's name in the pod. A CNI interface of the
// same name is refused (it would clash).
const PodIfName = "vpcni-svc"

// HostPrefix starts the node-side name of every service veth; the NAT
// rule matches on it.
const HostPrefix = "vsv"

// Gateway is the link-local next hop of the service routes in the pod.
var Gateway = netip.MustParseAddr("169.254.1.1")

// Gateway6 is Gateway's IPv6 counterpart (mode veth's pod gateway too).
var Gateway6 = netip.MustParseAddr("fe80::1")

// gatewayOf is the service routes' next hop for addresses of ip's family.
func gatewayOf(ip netip.Addr) netip.Addr {
	if family.Of(ip) == family.V6 {
		return Gateway6
	}
	return Gateway
}

// RouteProtocol marks the node routes vpcni installs; the same value as
// the routed veth mode's, so tools that list vpcni's routes find both.
const RouteProtocol netlink.RouteProtocol = 0xa7

// Path is the service path of one node.
type Path struct {
	cidrs   []netip.Prefix
	nodeIPs []netip.Addr
	mtu     int
	v6      bool
}

// New returns the service path for Service CIDRs and the node's own
// addresses on the pods' network (at most one per family; an invalid one
// is left out: no route to it is made); mtu is the veths', v6 says the
// node's pods may have IPv6 addresses.
func New(cidrs []netip.Prefix, nodeIPs []netip.Addr, mtu int, v6 bool) *Path {
	var ips []netip.Addr
	for _, ip := range nodeIPs {
		if ip.IsValid() {
			ips = append(ips, ip.Unmap())
		}
	}
	return &Path{cidrs: cidrs, nodeIPs: ips, mtu: mtu, v6: v6}
}

// Open returns the service path of this node and readies the node for it:
// forwarding on (pod -> Service -> pod passes through the node) and the
// NAT rules in place, for the families node's pods get.
func Open(node datapath.Node, uplink string, cidrs []netip.Prefix, nodeIPs []netip.Addr, mtu int) (*Path, error) {
	if err := Prepare(node.Families, uplink); err != nil {
		return nil, err
	}
	v6 := family.Has(node.Families, family.V6)
	if _, err := EnsureNAT(v6); err != nil {
		return nil, err
	}
	return New(cidrs, nodeIPs, mtu, v6), nil
}

// Prepare sets the sysctls the service path needs (NeedsFor); a mode's
// Prepare step runs it from the privileged init container. It writes only
// what differs, so an agent without a writable /proc/sys starts once that
// step ran.
func Prepare(fams []family.Family, uplink string) error {
	return nlutil.WriteSysctls(NeedsFor(fams, uplink).Sysctls)
}

// Needs is what the service path needs of the node's kernel for IPv4
// pods: its veths and forwarding.
var Needs = datapath.Needs{Links: []string{"veth"}, Sysctls: []datapath.Sysctl{datapath.Forwarding}}

// NeedsFor is Needs for pods of fams, in the order to write them: IPv6
// adds IPv6 forwarding, and before it accept_ra 2 on an uplink that takes
// router advertisements (forwarding on would stop them and drop the
// default route they gave, at once).
func NeedsFor(fams []family.Family, uplink string) datapath.Needs {
	if !family.Has(fams, family.V6) {
		return Needs
	}
	n := datapath.Needs{Links: Needs.Links, Sysctls: append([]datapath.Sysctl{}, Needs.Sysctls...)}
	if uplink != "" {
		if ra, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + uplink + "/accept_ra"); err == nil && strings.TrimSpace(string(ra)) != "0" {
			n.Sysctls = append(n.Sysctls, datapath.Sysctl{Key: "net/ipv6/conf/" + uplink + "/accept_ra", Value: "2",
				Why: "the uplink keeps taking router advertisements (its default route) with IPv6 forwarding on"})
		}
	}
	n.Sysctls = append(n.Sysctls, datapath.Sysctl{Key: "net/ipv6/conf/all/forwarding", Value: "1",
		Why: "pod -> IPv6 Service traffic is forwarded by the node's stack"})
	return n
}

// HostIfName is the node-side name of an attachment's service veth: "vsv"
// and 12 hex digits of a hash of container ID and interface, stable across
// restarts.
func HostIfName(containerID, ifName string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifName))
	return HostPrefix + hex.EncodeToString(h[:])[:12]
}

// macFor derives a stable, locally administered unicast MAC per side.
func macFor(key, side string) net.HardwareAddr {
	h := sha256.Sum256([]byte("svc/" + side + "/" + key))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
}

// Interfaces are the two ends of an attachment's service veth as the CNI
// result lists them: the node's, then the pod's.
func Interfaces(a *alloc.Allocation) (host, pod alloc.Interface) {
	return alloc.Interface{Name: HostIfName(a.ContainerID, a.IfName), MAC: macFor(a.Key(), "host").String()},
		alloc.Interface{Name: PodIfName, MAC: macFor(a.Key(), "pod").String(), Sandbox: a.Netns}
}

// Routes are a's routes through the service path, for the CNI result:
// those of the families a has an address of.
func (p *Path) Routes(a *alloc.Allocation) []alloc.Route {
	var out []alloc.Route
	for _, f := range family.All {
		if _, ok := a.LeaseOf(f); !ok {
			continue
		}
		for _, c := range p.cidrs {
			if family.Of(c.Addr()) == f {
				out = append(out, alloc.Route{Dst: c, GW: gatewayOf(c.Addr())})
			}
		}
		for _, ip := range p.nodeIPs {
			if family.Of(ip) == f {
				out = append(out, alloc.Route{Dst: family.Host(ip), GW: gatewayOf(ip)})
			}
		}
	}
	return out
}

// Attach wires the service path of a: the veth pair (its pod end born in
// podNs), the pod's routes and neighbour, the node's route. The pod's
// address must be on its main interface already (the routes use it as
// their source). On failure it removes what it made.
func (p *Path) Attach(podNs netns.NsHandle, pod *netlink.Handle, a *alloc.Allocation) (err error) {
	if a.IfName == PodIfName {
		return &datapath.SetupError{Step: "pod interface", BadRequest: true,
			Err: fmt.Errorf("interface name %s is vpcni's service veth; choose another", PodIfName)}
	}
	hostIf, hostMAC := HostIfName(a.ContainerID, a.IfName), macFor(a.Key(), "host")
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: hostIf, MTU: p.mtu, HardwareAddr: hostMAC, Flags: net.FlagUp},
		PeerName:         PodIfName,
		PeerHardwareAddr: macFor(a.Key(), "pod"),
		PeerNamespace:    netlink.NsFd(int(podNs)),
		PeerMTU:          uint32(p.mtu),
	}
	if err := netlink.LinkAdd(veth); errors.Is(err, syscall.EEXIST) {
		if err := p.clearWay(a, pod); err != nil {
			return err
		}
		veth.Index = 0
		if err := netlink.LinkAdd(veth); err != nil {
			return &datapath.SetupError{Step: "create service veth " + hostIf, Err: err}
		}
	} else if err != nil {
		return &datapath.SetupError{Step: "create service veth " + hostIf, Err: err}
	}
	defer func() {
		if err != nil {
			_ = p.Detach(a)
		}
	}()
	// The kernel ignores an alias given at creation; it marks the link ours.
	if err = netlink.LinkSetAlias(veth, datapath.AliasPrefix+a.Key()); err != nil {
		return &datapath.SetupError{Step: "mark service veth " + hostIf, Err: err}
	}
	link, err := pod.LinkByName(PodIfName)
	if err != nil {
		return &datapath.SetupError{Step: "find pod end " + PodIfName, Err: err}
	}
	_, v6 := a.LeaseOf(family.V6)
	if v6 {
		if err = nlutil.PodIPv6Sysctls(a.Netns, PodIfName); err != nil {
			return &datapath.SetupError{Step: "pod IPv6 sysctls of " + PodIfName, Err: err}
		}
	}
	if err = pod.LinkSetUp(link); err != nil {
		return &datapath.SetupError{Step: "service veth up in the pod", Err: err}
	}
	for _, r := range p.podRoutes(link.Attrs().Index, a) {
		if err = pod.RouteAdd(r); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				return &datapath.SetupError{Step: "pod route " + r.Dst.String(), BadRequest: true,
					Err: errors.New("the pod namespace routes there already: vpcni wires one interface per pod")}
			}
			return &datapath.SetupError{Step: "pod route " + r.Dst.String(), Err: err}
		}
	}
	for _, ip := range a.Addresses() {
		if err = pod.NeighSet(neighbour(link.Attrs().Index, gatewayOf(ip), hostMAC)); err != nil {
			return &datapath.SetupError{Step: "pod service gateway neighbour " + gatewayOf(ip).String(), Err: err}
		}
	}
	podMAC := macFor(a.Key(), "pod")
	for _, ip := range a.Addresses() {
		if err = netlink.RouteReplace(hostRoute(veth.Attrs().Index, ip)); err != nil {
			return &datapath.SetupError{Step: "node route to " + ip.String() + " via " + hostIf, Err: err}
		}
		if family.Of(ip) == family.V6 {
			if err = netlink.NeighSet(neighbour(veth.Attrs().Index, ip, podMAC)); err != nil {
				return &datapath.SetupError{Step: "node neighbour " + ip.String() + " on " + hostIf, Err: err}
			}
		}
	}
	return nil
}

// neighbour is a permanent neighbour entry: ip at mac on link idx.
func neighbour(idx int, ip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	f := netlink.FAMILY_V4
	if family.Of(ip) == family.V6 {
		f = netlink.FAMILY_V6
	}
	return &netlink.Neigh{LinkIndex: idx, Family: f, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
}

// clearWay handles a name clash creating the pair: a leftover node end of
// this attachment (an ADD cut short) is removed; a service veth already in
// the pod is the caller's problem.
func (p *Path) clearWay(a *alloc.Allocation, pod *netlink.Handle) error {
	hostIf := HostIfName(a.ContainerID, a.IfName)
	if _, err := netlink.LinkByName(hostIf); err == nil {
		if err := deleteHostLink(hostIf, a.Key()); err != nil {
			return &datapath.SetupError{Step: "replace leftover " + hostIf, Err: err}
		}
		return nil
	}
	if _, err := pod.LinkByName(PodIfName); err == nil {
		return &datapath.SetupError{Step: "pod service veth", BadRequest: true,
			Err: fmt.Errorf("%s already exists in %s: vpcni wires one interface per pod", PodIfName, a.Netns)}
	}
	return nil
}

// podRoutes are the pod's routes through its service veth, each from the
// pod's address of its family. IPv6's gateway is link-local, on the link
// by definition; IPv4's needs a route of its own.
func (p *Path) podRoutes(idx int, a *alloc.Allocation) []*netlink.Route {
	var out []*netlink.Route
	if _, ok := a.LeaseOf(family.V4); ok {
		out = append(out, &netlink.Route{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: hostNet(Gateway)})
	}
	for _, r := range p.Routes(a) {
		src, _ := a.LeaseOf(family.Of(r.Dst.Addr()))
		out = append(out, &netlink.Route{LinkIndex: idx, Gw: r.GW.AsSlice(), Src: src.Address.AsSlice(),
			Dst: &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())}})
	}
	return out
}

func hostNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}

func hostRoute(linkIdx int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: linkIdx, Scope: netlink.SCOPE_LINK, Dst: hostNet(ip), Protocol: RouteProtocol}
}

// Detach removes a's service veth (the pod end and the node's route go
// with it). Idempotent; a link of another attachment is left alone.
func (p *Path) Detach(a *alloc.Allocation) error {
	return deleteHostLink(HostIfName(a.ContainerID, a.IfName), a.Key())
}

// deleteHostLink removes a node-side service veth if it is there and is
// this attachment's (nlutil.DeleteOwnedVeth).
func deleteHostLink(name, key string) error {
	return nlutil.DeleteOwnedVeth(name, datapath.AliasPrefix+key)
}

// Check says what differs from what Attach made, node and pod side.
func (p *Path) Check(pod *netlink.Handle, a *alloc.Allocation) []error {
	hostIf := HostIfName(a.ContainerID, a.IfName)
	var problems []error
	link, err := netlink.LinkByName(hostIf)
	if err != nil {
		return []error{fmt.Errorf("service veth %s: %w", hostIf, err)}
	}
	if link.Attrs().Alias != datapath.AliasPrefix+a.Key() {
		problems = append(problems, fmt.Errorf("service veth %s has alias %q", hostIf, link.Attrs().Alias))
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("service veth %s is down", hostIf))
	}
	for _, ip := range a.Addresses() {
		if !hasRoutes(&netlink.Handle{}, link.Attrs().Index, []netip.Prefix{family.Host(ip)}) {
			problems = append(problems, fmt.Errorf("node has no route %s dev %s", family.Host(ip), hostIf))
		}
		if family.Of(ip) == family.V6 && !hasNeighbour(&netlink.Handle{}, link.Attrs().Index, ip, macFor(a.Key(), "pod").String()) {
			problems = append(problems, fmt.Errorf("node has no permanent neighbour %s -> %s on %s", ip, macFor(a.Key(), "pod"), hostIf))
		}
	}
	podLink, err := pod.LinkByName(PodIfName)
	if err != nil {
		return append(problems, fmt.Errorf("pod service veth %s: %w", PodIfName, err))
	}
	if podLink.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("pod service veth %s is down", PodIfName))
	}
	var want []netip.Prefix
	for _, r := range p.Routes(a) {
		want = append(want, r.Dst)
	}
	if !hasRoutes(pod, podLink.Attrs().Index, want) {
		problems = append(problems, fmt.Errorf("pod lacks a route of %v via the service gateway dev %s", want, PodIfName))
	}
	hostMAC := macFor(a.Key(), "host").String()
	for _, ip := range a.Addresses() {
		if gw := gatewayOf(ip); !hasNeighbour(pod, podLink.Attrs().Index, gw, hostMAC) {
			problems = append(problems, fmt.Errorf("pod has no permanent neighbour %s -> %s on %s", gw, hostMAC, PodIfName))
		}
	}
	return problems
}

// hasNeighbour says whether the handle's namespace has a permanent
// neighbour ip -> mac on linkIdx.
func hasNeighbour(h *netlink.Handle, linkIdx int, ip netip.Addr, mac string) bool {
	f := netlink.FAMILY_V4
	if family.Of(ip) == family.V6 {
		f = netlink.FAMILY_V6
	}
	neighs, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return h.NeighList(linkIdx, f) })
	if err != nil {
		return false
	}
	for _, n := range neighs {
		if n.IP.Equal(ip.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == mac {
			return true
		}
	}
	return false
}

// hasRoutes says whether every prefix in want is routed out of linkIdx in
// the handle's namespace (zero Handle: the node's).
func hasRoutes(h *netlink.Handle, linkIdx int, want []netip.Prefix) bool {
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: linkIdx}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return false
	}
	have := map[netip.Prefix]bool{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		if ok {
			have[netip.PrefixFrom(ip.Unmap(), ones)] = true
		}
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}
