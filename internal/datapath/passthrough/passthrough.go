// Package passthrough is the "passthrough" datapath mode (seed 000's
// host-device with a service veth): each pod owns a whole NIC — a cloud
// port the provider attached to the VM for it — moved into the pod's
// namespace as its interface:
//
//	pod:  eth0 = the NIC (the port's MAC), each lease's <ip>/<subnet
//	      prefix> (IPv6 with nodad; accept_ra and accept_dad 0), a
//	      default route per family via the subnet's gateway
//	      + the service path (package svcpath): vpcni-svc (veth) for the
//	      Service CIDRs and the node's own addresses via 169.254.1.1 and
//	      fe80::1
//	node: the NIC is gone from it while the pod runs; vsv<hash> with
//	      <ip>/32 (and <ipv6>/128) for the service path, one masquerade
//	      rule per family for DNATed traffic from it
//
// A dual-stack pod's addresses are all on its one NIC: the first lease
// names it (Lease.NIC, whose address is the pod's), the others name the
// same NIC or none. The addresses are announced from the NIC on ADD
// (gratuitous ARP, unsolicited neighbour advertisement), as in macvlan.
//
// The provider (openstack, mode passthrough) creates a Neutron port per
// pod address and attaches it through Nova's os-interface; the lease names
// the NIC by its MAC (Lease.NIC), which is how the mode finds it: a
// hot-plugged NIC comes up under any name. DEL gives the NIC back to the
// node under the name it had, down and bare, so the provider can detach it
// and delete its port.
//
// When to choose it: the pod needs the cloud's whole port — its own port
// security, security groups and floating IP, the wire's speed with no
// bridge or sub-interface in the way — or the network is a shared
// provider network where a project member may create ports but not add
// addresses to its VM's port (NEUTRON-FACTS "Who may do what"). Caveats:
// the VM takes a limited number of NICs (the provider reports it as
// capacity); an ADD without a warm NIC waits for Nova's attach (~1 s);
// Services go through the service veth and are masqueraded as in macvlan.
package passthrough

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/family"
)

func init() {
	datapath.Register(datapath.Registration{
		Name:        "passthrough",
		Families:    []family.Family{family.V4, family.V6},
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return New(node, s.(*Settings))
		},
		Prepare: func(node datapath.Node, _ datapath.Settings) error {
			uplink, _ := nlutil.UplinkName(node.Uplink)
			return svcpath.Prepare(node.Families, uplink)
		},
		Uninstall: func(datapath.Node, datapath.Settings) error { return svcpath.RemoveNAT() },
		// The pod's NIC is the cloud's: only the service path is made here.
		Needs: func(node datapath.Node, _ datapath.Settings) datapath.Needs {
			return svcpath.NeedsFor(node.Families, node.Uplink)
		},
	})
}

// Settings is the mode's section of vpcnid.yaml (datapath.passthrough).
type Settings struct {
	svcpath.Settings
}

// Mode is one node's passthrough datapath.
type Mode struct {
	uplink string
	mtu    int
	svc    *svcpath.Path
}

// New opens the mode on this node and puts the service path's NAT rule in
// place.
func New(node datapath.Node, s *Settings) (*Mode, error) {
	ul, err := nlutil.Uplink(node.Uplink)
	if err != nil {
		return nil, err
	}
	uplink, mtu := ul.Attrs().Name, node.MTU
	if mtu == 0 {
		mtu = ul.Attrs().MTU
	}
	m := &Mode{uplink: uplink, mtu: mtu}
	if m.svc, err = svcpath.Open(node, uplink, s.CIDRs(), []netip.Addr{nlutil.LinkIPv4(uplink), nlutil.LinkIPv6(uplink)}, mtu); err != nil {
		return nil, err
	}
	return m, nil
}

// Info implements datapath.Datapath: pods send from their own port's MAC,
// which its port security allows already.
func (m *Mode) Info() datapath.Info {
	return datapath.Info{Mode: "passthrough", Uplink: m.uplink, MTU: m.mtu, NodeIP: nlutil.LinkIPv4(m.uplink)}
}

