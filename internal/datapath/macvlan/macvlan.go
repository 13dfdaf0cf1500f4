// Package macvlan is the "macvlan" datapath mode and the code path of
// "ipvlan" (L2) too, which package ipvlan registers: the pod's interface
// is a sub-interface of a node NIC on the pods' network, so the pod sits
// on the subnet itself:
//
//	pod:  eth0 (macvlan, mode bridge, MAC 0a:58:<ip>; or ipvlan L2 with
//	      the parent's MAC), each lease's <ip>/<subnet prefix> (IPv6 with
//	      nodad), a default route per family via the subnet's real
//	      gateway (the lease's; IPv6's may be the router's link-local
//	      address); accept_ra and accept_dad 0 with IPv6
//	      + the service path (package svcpath): vpcni-svc (veth) for the
//	      Service CIDRs and the node's own addresses via 169.254.1.1 and
//	      fe80::1
//	node: nothing on the parent; vsv<hash> with <ip>/32 (and <ipv6>/128
//	      with its neighbour) for the service path, and one masquerade
//	      rule per family for DNATed traffic from it
//
// The pod takes no router advertisements: its addresses and routes are
// the lease's, and a router's advertisement heard on the segment would
// add a SLAAC address and a second default route the provider never
// assigned (which port security drops). Its IPv6 addresses skip duplicate
// address detection (the provider assigned them to it alone), which
// would leave them unusable for ~2 s. On ADD the pod announces its
// addresses (gratuitous ARP, unsolicited neighbour advertisement with
// Override) from its own interface, so neighbours that cached another MAC
// for an address — the pod's predecessor's, on this node or another —
// take the pod's at once.
//
// The sub-interface is created directly inside the pod's namespace (no
// move). Pod <-> pod traffic, same node or not, and pod <-> any host of the
// subnet never touch the node's stack: this is as close to the wire as a
// pod gets without owning a NIC. Pod <-> node goes through the service
// veth, because a macvlan/ipvlan parent does not talk to its own
// sub-interfaces.
//
// When to choose it: the pods' network is a plain L2 segment or a cloud
// subnet whose port security can be told about the pods, and the node's
// stack (iptables, conntrack) on the pod's path costs too much. macvlan
// gives every pod its own MAC: the cloud must allow it on the node's port
// (Info.OwnMACs; the openstack provider adds the MAC to the address pair,
// which Neutron counts against its limit of allowed pairs), and a switch
// port must learn one MAC per pod. ipvlan shares the parent's MAC, so port
// security only has to allow the address — but it needs the kernel's
// ipvlan (CONFIG_IPVLAN), which some kernels lack.
//
// Caveats: Services work only through the service veth, and a Service's
// traffic is masqueraded to the node when it leaves DNATed (so a backend
// sees the node's address as its client, not the pod's); NetworkPolicy
// enforced in the node's stack does not see pod <-> pod traffic; the
// lease must say its subnet and gateway (a provider without them cannot
// feed these modes).
package macvlan

import (
	"context"
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
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/family"
)

// Kind is the sub-interface type: the mode's name.
type Kind string

// The two modes.
const (
	MACVLAN Kind = "macvlan"
	IPVLAN  Kind = "ipvlan"
)

func init() { datapath.Register(Registration(MACVLAN)) }

// Registration is the datapath mode of a kind; package ipvlan registers
// IPVLAN's, so each mode is one line in internal/builtin.
func Registration(k Kind) datapath.Registration {
	return datapath.Registration{
		Name:        string(k),
		Families:    []family.Family{family.V4, family.V6},
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return New(k, node, s.(*Settings))
		},
		Prepare: func(node datapath.Node, _ datapath.Settings) error {
			uplink, _ := nlutil.UplinkName(node.Uplink)
			return svcpath.Prepare(node.Families, uplink)
		},
		Uninstall: func(datapath.Node, datapath.Settings) error { return svcpath.RemoveNAT() },
		Needs: func(node datapath.Node, _ datapath.Settings) datapath.Needs {
			n := svcpath.NeedsFor(node.Families, node.Uplink)
			return datapath.Needs{Links: append([]string{string(k)}, n.Links...), Sysctls: n.Sysctls}
		},
	}
}

