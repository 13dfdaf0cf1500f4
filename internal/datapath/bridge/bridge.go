// Package bridge is the bridge datapath mode ("bridge", seed 001's first
// design, kube-ovn's underlay): the node becomes a switch on its own
// network.
//
//	node: bridge vpcbr0 holds the uplink as a port; the node's IPv4
//	      and global IPv6 addresses, its routes through the uplink (every table) and its
//	      permanent neighbours move onto the bridge, which carries the
//	      uplink's MAC (the cloud port's MAC stays the node's source MAC)
//	      and MTU
//	pod:  eth0 (veth, its host end vpb<hash> a port of the bridge) with
//	      each lease's address and subnet prefix (IPv6 with nodad), MAC
//	      alloc.AddressMAC of the first, default of each family via the
//	      lease's gateway; accept_ra 0 in the pod
//
// When to choose it: pods must be plain L2 neighbours of everything on the
// segment (their own MACs, ARP answered by the pod itself, no proxy ARP on
// the node, no per-pod host routes), and same-node pod traffic should be
// switched, not routed. What it needs from the cloud: the port must let
// frames from the pods' MACs through (Info.OwnMACs: the openstack provider
// allows alloc.AddressMAC(address) as allowed address pairs with a MAC,
// which count against Neutron's limit on pairs), or port security off.
// Physical L2 needs nothing.
//
// Caveats. The node's address moves from the uplink to the bridge: whatever
// names the uplink by interface (a program started with "eth0", a firewall
// rule with -i eth0) now sees the bridge (seed 001 lost flannel to this).
// The move keeps the node reachable — the uplink is enslaved first, the
// kernel keeps delivering to an address on any of its interfaces, routes
// are switched with one atomic replace each — measured from a neighbour
// probing every 10 ms (test/bridge, test/lab print "bridge-move:"). Global
// IPv6 addresses and IPv6 routes move like IPv4 ones (link-local ones stay:
// the bridge, with the uplink's MAC, has the same link-local and EUI-64
// SLAAC addresses), and the bridge takes router advertisements (accept_ra
// 2) when the uplink took them. A pod reaching itself through a Service
// would need hairpin mode on its port; it is off, since hairpin echoes the
// pod's own IPv6 DAD probes back and fails its link-local address.
//
// Services. Bridged frames never reach the node's IP layer, so kube-proxy's
// DNAT would not see pod -> ClusterIP traffic (seed 001). The kernel's
// br_netfilter runs iptables on bridged IPv4 when either the global sysctl
// net.bridge.bridge-nf-call-iptables or the bridge's own nf_call_iptables
// option (IFLA_BR_NF_CALL_IPTABLES) is on. vpcni turns on its own bridge's
// option only: the global sysctl changes every bridge on the node (docker0,
// a VM's bridge), which is what made seed 001's colleagues advise against
// it. With IPv6 pods the bridge's own nf_call_ip6tables option goes on
// too (not net.bridge.bridge-nf-call-ip6tables, for the same reason), so
// kube-proxy's ip6tables rules see bridged IPv6 the same way. The DNAT'ed
// frame is re-routed by br_netfilter, bridged to a backend on the segment
// or on the node, and conntrack un-DNATs the reply on the bridge's
// post-routing hook. That re-routing needs IPv4 forwarding on
// (measured on this 6.18 kernel: with net.ipv4.ip_forward=0 the DNAT'ed SYN
// is dropped, the rule counts it and conntrack never confirms it), so the
// mode turns it on as Kubernetes nodes have it. Without br_netfilter in the kernel the option
// does nothing: New refuses to start then (no /proc/sys/net/bridge), since
// Services would silently break.
//
// Undo: Uninstall (vpcnictl uninstall-cni --agent-config) moves the
// addresses, routes and neighbours back onto the uplink, releases it and
// deletes the bridge and any pod links left on it.
package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/family"
)