// Close implements datapath.Datapath: the mode holds nothing open.
func (m *Mode) Close() error { return nil }

// checkLeases says what a's leases lack: the first a NIC of its own that
// carries its address, the others that NIC or none, each its subnet and
// gateway.
func checkLeases(a *alloc.Allocation) error {
	if l := a.Lease; l.NIC == nil || l.NIC.Address != l.Address {
		return fmt.Errorf("the lease of %s names no NIC of its own: datapath passthrough needs a provider that attaches a port per pod (openstack mode: passthrough)", l.Address)
	}
	for _, l := range a.Leases() {
		switch {
		case l.NIC != nil && !strings.EqualFold(l.NIC.MAC, a.NIC.MAC):
			return fmt.Errorf("the lease of %s names NIC %s, not the pod's %s: a pod has one NIC", l.Address, l.NIC.MAC, a.NIC.MAC)
		case !l.Prefix.IsValid() || !l.Prefix.Contains(l.Address):
			return fmt.Errorf("the lease of %s has no subnet prefix that holds it", l.Address)
		case !l.Gateway.IsValid():
			return fmt.Errorf("the lease of %s has no gateway", l.Address)
		}
	}
	return nil
}

// nodeName is the name the NIC goes back under when its recorded name is
// not known (an ADD cut short before its wiring was recorded): "vpn" and
// the MAC's hex digits, stable and unique per port.
func nodeName(mac string) string {
	h := sha256.Sum256([]byte(strings.ToLower(mac)))
	return "vpn" + hex.EncodeToString(h[:])[:11]
}

// findByMAC finds the link with mac in h's namespace.
func findByMAC(h *netlink.Handle, mac string) (netlink.Link, error) {
	links, err := nlutil.RetryDump(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if strings.EqualFold(l.Attrs().HardwareAddr.String(), mac) && l.Type() != "bridge" && l.Attrs().MasterIndex == 0 {
			return l, nil
		}
	}
	return nil, nil
}

// wiring is what Setup makes for a: the service veth's node end, the NIC
// as the pod's interface, the service veth's pod end, and last the NIC's
// name on the node (a node-side entry: DEL gives the NIC back under it).
func (m *Mode) wiring(a *alloc.Allocation, nodeIf string) alloc.Wiring {
	host, svc := svcpath.Interfaces(a)
	var ips []alloc.IPConfig
	var routes []alloc.Route
	for _, l := range a.Leases() {
		ips = append(ips, alloc.IPConfig{Interface: 1, Address: netip.PrefixFrom(l.Address, l.Prefix.Bits()), Gateway: l.Gateway})
		routes = append(routes, alloc.Route{Dst: family.Of(l.Address).Default(), GW: l.Gateway})
	}
	return alloc.Wiring{
		Interfaces: []alloc.Interface{host, {Name: a.IfName, MAC: strings.ToLower(a.NIC.MAC), Sandbox: a.Netns}, svc, {Name: nodeIf, MAC: strings.ToLower(a.NIC.MAC)}},
		IPs:        ips,
		Routes:     append(routes, m.svc.Routes(a)...),
	}
}

// nodeIfName is the NIC's name on the node as the wiring recorded it.
func nodeIfName(a *alloc.Allocation) string {
	if a.Wiring != nil && len(a.Wiring.Interfaces) == 4 && a.Wiring.Interfaces[3].Sandbox == "" {
		return a.Wiring.Interfaces[3].Name
	}
	return nodeName(a.NIC.MAC)
}