// Mode is one node's macvlan or ipvlan datapath.
type Mode struct {
	kind      Kind
	uplink    string
	parent    string
	parentIdx int
	mtu       int
	nodeIP    netip.Addr
	svc       *svcpath.Path
}

// New opens the mode on this node: finds the uplink (default: the default
// route's interface) and the parent (default: the uplink), settles the MTU
// and puts the service path's NAT rule in place.
func New(kind Kind, node datapath.Node, s *Settings) (*Mode, error) {
	uplink, err := nlutil.UplinkName(node.Uplink)
	if err != nil {
		return nil, err
	}
	parent := s.Parent
	if parent == "" {
		parent = uplink
	}
	pl, err := netlink.LinkByName(parent)
	if err != nil {
		return nil, fmt.Errorf("parent %q: %w", parent, err)
	}
	mtu := node.MTU
	if mtu == 0 {
		mtu = pl.Attrs().MTU
	}
	if mtu > pl.Attrs().MTU {
		return nil, fmt.Errorf("mtu %d is larger than parent %s's %d: a %s sub-interface cannot exceed its parent", mtu, parent, pl.Attrs().MTU, kind)
	}
	m := &Mode{kind: kind, uplink: uplink, parent: parent, parentIdx: pl.Attrs().Index, mtu: mtu, nodeIP: nlutil.LinkIPv4(uplink)}
	if m.svc, err = svcpath.Open(node, uplink, s.cidrs(), []netip.Addr{m.nodeIP, nlutil.LinkIPv6(uplink)}, mtu); err != nil {
		return nil, err
	}
	return m, nil
}

// Info implements datapath.Datapath.
func (m *Mode) Info() datapath.Info {
	return datapath.Info{Mode: string(m.kind), Uplink: m.uplink, MTU: m.mtu, NodeIP: nlutil.LinkIPv4(m.uplink), OwnMACs: m.kind == MACVLAN}
}

// Close implements datapath.Datapath: the mode holds nothing open.
func (m *Mode) Close() error { return nil }

// checkLeases says what a's leases lack for an L2 mode (checkLease).
func checkLeases(kind Kind, a *alloc.Allocation) error {
	for _, l := range a.Leases() {
		if err := checkLease(kind, l); err != nil {
			return err
		}
	}
	return nil
}

// checkLease says what the lease lacks for an L2 mode: the pod sits on the
// subnet, so it needs the subnet's prefix and its gateway, and its address
// must live on the parent's port, not on a NIC of its own. An IPv6
// gateway may be the router's link-local address (AWS's, a router
// advertisement's): that is on the segment whatever the subnet.
func checkLease(kind Kind, l alloc.Lease) error {
	var errs []error
	if !l.Prefix.IsValid() {
		errs = append(errs, fmt.Errorf("the lease of %s has no subnet prefix", l.Address))
	} else if !l.Prefix.Contains(l.Address) {
		errs = append(errs, fmt.Errorf("the lease's address %s is outside its subnet %s", l.Address, l.Prefix))
	}
	if !l.Gateway.IsValid() {
		errs = append(errs, fmt.Errorf("the lease of %s has no gateway", l.Address))
	} else if l.Gateway.Is6() && l.Gateway.IsLinkLocalUnicast() && l.Address.Is6() {
		// on the link by definition
	} else if l.Prefix.IsValid() && !l.Prefix.Contains(l.Gateway) {
		errs = append(errs, fmt.Errorf("the lease's gateway %s is outside its subnet %s", l.Gateway, l.Prefix))
	}
	if err := datapath.OnUplink(l, string(kind)); err != nil {
		return err
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w; datapath %s needs both from the provider (static: the range's cidr and gateway; openstack: the subnet's cidr and gateway_ip)",
		errors.Join(errs...), kind)
}