func init() {
	datapath.Register(datapath.Registration{
		Name:        "bridge",
		Families:    []family.Family{family.V4, family.V6},
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return New(node, *s.(*Settings))
		},
		Prepare: func(datapath.Node, datapath.Settings) error { return Prepare() },
		Needs:   func(datapath.Node, datapath.Settings) datapath.Needs { return needs },
		Uninstall: func(node datapath.Node, s datapath.Settings) error {
			return Uninstall(node.Uplink, *s.(*Settings))
		},
	})
}

// Settings is the mode's section of vpcnid.yaml (datapath.bridge).
type Settings struct {
	// Bridge is the name of the bridge that takes the uplink (default
	// vpcbr0).
	Bridge string `json:"bridge,omitempty"`
}

// DefaultBridge is the bridge's name unless the config says otherwise.
const DefaultBridge = "vpcbr0"

// Defaults implements datapath.Settings.
func (s *Settings) Defaults() {
	if s.Bridge == "" {
		s.Bridge = DefaultBridge
	}
}

// Validate implements datapath.Settings.
func (s *Settings) Validate() error {
	var errs []error
	if len(s.Bridge) > 15 {
		errs = append(errs, fmt.Errorf("bridge: %q is longer than 15 bytes, the kernel's limit on an interface name", s.Bridge))
	}
	for _, c := range s.Bridge {
		if c == '/' || c == ':' || c <= ' ' || c > '~' {
			errs = append(errs, fmt.Errorf("bridge: %q is not a valid interface name (no '/', ':', space or non-ASCII)", s.Bridge))
			break
		}
	}
	return errors.Join(errs...)
}

// AliasPrefix starts the alias of every link vpcni makes.
const AliasPrefix = datapath.AliasPrefix

// BridgeAlias marks the bridge as vpcni's.
const BridgeAlias = AliasPrefix + "bridge"

// SetupError is the datapath's: which step failed, and whose fault.
type SetupError = datapath.SetupError

// Bridge is the bridge datapath of one node.
type Bridge struct {
	name   string // the bridge
	uplink string // its port towards the network
	mtu    int    // the pods' MTU
	v6     bool   // pods have IPv6 addresses: bridged IPv6 goes to ip6tables
}

// New takes the uplink into the bridge (see takeUplink) and returns the
// datapath. A restarted agent finds the move done and changes nothing.
func New(node datapath.Node, s Settings) (*Bridge, error) {
	s.Defaults()
	if err := Prepare(); err != nil {
		return nil, err
	}
	uplink, err := findUplink(node.Uplink, s.Bridge)
	if err != nil {
		return nil, err
	}
	v6 := family.Has(node.Families, family.V6)
	br, err := takeUplink(uplink, s.Bridge, v6)
	if err != nil {
		return nil, err
	}
	mtu := node.MTU
	if mtu == 0 {
		mtu = br.Attrs().MTU
	}
	if node.Log != nil {
		node.Log.Info("bridge holds the uplink", "bridge", s.Bridge, "uplink", uplink, "mtu", mtu)
	}
	return &Bridge{name: s.Bridge, uplink: uplink, mtu: mtu, v6: v6}, nil
}

// Info implements datapath.Datapath: the node's address is on the bridge
// now, and pods send with their own MACs.
func (b *Bridge) Info() datapath.Info {
	ip := netip.Addr{}
	if br, err := netlink.LinkByName(b.name); err == nil {
		ip = nlutil.LinkIPv4(br.Attrs().Name)
	}
	return datapath.Info{Mode: "bridge", Uplink: b.name + " (port " + b.uplink + ")", NodeLink: b.name, MTU: b.mtu, NodeIP: ip, OwnMACs: true, PodVeth: true}
}

// Close implements datapath.Datapath: the mode holds nothing open.
func (b *Bridge) Close() error { return nil }