// Setup implements datapath.Datapath: the NIC moves into the pod as its
// interface. On failure the NIC goes back to the node as it was.
func (m *Mode) Setup(_ context.Context, a *alloc.Allocation) (_ alloc.Wiring, err error) {
	if err := checkLeases(a); err != nil {
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
	pod := opened.Handle
	node := &netlink.Handle{}

	nic, err := findByMAC(node, a.NIC.MAC)
	if err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "find NIC " + a.NIC.MAC, Err: err}
	}
	nodeIf := nodeIfName(a)
	if nic != nil && a.Wiring == nil {
		nodeIf = nic.Attrs().Name
	}
	// From here a failure gives the NIC back as it was, wherever the
	// failed step left it: in the pod (moved, not yet named), or on the
	// node (set down and marked before the move).
	defer func() {
		if err != nil {
			_ = m.giveBack(pod, a, nodeIf)
			_ = unmarkOnNode(a)
			_ = m.svc.Detach(a)
		}
	}()
	if nic == nil {
		// Moved into this pod already (an ADD cut short after the move)?
		if in, _ := findByMAC(pod, a.NIC.MAC); in == nil || in.Attrs().Alias != datapath.AliasPrefix+a.Key() {
			return alloc.Wiring{}, &datapath.SetupError{Step: "find NIC " + a.NIC.MAC,
				Err: fmt.Errorf("no interface with MAC %s on the node: the provider attached its port but the NIC has not appeared", a.NIC.MAC)}
		}
	} else {
		if l, err := pod.LinkByName(a.IfName); err == nil && !strings.EqualFold(l.Attrs().HardwareAddr.String(), a.NIC.MAC) {
			return alloc.Wiring{}, &datapath.SetupError{Step: "pod interface", BadRequest: true,
				Err: fmt.Errorf("%s already exists in %s", a.IfName, a.Netns)}
		}
		if err = m.moveIn(nic, opened, a); err != nil {
			return alloc.Wiring{}, err
		}
	}
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "find pod interface " + a.IfName, Err: err}
	}
	if err = nlutil.AddPodAddresses(pod, link, a); err != nil {
		return alloc.Wiring{}, err
	}
	if err = pod.LinkSetUp(link); err != nil {
		return alloc.Wiring{}, &datapath.SetupError{Step: "pod link up", Err: err}
	}
	for _, l := range a.Leases() {
		dst := family.Of(l.Address).Default()
		def := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: l.Gateway.AsSlice(), Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(0, l.Address.BitLen())}}
		if err = pod.RouteReplace(def); err != nil {
			return alloc.Wiring{}, &datapath.SetupError{Step: "pod default route via " + l.Gateway.String(), Err: err}
		}
	}
	if err = m.svc.Attach(opened.NS, pod, a); err != nil {
		return alloc.Wiring{}, err
	}
	// Best effort: a neighbour that misses it asks again once its entry
	// goes stale.
	_ = nlutil.AnnounceIn(a.Netns, a.IfName, a.Addresses())
	return m.wiring(a, nodeIf), nil
}

// moveIn marks the NIC as a's and moves it into the pod under a's
// interface name.
func (m *Mode) moveIn(nic netlink.Link, pod *nlutil.Pod, a *alloc.Allocation) error {
	if len(a.IfName) > 15 {
		return &datapath.SetupError{Step: "pod interface", BadRequest: true, Err: fmt.Errorf("interface name %q is longer than 15 bytes", a.IfName)}
	}
	if err := netlink.LinkSetDown(nic); err != nil {
		return &datapath.SetupError{Step: "set NIC " + nic.Attrs().Name + " down", Err: err}
	}
	if err := netlink.LinkSetAlias(nic, datapath.AliasPrefix+a.Key()); err != nil {
		return &datapath.SetupError{Step: "mark NIC " + nic.Attrs().Name, Err: err}
	}
	if err := netlink.LinkSetNsFd(nic, int(pod.NS)); err != nil {
		_ = netlink.LinkSetAlias(nic, "")
		return &datapath.SetupError{Step: "move NIC " + nic.Attrs().Name + " into the pod", Err: err}
	}
	in, err := findByMAC(pod.Handle, a.NIC.MAC)
	if err != nil || in == nil {
		return &datapath.SetupError{Step: "find NIC in the pod", Err: fmt.Errorf("moved, then not found: %v", err)}
	}
	if err := pod.LinkSetName(in, a.IfName); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return &datapath.SetupError{Step: "pod interface", BadRequest: true, Err: fmt.Errorf("%s already exists in %s", a.IfName, a.Netns)}
		}
		return &datapath.SetupError{Step: "name the NIC " + a.IfName + " in the pod", Err: err}
	}
	return nil
}