// podMAC is the pod's MAC in macvlan mode (nil for ipvlan: the parent's).
func (m *Mode) podMAC(ip netip.Addr) net.HardwareAddr {
	if m.kind != MACVLAN {
		return nil
	}
	mac, _ := net.ParseMAC(alloc.AddressMAC(ip))
	return mac
}

// newLink is the pod's sub-interface as netlink creates it: born in the
// pod's namespace, hanging off the parent in the node's.
func (m *Mode) newLink(a *alloc.Allocation, podNs netns.NsHandle) netlink.Link {
	attrs := netlink.LinkAttrs{Name: a.IfName, ParentIndex: m.parentIdx, MTU: m.mtu,
		Namespace: netlink.NsFd(int(podNs)), HardwareAddr: m.podMAC(a.Address)}
	if m.kind == IPVLAN {
		return &netlink.IPVlan{LinkAttrs: attrs, Mode: netlink.IPVLAN_MODE_L2}
	}
	// Bridge mode: pods on one parent reach each other inside the kernel.
	return &netlink.Macvlan{LinkAttrs: attrs, Mode: netlink.MACVLAN_MODE_BRIDGE}
}

// wiring is what Setup makes for a: the service veth's node end, the pod's
// sub-interface with its address, the service veth's pod end.
func (m *Mode) wiring(a *alloc.Allocation) alloc.Wiring {
	host, svc := svcpath.Interfaces(a)
	pod := alloc.Interface{Name: a.IfName, Sandbox: a.Netns}
	if mac := m.podMAC(a.Address); mac != nil {
		pod.MAC = mac.String()
	}
	var ips []alloc.IPConfig
	var routes []alloc.Route
	for _, l := range a.Leases() {
		ips = append(ips, alloc.IPConfig{Interface: 1, Address: netip.PrefixFrom(l.Address, l.Prefix.Bits()), Gateway: l.Gateway})
		routes = append(routes, alloc.Route{Dst: family.Of(l.Address).Default(), GW: l.Gateway})
	}
	return alloc.Wiring{
		Interfaces: []alloc.Interface{host, pod, svc},
		IPs:        ips,
		Routes:     append(routes, m.svc.Routes(a)...),
	}
}