// HostIfName is the node-side name of an attachment's veth: "vpb" and 11
// hex digits of a hash of container ID and interface, stable across
// restarts.
func HostIfName(containerID, ifName string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "vpb" + hex.EncodeToString(h[:])[:11]
}

// hostMAC is the host end's MAC: stable and locally administered. It
// never appears on the network (the host end is a bridge port, it sends
// nothing of its own).
func hostMAC(key string) net.HardwareAddr {
	h := sha256.Sum256([]byte("bridge-host/" + key))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
}

// leaseError says what bridge mode needs of each of a's leases: pods sit
// on the subnet itself, so they need its prefix and its gateway. It is
// the provider's (the node's config), not the pod's, fault.
func leaseError(a *alloc.Allocation) error {
	for _, l := range a.Leases() {
		if err := leaseErrorOf(l); err != nil {
			return err
		}
	}
	return nil
}

func leaseErrorOf(l alloc.Lease) error {
	switch {
	case !l.Address.IsValid() || l.Address.Is4In6():
		return fmt.Errorf("address %s is neither IPv4 nor IPv6", l.Address)
	case !l.Prefix.IsValid():
		return fmt.Errorf("the lease for %s has no subnet prefix: bridge mode puts pods on the subnet itself (give the provider's range a gateway, or use a provider that knows its subnet)", l.Address)
	case !l.Prefix.Contains(l.Address):
		return fmt.Errorf("the lease's prefix %s does not contain its address %s", l.Prefix, l.Address)
	case !l.Gateway.IsValid():
		return fmt.Errorf("the lease for %s has no gateway: bridge mode routes pods via the subnet's own router (set the range's gateway)", l.Address)
	case l.Gateway.Is6() && l.Gateway.IsLinkLocalUnicast() && l.Address.Is6():
		// A router's link-local address (AWS's, a router advertisement's)
		// is on the segment whatever the subnet.
	case !l.Prefix.Contains(l.Gateway) || l.Gateway == l.Address:
		return fmt.Errorf("gateway %s is not another address of the lease's subnet %s", l.Gateway, l.Prefix)
	}
	return datapath.OnUplink(l, "bridge")
}

// bits is the address length of ip's family.
func bits(ip netip.Addr) int { return ip.BitLen() }

// defaultDst is the default destination of ip's family.
func defaultDst(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
}

// wiring is what Setup makes for a.
func wiring(a *alloc.Allocation) alloc.Wiring {
	var ips []alloc.IPConfig
	var routes []alloc.Route
	for _, l := range a.Leases() {
		ips = append(ips, alloc.IPConfig{Interface: 1, Address: netip.PrefixFrom(l.Address, l.Prefix.Bits()), Gateway: l.Gateway})
		routes = append(routes, alloc.Route{Dst: defaultDst(l.Address), GW: l.Gateway})
	}
	return alloc.Wiring{
		Interfaces: []alloc.Interface{
			{Name: HostIfName(a.ContainerID, a.IfName), MAC: hostMAC(a.Key()).String()},
			{Name: a.IfName, MAC: alloc.AddressMAC(a.Address), Sandbox: a.Netns},
		},
		IPs:    ips,
		Routes: routes,
	}
}

