package macvlan

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// serviceCIDR6 is the IPv6 Service range of the dual-stack test.
const serviceCIDR6 = "fd00:96::/112"

// TestMacvlanDualStack: mode macvlan on a dual-stack segment. Pods get an
// address of each family on eth0 (IPv6 nodad, no router advertisements
// taken) with a default route per family via the segment's router; they
// reach each other, the router, the node and a host on the segment in
// both families; a neighbour that cached another MAC for the pod's IPv6
// address takes the pod's from its unsolicited advertisement; a pod
// reaches an IPv6 ClusterIP (an ip6tables DNAT, as kube-proxy writes)
// whose backend is a pod on the node or a host on the segment, through
// the service veth and its ip6 masquerade; the self-healing reconcile
// puts back the node's IPv6 route and neighbour; CHECK passes; DEL leaves
// nothing.
func TestMacvlanDualStack(t *testing.T) {
	t.Parallel()
	e := startV6(t, "vpcm6", family.V4, family.V6)
	tb := e.TB

	c := e.cni("1.1.0")
	nodeNS, nbrNS, segNS := netnsutil.Path(tb.NodeNS()), netnsutil.Path(tb.NbrNS()), netnsutil.Path(tb.SegNS())
	p1, p2 := e.Pod(1), e.Pod(2)
	// Pod 2 asks for its addresses, so the neighbour can hold a stale
	// entry for its IPv6 one at another MAC before the ADD.
	want2 := []netip.Addr{netip.MustParseAddr("10.79.0.70"), netip.MustParseAddr("fd00:79::1:70")}
	bedtest.Sh(t, tb.NbrNS(), "ip", "-6", "neigh", "replace", want2[1].String(), "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "stale")
	addrs := func(r *types100.Result) []netip.Addr {
		var out []netip.Addr
		for _, ip := range r.IPs {
			a, _ := netip.AddrFromSlice(ip.Address.IP)
			out = append(out, a.Unmap())
		}
		if len(out) != 2 || !out[0].Is4() || !out[1].Is6() {
			t.Fatalf("ADD gave %v, want an IPv4 then an IPv6 address", out)
		}
		return out
	}
	a1 := addrs(e.Add(c, "ds-1", p1))
	rt := testbed.Runtime("ds-2", p2, "eth0", nil)
	rt.Args = append(rt.Args, [2]string{"IP", want2[0].String() + "," + want2[1].String()})
	res, err := c.Add(bedtest.Ctx(t), rt)
	if err != nil {
		t.Fatalf("ADD ds-2: %v", err)
	}
	r2, err := types100.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if a2 := addrs(r2); a2[0] != want2[0] || a2[1] != want2[1] {
		t.Fatalf("ADD gave %v, asked for %v", a2, want2)
	}
	a2 := want2

	// The neighbour's entry took the pod's MAC from the advertisement.
	bedtest.WaitFor(t, 2e9, "the neighbour to learn pod 2's MAC for "+a2[1].String(), func() bool {
		out, _ := netnsutil.Output(tb.NbrNS(), "ip", "-6", "neigh", "show", a2[1].String(), "dev", "eth0")
		return strings.Contains(out, alloc.AddressMAC(a2[0]))
	})

	// The pod's kernel state, as ip shows it.
	ns1 := filepath.Base(p1)
	routes := bedtest.Sh(t, ns1, "ip", "-6", "route", "show")
	for _, w := range []string{
		"default via " + tb.Gateway6.String() + " dev eth0",
		"fd00:79::/64 dev eth0 proto kernel",
		serviceCIDR6 + " via fe80::1 dev " + svcpath.PodIfName + " src " + a1[1].String(),
		tb.NodeIP6.String() + " via fe80::1 dev " + svcpath.PodIfName + " src " + a1[1].String(),
	} {
		if !strings.Contains(routes, w) {
			t.Errorf("pod IPv6 routes lack %q:\n%s", w, routes)
		}
	}
	if out := bedtest.Sh(t, ns1, "ip", "-6", "addr", "show", "dev", "eth0"); !strings.Contains(out, a1[1].String()+"/64 scope global nodad") {
		t.Errorf("pod eth0 lacks %s/64 nodad:\n%s", a1[1], out)
	}
	if ra := bedtest.Sh(t, ns1, "cat", "/proc/sys/net/ipv6/conf/eth0/accept_ra"); strings.TrimSpace(ra) != "0" {
		t.Errorf("pod accept_ra = %q, want 0", ra)
	}
	if n := bedtest.Sh(t, ns1, "ip", "-6", "neigh", "show", "dev", svcpath.PodIfName); !strings.Contains(n, "fe80::1 lladdr") || !strings.Contains(n, "PERMANENT") {
		t.Errorf("pod has no permanent neighbour fe80::1: %s", n)
	}
	host1 := svcpath.HostIfName("ds-1", "eth0")
	if n := bedtest.Sh(t, tb.NodeNS(), "ip", "-6", "neigh", "show", a1[1].String(), "dev", host1); !strings.Contains(n, "PERMANENT") {
		t.Errorf("node has no permanent neighbour for %s on %s: %q", a1[1], host1, n)
	}
	if got := e.node(); len(got.Links) != 2 || len(got.Routes) != 4 {
		t.Fatalf("node holds %+v, want two service veths and a /32 and a /128 route each", got)
	}

	for i, f := range []family.Family{family.V4, family.V6} {
		nodeIP, nbrIP, gw := tb.NodeIP, tb.NbrIP, tb.Gateway
		if f == family.V6 {
			nodeIP, nbrIP, gw = tb.NodeIP6, tb.NbrIP6, tb.Gateway6
		}
		bedtest.Echo(t, p2, a2[i])
		bedtest.Echo(t, nodeNS, nodeIP)
		bedtest.Echo(t, nbrNS, nbrIP)
		bedtest.Echo(t, segNS, gw)
		bedtest.Reach(t, p1, testbed.HostPort(a2[i], 7777))     // pod -> pod (inside the parent)
		bedtest.Reach(t, p1, testbed.HostPort(gw, 7777))        // pod -> the segment's router
		bedtest.Reach(t, p1, testbed.HostPort(nodeIP, 7777))    // pod -> node (service veth)
		bedtest.Reach(t, nodeNS, testbed.HostPort(a2[i], 7777)) // node -> pod (service veth)
		bedtest.Reach(t, p1, testbed.HostPort(nbrIP, 7777))     // pod -> a host on the segment
		bedtest.Reach(t, nbrNS, testbed.HostPort(a2[i], 7777))  // a host on the segment -> pod
		t.Logf("vpcni-test: macvlan %s: pod %s <-> pod %s, router %s, node %s, neighbour %s", f, a1[i], a2[i], gw, nodeIP, nbrIP)
	}

	// IPv6 Services, as kube-proxy's ip6tables rules DNAT them on the node.
	for _, rule := range [][]string{
		{"ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", "fd00:96::10/128", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "[" + a2[1].String() + "]:7777"},
		{"ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", "fd00:96::11/128", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "[" + tb.NbrIP6.String() + "]:7777"},
	} {
		bedtest.Sh(t, tb.NodeNS(), rule...)
	}
	if rs := bedtest.Sh(t, tb.NodeNS(), "nft", "list", "table", "ip6", svcpath.NATTable); !strings.Contains(rs, `iifname "vsv*" ct status dnat masquerade`) {
		t.Fatalf("no IPv6 masquerade rule on the node:\n%s", rs)
	}
	bedtest.Reach(t, p1, "[fd00:96::10]:80") // backend: a pod on the node
	bedtest.Reach(t, p1, "[fd00:96::11]:80") // backend: a host on the segment
	t.Logf("vpcni-test: macvlan IPv6 Services: pod %s -> [fd00:96::10]:80 (pod) and [fd00:96::11]:80 (host)", a1[1])

	// Self-healing: pod 1's IPv6 route and neighbour on the node deleted
	// (the route's deletion wakes the reconcile, which repairs both).
	bedtest.Sh(t, tb.NodeNS(), "ip", "-6", "neigh", "del", a1[1].String(), "dev", host1)
	bedtest.Sh(t, tb.NodeNS(), "ip", "-6", "route", "del", a1[1].String()+"/128", "dev", host1)
	bedtest.WaitFor(t, 10e9, "pod 1's IPv6 route and neighbour back on the node", func() bool {
		r, _ := netnsutil.Output(tb.NodeNS(), "ip", "-6", "route", "show", a1[1].String()+"/128")
		n, _ := netnsutil.Output(tb.NodeNS(), "ip", "-6", "neigh", "show", a1[1].String(), "dev", host1)
		return strings.Contains(r, host1) && strings.Contains(n, "PERMANENT")
	})
	bedtest.Echo(t, p1, a1[1])
	bedtest.Reach(t, nodeNS, testbed.HostPort(a1[1], 7777))

	for _, p := range []struct{ id, ns string }{{"ds-1", p1}, {"ds-2", p2}} {
		if err := c.Check(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
			t.Fatalf("CHECK %s: %v", p.id, err)
		}
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
			t.Fatalf("DEL %s: %v", p.id, err)
		}
		if links := podLinks(t, p.ns); len(links) != 0 {
			t.Fatalf("DEL left links in %s: %v", p.id, links)
		}
	}
	if got := e.node(); !got.empty() {
		t.Fatalf("DEL left on the node: %+v", got)
	}
}