// giveBack returns a's NIC from the pod (if it is there) to the node: down,
// without addresses or mark, under its node name (nodeName(MAC) if that
// name is taken meanwhile).
func (m *Mode) giveBack(pod *netlink.Handle, a *alloc.Allocation, nodeIf string) error {
	nic, err := findByMAC(pod, a.NIC.MAC)
	if err != nil || nic == nil || nic.Attrs().Alias != datapath.AliasPrefix+a.Key() {
		return err // not there, or not ours to give back
	}
	node, err := netns.Get()
	if err != nil {
		return fmt.Errorf("the node's netns: %w", err)
	}
	defer node.Close()
	_ = pod.LinkSetDown(nic)
	if addrs, err := pod.AddrList(nic, netlink.FAMILY_ALL); err == nil {
		for _, ad := range addrs {
			_ = pod.AddrDel(nic, &ad)
		}
	}
	if err := pod.LinkSetAlias(nic, ""); err != nil {
		return fmt.Errorf("unmark NIC %s: %w", a.NIC.MAC, err)
	}
	for _, name := range []string{nodeIf, nodeName(a.NIC.MAC)} {
		if err := pod.LinkSetName(nic, name); err != nil {
			continue
		}
		if err := pod.LinkSetNsFd(nic, int(node)); err == nil {
			return nil
		} else if !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("move NIC %s back to the node: %w", a.NIC.MAC, err)
		}
	}
	return fmt.Errorf("move NIC %s back to the node: its names %s and %s are taken there", a.NIC.MAC, nodeIf, nodeName(a.NIC.MAC))
}

// Teardown implements datapath.Datapath: the NIC goes back to the node
// under its name, down and bare, and the service veth goes. Idempotent. A
// NIC whose pod namespace is gone is back on the node already, or gone
// with the namespace (a virtual one): either way nothing is left in a pod.
func (m *Mode) Teardown(_ context.Context, a *alloc.Allocation) error {
	var errs []error
	if a.NIC != nil && a.Netns != "" {
		switch opened, err := nlutil.OpenPod(a.Netns); {
		case err == nil:
			errs = append(errs, m.giveBack(opened.Handle, a, nodeIfName(a)))
			opened.Close()
		case !errors.Is(err, nlutil.ErrNetnsPath): // a namespace already gone took the pod's end with it
			errs = append(errs, err)
		}
	}
	if a.NIC != nil {
		errs = append(errs, unmarkOnNode(a))
	}
	errs = append(errs, m.svc.Detach(a))
	return errors.Join(errs...)
}

// unmarkOnNode clears a NIC of a's that came back to the node by itself (a
// physical NIC returns to the initial namespace when the pod's is
// destroyed): down, bare, unmarked.
func unmarkOnNode(a *alloc.Allocation) error {
	nic, err := findByMAC(&netlink.Handle{}, a.NIC.MAC)
	if err != nil || nic == nil || nic.Attrs().Alias != datapath.AliasPrefix+a.Key() {
		return err
	}
	_ = netlink.LinkSetDown(nic)
	if addrs, err := netlink.AddrList(nic, netlink.FAMILY_ALL); err == nil {
		for _, ad := range addrs {
			_ = netlink.AddrDel(nic, &ad)
		}
	}
	if err := netlink.LinkSetAlias(nic, ""); err != nil {
		return fmt.Errorf("unmark NIC %s: %w", a.NIC.MAC, err)
	}
	return nil
}

// Check implements datapath.Datapath.
func (m *Mode) Check(_ context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	if err := checkLeases(a); err != nil {
		return alloc.Wiring{}, err
	}
	return m.wiring(a, nodeIfName(a)), m.check(a)
}