// Setup implements datapath.Datapath. On failure it removes whatever it
// created.
func (b *Bridge) Setup(_ context.Context, a *alloc.Allocation) (_ alloc.Wiring, err error) {
	if err := leaseError(a); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "lease", Err: err}
	}
	br, err := netlink.LinkByName(b.name)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "find bridge " + b.name, Err: err}
	}
	opened, err := nlutil.OpenPod(a.Netns)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "open pod netns " + a.Netns, BadRequest: errors.Is(err, nlutil.ErrNetnsPath), Err: err}
	}
	defer opened.Close()
	podNs, pod := opened.NS, opened.Handle
	// A leftover of this very attachment (an ADD cut short, its pod end
	// still in the pod) goes first; only then is an interface of the same
	// name the caller's clash.
	name := HostIfName(a.ContainerID, a.IfName)
	if err := deleteHostLink(name, a.Key()); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "replace leftover " + name, Err: err}
	}
	if _, err := pod.LinkByName(a.IfName); err == nil {
		return alloc.Wiring{}, &SetupError{Step: "pod interface", BadRequest: true,
			Err: fmt.Errorf("%s already exists in %s", a.IfName, a.Netns)}
	}
	podMAC, _ := net.ParseMAC(alloc.AddressMAC(a.Address))
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name: name, MTU: b.mtu, HardwareAddr: hostMAC(a.Key()), MasterIndex: br.Attrs().Index,
		},
		PeerName:         a.IfName,
		PeerHardwareAddr: podMAC,
		PeerNamespace:    netlink.NsFd(int(podNs)),
		PeerMTU:          uint32(b.mtu),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		// LinkAdd may fail after creating the pair (setting the master).
		_ = deleteHostLink(name, a.Key())
		return alloc.Wiring{}, &SetupError{Step: "create veth " + name + " on " + b.name, Err: err}
	}
	defer func() {
		if err != nil {
			_ = deleteHostLink(name, a.Key())
		}
	}()
	// The kernel ignores an alias given at creation; it marks the link ours.
	if err = netlink.LinkSetAlias(veth, AliasPrefix+a.Key()); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "mark host end " + name, Err: err}
	}
	podLink, err := pod.LinkByName(a.IfName)
	if err != nil {
		return alloc.Wiring{}, &SetupError{Step: "find pod end " + a.IfName, Err: err}
	}
	if _, ok := a.LeaseOf(family.V6); ok {
		if err = nlutil.PodIPv6Sysctls(a.Netns, a.IfName); err != nil {
			return alloc.Wiring{}, &SetupError{Step: "pod IPv6 sysctls", Err: err}
		}
	}
	for _, l := range a.Leases() {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: l.Address.AsSlice(), Mask: net.CIDRMask(l.Prefix.Bits(), bits(l.Address))}}
		if l.Address.Is6() {
			// Without it the address is tentative, unusable, for ~2 s.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err = pod.AddrAdd(podLink, addr); err != nil {
			return alloc.Wiring{}, &SetupError{Step: "pod address " + l.Address.String(), Err: err}
		}
	}
	if err = pod.LinkSetUp(podLink); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "pod link up", Err: err}
	}
	for _, l := range a.Leases() {
		dst := defaultDst(l.Address)
		def := &netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: l.Gateway.AsSlice(), Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(0, bits(l.Address))}}
		if err = pod.RouteAdd(def); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				return alloc.Wiring{}, &SetupError{Step: "pod default route", BadRequest: true,
					Err: errors.New("the pod namespace already has a default route: vpcni wires one interface per pod")}
			}
			return alloc.Wiring{}, &SetupError{Step: "pod default route via " + l.Gateway.String(), Err: err}
		}
	}
	// Up last: the port forwards only once the pod end is configured.
	if err = netlink.LinkSetUp(veth); err != nil {
		return alloc.Wiring{}, &SetupError{Step: "host end up", Err: err}
	}
	return wiring(a), nil
}

// Teardown implements datapath.Datapath: the host veth goes, and the pod
// end with it. Idempotent.
func (b *Bridge) Teardown(_ context.Context, a *alloc.Allocation) error {
	return deleteHostLink(HostIfName(a.ContainerID, a.IfName), a.Key())
}

// deleteHostLink removes the host veth if it is there and is this
// attachment's (nlutil.DeleteOwnedVeth).
func deleteHostLink(name, key string) error { return nlutil.DeleteOwnedVeth(name, AliasPrefix+key) }

// Check implements datapath.Datapath.
func (b *Bridge) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	if err := leaseError(a); err != nil {
		return alloc.Wiring{}, err
	}
	return wiring(a), errors.Join(b.checkNode(a), b.checkPod(a))
}