// Setup implements datapath.Datapath. On failure it removes whatever it
// created.
func (m *Mode) Setup(_ context.Context, a *alloc.Allocation) (_ alloc.Wiring, err error) {
	if err := checkLeases(m.kind, a); err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "lease", Err: err}
	}
	if a.IfName == svcpath.PodIfName {
		return alloc.Wiring{}, &datapath.SetupError{Step: "pod interface", BadRequest: true,
			Err: fmt.Errorf("interface name %s is vpcni's service veth; choose another", svcpath.PodIfName)}
	}
	opened, err := nlutil.OpenPod(a.Netns)
	if err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "open pod netns " + a.Netns, BadRequest: errors.Is(err, nlutil.ErrNetnsPath), Err: err}
	}
	defer opened.Close()
	podNs, pod := opened.NS, opened.Handle

	link := m.newLink(a, podNs)
	if err := netlink.LinkAdd(link); errors.Is(err, syscall.EEXIST) {
		if !m.ownPodLink(pod, a) {
			return alloc.Wiring{}, &datapath.SetupError{Step: "pod interface", BadRequest: true,
				Err: fmt.Errorf("%s already exists in %s", a.IfName, a.Netns)}
		}
		// A leftover of this very attachment (an ADD cut short): replace it.
		if err := m.deletePodLink(pod, a); err != nil {
			return alloc.Wiring{}, &datapath.SetupError{Step: "replace leftover " + a.IfName, Err: err}
		}
		link = m.newLink(a, podNs)
		if err := netlink.LinkAdd(link); err != nil {
			return alloc.Wiring{}, m.linkError(err)
		}
	} else if err != nil {
		return alloc.Wiring{}, m.linkError(err)
	}
	defer func() {
		if err != nil {
			_ = m.deletePodLink(pod, a)
			_ = m.svc.Detach(a)
		}
	}()
	podLink, err := pod.LinkByName(a.IfName)
	if err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "find pod interface " + a.IfName, Err: err}
	}
	if err = nlutil.AddPodAddresses(pod, podLink, a); err != nil {
		return alloc.Wiring{}, err
	}
	if err = pod.LinkSetUp(podLink); err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "pod link up", Err: err}
	}
	for _, l := range a.Leases() {
		dst := family.Of(l.Address).Default()
		def := &netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: l.Gateway.AsSlice(),
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(0, l.Address.BitLen())}}
		if err = pod.RouteAdd(def); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				return alloc.Wiring{}, &datapath.SetupError{Step: "pod default route", BadRequest: true,
					Err: errors.New("the pod namespace has a default route already: vpcni wires one interface per pod")}
			}
			return alloc.Wiring{}, &datapath.SetupError{Step: "pod default route via " + l.Gateway.String(), Err: err}
		}
	}
	if err = m.svc.Attach(podNs, pod, a); err != nil {
		return alloc.Wiring{}, err
	}
	// Best effort, as mode veth's: a neighbour that misses it asks again
	// once its entry goes stale.
	_ = nlutil.AnnounceIn(a.Netns, a.IfName, a.Addresses())
	return m.wiring(a), nil
}

// linkError explains a failure to create the sub-interface.
func (m *Mode) linkError(err error) error {
	if m.kind == IPVLAN && errors.Is(err, syscall.EOPNOTSUPP) {
		err = fmt.Errorf("%w: this kernel has no ipvlan (CONFIG_IPVLAN); use datapath macvlan or veth", err)
	}
	return &datapath.SetupError{Step: fmt.Sprintf("create %s on %s", m.kind, m.parent), Err: err}
}

// ownPodLink says whether the pod's interface of a's name is one this mode
// made for a: the right type, on the right parent, with a's MAC (macvlan)
// or no address but a's (ipvlan: it shares the parent's MAC).
func (m *Mode) ownPodLink(pod *netlink.Handle, a *alloc.Allocation) bool {
	l, err := pod.LinkByName(a.IfName)
	if err != nil || l.Type() != string(m.kind) {
		return false
	}
	if m.kind == MACVLAN {
		return l.Attrs().HardwareAddr.String() == m.podMAC(a.Address).String()
	}
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return pod.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return false
	}
	mine := map[netip.Addr]bool{}
	for _, ip := range a.Addresses() {
		mine[ip] = true
	}
	for _, ad := range addrs {
		if ip, _ := netip.AddrFromSlice(ad.IP); !mine[ip.Unmap()] && !ip.IsLinkLocalUnicast() {
			return false
		}
	}
	return true
}

// deletePodLink removes the pod's sub-interface if it is a's.
func (m *Mode) deletePodLink(pod *netlink.Handle, a *alloc.Allocation) error {
	if !m.ownPodLink(pod, a) {
		return nil
	}
	l, err := pod.LinkByName(a.IfName)
	if err != nil {
		return nil
	}
	if err := pod.LinkDel(l); err != nil && !nlutil.IsNotFound(err) {
		return fmt.Errorf("delete pod interface %s: %w", a.IfName, err)
	}
	return nil
}

