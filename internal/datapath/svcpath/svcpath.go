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
// Why a Service needs NAT here: a client pod's packet to a ClusterIP
// enters the node through its service veth and kube-proxy DNATs it to a
// backend pod. That pod's reply to the client's address would go straight
// over L2 (the client is on its subnet), never through the node's
// conntrack, and reach the client from the backend's address instead of
// the ClusterIP's: the client drops it. So what arrives from a service
// veth and leaves DNATed is masqueraded to the node, whose conntrack then
// sees both ways. The rule lives in nftables table ip vpcni_svcpath,
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
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// PodIfName is the service veth's name in the pod. A CNI interface of the
// same name is refused (it would clash).
const PodIfName = "vpcni-svc"

// HostPrefix starts the node-side name of every service veth; the NAT
// rule matches on it.
const HostPrefix = "vsv"

// Gateway is the link-local next hop of the service routes in the pod.
var Gateway = netip.MustParseAddr("169.254.1.1")

// RouteProtocol marks the node routes vpcni installs; the same value as
// the routed veth mode's, so tools that list vpcni's routes find both.
const RouteProtocol netlink.RouteProtocol = 0xa7

// Path is the service path of one node.
type Path struct {
	cidrs  []netip.Prefix
	nodeIP netip.Addr
	mtu    int
}

// New returns the service path for Service CIDRs and the node's own
// address on the pods' network (invalid: no route to it is made); mtu is
// the veths'.
func New(cidrs []netip.Prefix, nodeIP netip.Addr, mtu int) *Path {
	return &Path{cidrs: cidrs, nodeIP: nodeIP, mtu: mtu}
}

// Open returns the service path of this node and readies the node for it:
// forwarding on (pod -> Service -> pod passes through the node) and the
// NAT rule in place.
func Open(cidrs []netip.Prefix, nodeIP netip.Addr, mtu int) (*Path, error) {
	if err := Prepare(); err != nil {
		return nil, err
	}
	if _, err := EnsureNAT(); err != nil {
		return nil, err
	}
	return New(cidrs, nodeIP, mtu), nil
}

// Prepare sets the sysctl the service path needs (forwarding); a mode's
// Prepare step runs it from the privileged init container. It writes only
// what differs, so an agent without a writable /proc/sys starts once that
// step ran.
func Prepare() error { return nlutil.WriteSysctls(Needs.Sysctls) }

// Needs is what the service path needs of the node's kernel: its veths
// and forwarding.
var Needs = datapath.Needs{Links: []string{"veth"}, Sysctls: []datapath.Sysctl{datapath.Forwarding}}

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

// Routes are the pod's routes through the service path, for the CNI
// result.
func (p *Path) Routes() []alloc.Route {
	var out []alloc.Route
	for _, c := range p.cidrs {
		out = append(out, alloc.Route{Dst: c, GW: Gateway})
	}
	if p.nodeIP.IsValid() {
		out = append(out, alloc.Route{Dst: netip.PrefixFrom(p.nodeIP, 32), GW: Gateway})
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
	if err = pod.LinkSetUp(link); err != nil {
		return &datapath.SetupError{Step: "service veth up in the pod", Err: err}
	}
	for _, r := range p.podRoutes(link.Attrs().Index, a.Address) {
		if err = pod.RouteAdd(r); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				return &datapath.SetupError{Step: "pod route " + r.Dst.String(), BadRequest: true,
					Err: errors.New("the pod namespace routes there already: vpcni wires one interface per pod")}
			}
			return &datapath.SetupError{Step: "pod route " + r.Dst.String(), Err: err}
		}
	}
	gw := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: Gateway.AsSlice(), HardwareAddr: hostMAC}
	if err = pod.NeighSet(gw); err != nil {
		return &datapath.SetupError{Step: "pod service gateway neighbour", Err: err}
	}
	if err = netlink.RouteReplace(hostRoute(veth.Attrs().Index, a.Address)); err != nil {
		return &datapath.SetupError{Step: "node route to pod via " + hostIf, Err: err}
	}
	return nil
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

// podRoutes are the pod's routes through its service veth.
func (p *Path) podRoutes(idx int, podIP netip.Addr) []*netlink.Route {
	gw := Gateway.AsSlice()
	out := []*netlink.Route{{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: hostNet(Gateway)}}
	for _, r := range p.Routes() {
		out = append(out, &netlink.Route{LinkIndex: idx, Gw: gw, Src: podIP.AsSlice(),
			Dst: &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)}})
	}
	return out
}

func hostNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
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
	if !hasRoutes(&netlink.Handle{}, link.Attrs().Index, []netip.Prefix{netip.PrefixFrom(a.Address, 32)}) {
		problems = append(problems, fmt.Errorf("node has no route %s/32 dev %s", a.Address, hostIf))
	}
	podLink, err := pod.LinkByName(PodIfName)
	if err != nil {
		return append(problems, fmt.Errorf("pod service veth %s: %w", PodIfName, err))
	}
	if podLink.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("pod service veth %s is down", PodIfName))
	}
	var want []netip.Prefix
	for _, r := range p.Routes() {
		want = append(want, r.Dst)
	}
	if !hasRoutes(pod, podLink.Attrs().Index, want) {
		problems = append(problems, fmt.Errorf("pod lacks a route of %v via %s dev %s", want, Gateway, PodIfName))
	}
	neighs, err := nlutil.RetryDump(func() ([]netlink.Neigh, error) { return pod.NeighList(podLink.Attrs().Index, netlink.FAMILY_V4) })
	if err != nil {
		return append(problems, fmt.Errorf("pod neighbours: %w", err))
	}
	hostMAC := macFor(a.Key(), "host").String()
	found := false
	for _, n := range neighs {
		found = found || n.IP.Equal(Gateway.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == hostMAC
	}
	if !found {
		problems = append(problems, fmt.Errorf("pod has no permanent neighbour %s -> %s on %s", Gateway, hostMAC, PodIfName))
	}
	return problems
}

// hasRoutes says whether every prefix in want is routed out of linkIdx in
// the handle's namespace (zero Handle: the node's).
func hasRoutes(h *netlink.Handle, linkIdx int, want []netip.Prefix) bool {
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: linkIdx}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return false
	}
	have := map[netip.Prefix]bool{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		if ok {
			have[netip.PrefixFrom(ip, ones)] = true
		}
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}