// Trace implements datapath.Datapath: the pod as a whole, as Check sees
// it (one hop per problem).
func (b *Bridge) Trace(ctx context.Context, a *alloc.Allocation) []datapath.Hop {
	_, err := b.Check(ctx, a)
	return datapath.HopsOf("bridge wiring of "+a.Address.String(), err)
}

func (b *Bridge) checkNode(a *alloc.Allocation) error {
	br, err := netlink.LinkByName(b.name)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", b.name, err)
	}
	var problems []error
	if on, err := nfCallIptables(br.Attrs().Index); err != nil || !on {
		problems = append(problems, fmt.Errorf("bridge %s does not pass bridged IPv4 to iptables (nf_call_iptables off): pods cannot reach Services", b.name))
	}
	if on, err := nfCallIp6tables(br.Attrs().Index); b.v6 && (err != nil || !on) {
		problems = append(problems, fmt.Errorf("bridge %s does not pass bridged IPv6 to ip6tables (nf_call_ip6tables off): pods cannot reach IPv6 Services", b.name))
	}
	name := HostIfName(a.ContainerID, a.IfName)
	link, err := netlink.LinkByName(name)
	if err != nil {
		return errors.Join(append(problems, fmt.Errorf("host veth %s: %w", name, err))...)
	}
	if link.Attrs().Alias != AliasPrefix+a.Key() {
		problems = append(problems, fmt.Errorf("host veth %s has alias %q", name, link.Attrs().Alias))
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("host veth %s is down", name))
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		problems = append(problems, fmt.Errorf("host veth %s is not a port of %s", name, b.name))
	}
	return errors.Join(problems...)
}

func (b *Bridge) checkPod(a *alloc.Allocation) error {
	opened, err := nlutil.OpenPod(a.Netns)
	if err != nil {
		return err
	}
	defer opened.Close()
	pod := opened.Handle
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		return fmt.Errorf("pod interface %s: %w", a.IfName, err)
	}
	var problems []error
	if link.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("pod interface %s is down", a.IfName))
	}
	if mac := alloc.AddressMAC(a.Address); link.Attrs().HardwareAddr.String() != mac {
		problems = append(problems, fmt.Errorf("pod interface %s has MAC %s, not %s (the cloud port allows only that one)", a.IfName, link.Attrs().HardwareAddr, mac))
	}
	for _, l := range a.Leases() {
		problems = append(problems, checkPodLease(pod, link, a.IfName, l))
	}
	return errors.Join(problems...)
}

// checkPodLease: l's address and its family's default route via l's
// gateway on the pod's interface.
func checkPodLease(pod *netlink.Handle, link netlink.Link, ifName string, l alloc.Lease) error {
	fam := netlink.FAMILY_V4
	if l.Address.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return pod.AddrList(link, fam) })
	if err != nil {
		return fmt.Errorf("pod addresses: %w", err)
	}
	var problems []error
	want := netip.PrefixFrom(l.Address, l.Prefix.Bits())
	found := false
	for _, ad := range addrs {
		if p, ok := prefixOf(ad.IPNet); ok && p == want {
			found = true
		}
	}
	if !found {
		problems = append(problems, fmt.Errorf("pod interface %s lacks %s", ifName, want))
	}
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return pod.RouteListFiltered(fam, &netlink.Route{LinkIndex: link.Attrs().Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return errors.Join(append(problems, fmt.Errorf("pod routes: %w", err))...)
	}
	found = false
	for _, r := range routes {
		if r.Gw.Equal(l.Gateway.AsSlice()) && (r.Dst == nil || isZeroMask(r.Dst.Mask)) {
			found = true
		}
	}
	if !found {
		problems = append(problems, fmt.Errorf("pod has no default route via %s dev %s", l.Gateway, ifName))
	}
	return errors.Join(problems...)
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip, ones), true
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

var _ datapath.Datapath = (*Bridge)(nil)