// Teardown implements datapath.Datapath: the pod's sub-interface goes (the
// address leaves the network at once) and its service veth. Idempotent: a
// namespace already gone took both pod ends with it.
func (m *Mode) Teardown(_ context.Context, a *alloc.Allocation) error {
	var errs []error
	if a.Netns != "" {
		switch opened, err := nlutil.OpenPod(a.Netns); {
		case err == nil:
			errs = append(errs, m.deletePodLink(opened.Handle, a))
			opened.Close()
		case !errors.Is(err, nlutil.ErrNetnsPath): // a namespace already gone took the pod's end with it
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.svc.Detach(a))
	return errors.Join(errs...)
}

// Check implements datapath.Datapath.
func (m *Mode) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	if err := checkLeases(m.kind, a); err != nil {
		return alloc.Wiring{}, err
	}
	return m.wiring(a), m.check(a)
}

// Trace implements datapath.Datapath: the pod as a whole, as Check sees
// it (one hop per problem).
func (m *Mode) Trace(ctx context.Context, a *alloc.Allocation) []datapath.Hop {
	_, err := m.Check(ctx, a)
	return datapath.HopsOf(string(m.kind)+" wiring of "+a.Address.String(), err)
}

func (m *Mode) check(a *alloc.Allocation) error {
	opened, err := nlutil.OpenPod(a.Netns)
	if err != nil {
		return err
	}
	defer opened.Close()
	pod := opened.Handle
	var problems []error
	link, err := pod.LinkByName(a.IfName)
	switch {
	case err != nil:
		problems = append(problems, fmt.Errorf("pod interface %s: %w", a.IfName, err))
	case link.Type() != string(m.kind):
		problems = append(problems, fmt.Errorf("pod interface %s is a %s, not a %s", a.IfName, link.Type(), m.kind))
	default:
		problems = append(problems, m.checkPodLink(pod, link, a)...)
	}
	problems = append(problems, m.svc.Check(pod, a)...)
	return errors.Join(problems...)
}

func (m *Mode) checkPodLink(pod *netlink.Handle, link netlink.Link, a *alloc.Allocation) []error {
	var problems []error
	if link.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Errorf("pod interface %s is down", a.IfName))
	}
	if mac := m.podMAC(a.Address); mac != nil && link.Attrs().HardwareAddr.String() != mac.String() {
		problems = append(problems, fmt.Errorf("pod interface %s has MAC %s, not %s", a.IfName, link.Attrs().HardwareAddr, mac))
	}
	if link.Attrs().ParentIndex != m.parentIdx {
		problems = append(problems, fmt.Errorf("pod interface %s hangs off link %d, not %s", a.IfName, link.Attrs().ParentIndex, m.parent))
	}
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return pod.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return append(problems, fmt.Errorf("pod addresses: %w", err))
	}
	have := map[netip.Prefix]bool{}
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		have[netip.PrefixFrom(ip.Unmap(), ones)] = true
	}
	routes, err := nlutil.RetryDump(func() ([]netlink.Route, error) {
		return pod.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: link.Attrs().Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return append(problems, fmt.Errorf("pod routes: %w", err))
	}
	for _, l := range a.Leases() {
		if want := netip.PrefixFrom(l.Address, l.Prefix.Bits()); !have[want] {
			problems = append(problems, fmt.Errorf("pod interface %s lacks %s", a.IfName, want))
		}
		found := false
		for _, r := range routes {
			ones := 0
			if r.Dst != nil {
				ones, _ = r.Dst.Mask.Size()
			}
			found = found || ones == 0 && r.Gw.Equal(l.Gateway.AsSlice())
		}
		if !found {
			problems = append(problems, fmt.Errorf("pod has no default route via %s dev %s", l.Gateway, a.IfName))
		}
	}
	return problems
}

// Reconcile implements datapath.Datapath: the node side of these modes is
// the service path alone (the sub-interfaces live in the pods).
func (m *Mode) Reconcile(_ context.Context, want datapath.Desired) (datapath.Report, error) {
	return m.svc.Reconcile(want.Allocations, want.Leave)
}

var _ datapath.Datapath = (*Mode)(nil)