// Trace implements datapath.Datapath: the pod as a whole, as Check sees
// it (one hop per problem).
func (m *Mode) Trace(ctx context.Context, a *alloc.Allocation) []datapath.Hop {
	_, err := m.Check(ctx, a)
	return datapath.HopsOf("passthrough NIC of "+a.Address.String(), err)
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
	case !strings.EqualFold(link.Attrs().HardwareAddr.String(), a.NIC.MAC):
		problems = append(problems, fmt.Errorf("pod interface %s has MAC %s, not its NIC's %s", a.IfName, link.Attrs().HardwareAddr, a.NIC.MAC))
	default:
		if link.Attrs().Flags&net.FlagUp == 0 {
			problems = append(problems, fmt.Errorf("pod interface %s is down", a.IfName))
		}
		for _, l := range a.Leases() {
			if !hasAddr(pod, link, netip.PrefixFrom(l.Address, l.Prefix.Bits())) {
				problems = append(problems, fmt.Errorf("pod interface %s lacks %s/%d", a.IfName, l.Address, l.Prefix.Bits()))
			}
		}
	}
	problems = append(problems, m.svc.Check(pod, a)...)
	return errors.Join(problems...)
}

func hasAddr(h *netlink.Handle, link netlink.Link, want netip.Prefix) bool {
	addrs, err := nlutil.RetryDump(func() ([]netlink.Addr, error) { return h.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return false
	}
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		if netip.PrefixFrom(ip.Unmap(), ones) == want {
			return true
		}
	}
	return false
}

// Reconcile implements datapath.Datapath: the service path's node side,
// and a NIC vpcni marked that is back on the node (its pod went without a
// DEL): a desired allocation's is reported Broken, to be wired into its
// pod again; any other is cleared for the provider to take back.
func (m *Mode) Reconcile(_ context.Context, want datapath.Desired) (datapath.Report, error) {
	rep, err := m.svc.Reconcile(want.Allocations, want.Leave)
	if err != nil {
		return rep, err
	}
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return rep, fmt.Errorf("list links: %w", err)
	}
	byKey, leave := map[string]*alloc.Allocation{}, map[string]bool{}
	for _, a := range want.Allocations {
		byKey[a.Key()] = a
	}
	for _, a := range want.Leave {
		leave[a.Key()] = true
	}
	for _, l := range links {
		key, ok := strings.CutPrefix(l.Attrs().Alias, datapath.AliasPrefix)
		if !ok || !isNICCandidate(l, key) || leave[key] {
			continue
		}
		if a, ok := byKey[key]; ok && a.NIC != nil && strings.EqualFold(a.NIC.MAC, l.Attrs().HardwareAddr.String()) {
			if !slices.Contains(rep.Broken, key) {
				rep.Broken = append(rep.Broken, key)
			}
			continue
		}
		_ = netlink.LinkSetDown(l)
		if err := netlink.LinkSetAlias(l, ""); err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("unmark NIC %s: %v", l.Attrs().Name, err))
			continue
		}
		rep.Removed = append(rep.Removed, fmt.Sprintf("NIC %s (%s) of %s back on the node: cleared", l.Attrs().Name, l.Attrs().HardwareAddr, key))
	}
	return rep, nil
}

// isNICCandidate says whether a link with a vpcni alias (key: the alias
// after the prefix) may be a passthrough NIC: it carries an attachment's
// key, and it is none of the node-side links other modes mark (the bridge
// mode's bridge and pod veths, the routed veths, the service veths).
func isNICCandidate(l netlink.Link, key string) bool {
	if !strings.Contains(key, "/") || l.Type() == "bridge" {
		return false
	}
	name := l.Attrs().Name
	return l.Type() != "veth" || !(strings.HasPrefix(name, "vpc") || strings.HasPrefix(name, "vpb") || strings.HasPrefix(name, svcpath.HostPrefix))
}

var _ datapath.Datapath = (*Mode)(nil)