// TestMacvlanIPv6Only: an IPv6-only pod has nothing of IPv4 (no address,
// no 169.254.1.1) and reaches the router, its node (service veth), a host
// on the segment and an IPv6 Service; CHECK passes; DEL leaves nothing.
func TestMacvlanIPv6Only(t *testing.T) {
	t.Parallel()
	e := startV6(t, "vpcm7", family.V6)
	tb := e.TB

	c := e.cni("1.1.0")
	p := e.Pod(1)
	r := e.Add(c, "v6", p)
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
	if len(r.IPs) != 1 || !ip.Is6() || ip.Is4In6() {
		t.Fatalf("IPv6-only ADD gave %v", r.IPs)
	}
	ns := filepath.Base(p)
	if out := bedtest.Sh(t, ns, "ip", "-4", "addr", "show"); strings.Contains(out, "inet ") && !strings.Contains(out, "inet 127.") {
		t.Errorf("IPv6-only pod has IPv4 addresses:\n%s", out)
	}
	if out := bedtest.Sh(t, ns, "ip", "-4", "route", "show"); strings.TrimSpace(out) != "" {
		t.Errorf("IPv6-only pod has IPv4 routes:\n%s", out)
	}
	bedtest.Echo(t, netnsutil.Path(tb.SegNS()), tb.Gateway6)
	bedtest.Echo(t, netnsutil.Path(tb.NodeNS()), tb.NodeIP6)
	bedtest.Echo(t, netnsutil.Path(tb.NbrNS()), tb.NbrIP6)
	bedtest.Echo(t, p, ip)
	bedtest.Sh(t, tb.NodeNS(), "ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", "fd00:96::11/128", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "["+tb.NbrIP6.String()+"]:7777")
	for _, to := range []string{testbed.HostPort(tb.Gateway6, 7777), testbed.HostPort(tb.NodeIP6, 7777), testbed.HostPort(tb.NbrIP6, 7777), "[fd00:96::11]:80"} {
		bedtest.Reach(t, p, to)
	}
	bedtest.Reach(t, netnsutil.Path(tb.NodeNS()), testbed.HostPort(ip, 7777))
	bedtest.Reach(t, netnsutil.Path(tb.NbrNS()), testbed.HostPort(ip, 7777))
	rt := testbed.Runtime("v6", p, "eth0", nil)
	if err := c.Check(bedtest.Ctx(t), rt); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := c.Del(bedtest.Ctx(t), rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if got := e.node(); !got.empty() || len(podLinks(t, p)) != 0 {
		t.Fatalf("DEL left: node %+v, pod %v", got, podLinks(t, p))
	}
}

// startV6 brings up a dual-stack bed under prefix and its agent in mode
// macvlan with IPv4 and IPv6 Service CIDRs, serving fams: the bed's IPv4
// range (with IPv4) and an IPv6 range of fd00:79::/64 whose first /112
// (the gateway, node and neighbour) is excluded.
func startV6(t *testing.T, prefix string, fams ...family.Family) *env {
	e := &env{bedtest.NewDualStack(t, binDir, prefix, "10.79.0.0/24", "10.79.0.0/26", "fd00:79::/64")}
	e.Cfg.Datapath = config.Datapath{Mode: string(macvlan.MACVLAN),
		Settings: &macvlan.Settings{Settings: svcpath.Settings{ServiceCIDRs: []string{serviceCIDR, serviceCIDR6}}}}
	st := e.Cfg.Provider.Settings.(*static.Config)
	v6 := static.Range{CIDR: "fd00:79::/64", Gateway: e.TB.Gateway6.String(), Exclude: []string{"fd00:79::/112"}}
	if family.Has(fams, family.V4) {
		st.Ranges = append(st.Ranges, v6)
	} else {
		st.Ranges = []static.Range{v6}
	}
	e.Cfg.IPFamilies = fams
	e.StartAgent()
	return e
}
