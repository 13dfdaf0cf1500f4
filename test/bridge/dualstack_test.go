package bridge

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestBridgeDualStack: mode bridge on a dual-stack segment. The node keeps
// its IPv6 address and default route when the uplink goes into the
// bridge; dual-stack pods reach each other, the node and a host on the
// segment in both families (the host reaches them too); DEL takes the
// pod's links; uninstall gives the uplink its IPv6 back.
func TestBridgeDualStack(t *testing.T) {
	e := &env{Env: bedtest.NewDualStack(t, binDir, "vpcb6", "10.79.0.0/24", "10.79.0.0/26", "fd00:79::/64")}
	tb := e.TB
	nodeNS := tb.NodeNS()
	// ip's warnings (a veth whose peer's namespace another test just
	// deleted: "Peer netns reference is invalid") are not the node's
	// state, so only its standard output is compared.
	v6State := func(dev string) string {
		return e.sh(nodeNS, "sh", "-c", "{ ip -6 addr show dev "+dev+" scope global | grep '^ *inet6'; ip -6 route show default; } 2>/dev/null")
	}
	before := v6State("eth0")
	if !strings.Contains(before, tb.NodeIP6.String()) || !strings.Contains(before, "default via "+tb.Gateway6.String()) {
		t.Fatalf("the testbed's node lacks its IPv6 address or default route:\n%s", before)
	}
	e.Cfg.MetricsAddr = ""
	e.Cfg.Datapath.Mode = "bridge"
	st := e.Cfg.Provider.Settings.(*static.Config)
	// Pods sit on the segment's /64 with its router, as bridge mode
	// needs; the gateway, node and neighbour are in the excluded /112.
	st.Ranges = append(st.Ranges, static.Range{CIDR: "fd00:79::/64", Gateway: tb.Gateway6.String(), Exclude: []string{"fd00:79::/112"}})
	e.Cfg.IPFamilies = []family.Family{family.V4, family.V6}
	e.StartAgent()

	moved := v6State("vpcbr0")
	if want := strings.ReplaceAll(before, "eth0", "vpcbr0"); moved != want {
		t.Fatalf("the bridge does not hold the node's IPv6:\n--- want\n%s--- got\n%s", want, moved)
	}
	if got := e.sh(nodeNS, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"); strings.Contains(got, "inet6") {
		t.Fatalf("eth0 kept a global IPv6 address:\n%s", got)
	}
	c := e.cni("1.1.0")
	p1, p2 := e.Pod(1), e.Pod(2)
	addrs := func(id, ns string) []netip.Addr {
		var out []netip.Addr
		for _, ip := range e.Add(c, id, ns).IPs {
			a, _ := netip.AddrFromSlice(ip.Address.IP)
			out = append(out, a.Unmap())
		}
		if len(out) != 2 || !out[0].Is4() || !out[1].Is6() {
			t.Fatalf("ADD gave %v, want an IPv4 then an IPv6 address", out)
		}
		return out
	}
	a1, a2 := addrs("c1", p1), addrs("c2", p2)
	node, nbr := netnsutil.Path(nodeNS), netnsutil.Path(tb.NbrNS())
	for i, f := range []family.Family{family.V4, family.V6} {
		nodeIP, nbrIP := tb.NodeIP, tb.NbrIP
		if f == family.V6 {
			nodeIP, nbrIP = tb.NodeIP6, tb.NbrIP6
		}
		bedtest.Echo(t, p2, a2[i])
		bedtest.Echo(t, node, nodeIP)
		bedtest.Echo(t, nbr, nbrIP)
		bedtest.Reach(t, p1, testbed.HostPort(a2[i], 7777))   // pod -> pod
		bedtest.Reach(t, p1, testbed.HostPort(nodeIP, 7777))  // pod -> node
		bedtest.Reach(t, p1, testbed.HostPort(nbrIP, 7777))   // pod -> a host on the segment
		bedtest.Reach(t, nbr, testbed.HostPort(a2[i], 7777))  // a host on the segment -> pod
		bedtest.Reach(t, node, testbed.HostPort(a2[i], 7777)) // node -> pod
		t.Logf("vpcni-test: bridge %s: pod %s <-> pod %s, node %s, neighbour %s", f, a1[i], a2[i], nodeIP, nbrIP)
	}
	// The pod's own sysctl: it hears the subnet's RAs but takes none.
	if ra := e.sh(filepath.Base(p1), "cat", "/proc/sys/net/ipv6/conf/eth0/accept_ra"); strings.TrimSpace(ra) != "0" {
		t.Errorf("pod accept_ra = %q, want 0", ra)
	}
	if err := c.Check(bedtest.Ctx(t), testbed.Runtime("c1", p1, "eth0", nil)); err != nil {
		t.Fatalf("CHECK of a dual-stack bridge pod: %v", err)
	}
	for _, id := range []struct{ id, ns string }{{"c1", p1}, {"c2", p2}} {
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime(id.id, id.ns, "eth0", nil)); err != nil {
			t.Fatalf("DEL %s: %v", id.id, err)
		}
	}
	e.waitNoPodLinks()
	if v6State("vpcbr0") != moved {
		t.Fatalf("DEL changed the node's IPv6:\n%s", v6State("vpcbr0"))
	}
	_ = e.Agent.Stop()
	cniDir := t.TempDir()
	if out := e.sh(nodeNS, filepath.Join(binDir, "vpcnictl"), "uninstall-cni", "--bin-dir", cniDir, "--conf-dir", cniDir, "--agent-config", e.Agent.ConfigPath); !strings.Contains(out, "node given back by datapath bridge") {
		t.Errorf("uninstall said: %s", out)
	}
	if after := v6State("eth0"); after != before {
		t.Fatalf("uninstall did not give eth0 its IPv6 back:\n--- before\n%s--- after\n%s", before, after)
	}
	// The node's echo server still listens: the address came back.
	bedtest.Reach(t, nbr, testbed.HostPort(tb.NodeIP6, 7777))
}

// TestBridgeIPv6Only: mode bridge with IPv6 pods alone. Two pods reach
// each other over the bridge; a pod reaches IPv6 Services (ip6tables
// DNAT, as kube-proxy writes it) whose backends are a pod on the node and
// a host on the segment, with the node-wide bridge-nf-call-ip6tables off:
// the bridge's own nf_call_ip6tables, which the agent turns on, is what
// makes it work, and turning it off breaks it.
func TestBridgeIPv6Only(t *testing.T) {
	e := &env{Env: bedtest.NewDualStack(t, binDir, "vpcb7", "10.79.0.0/24", "10.79.0.0/26", "fd00:79::/64")}
	tb := e.TB
	nodeNS := tb.NodeNS()
	e.sh(nodeNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-ip6tables=0")
	e.Cfg.MetricsAddr = ""
	e.Cfg.Datapath.Mode = "bridge"
	st := e.Cfg.Provider.Settings.(*static.Config)
	st.Ranges = []static.Range{{CIDR: "fd00:79::/64", Gateway: tb.Gateway6.String(), Exclude: []string{"fd00:79::/112"}}}
	e.Cfg.IPFamilies = []family.Family{family.V6}
	e.StartAgent()
	if br := e.sh(nodeNS, "ip", "-d", "link", "show", "vpcbr0"); !strings.Contains(br, "nf_call_ip6tables 1") {
		t.Fatalf("vpcbr0 should have nf_call_ip6tables 1: %s", br)
	}

	c := e.cni("1.1.0")
	p1, p2 := e.Pod(1), e.Pod(2)
	addIP := func(id, ns string) netip.Addr {
		r := e.Add(c, id, ns)
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
		if len(r.IPs) != 1 || !ip.Is6() || ip.Is4In6() {
			t.Fatalf("IPv6-only pod %s got %v", id, r.IPs)
		}
		return ip
	}
	ip1, ip2 := addIP("v6-1", p1), addIP("v6-2", p2)
	nbr := netnsutil.Path(tb.NbrNS())
	bedtest.Echo(t, p2, ip2)
	bedtest.Echo(t, nbr, tb.NbrIP6)
	reach(t, p1, testbed.HostPort(ip2, 7777))
	for _, rule := range [][]string{
		{"-d", "fd00:96::10/128", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "[" + ip2.String() + "]:7777"},       // a pod on this node
		{"-d", "fd00:96::11/128", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "[" + tb.NbrIP6.String() + "]:7777"}, // a host on the segment
	} {
		e.sh(nodeNS, append([]string{"ip6tables", "-t", "nat", "-A", "PREROUTING"}, rule...)...)
	}
	reach(t, p1, "[fd00:96::10]:80")
	reach(t, p1, "[fd00:96::11]:80")
	if out := e.sh(nodeNS, "ip6tables", "-t", "nat", "-L", "PREROUTING", "-v", "-n", "-x"); strings.Count(out, "DNAT") != 2 || strings.Contains(out, "    0     0 DNAT") {
		t.Errorf("the DNAT rules did not see the pod's traffic:\n%s", out)
	}
	t.Logf("vpcni-test: bridge IPv6-only: pod %s -> Services [fd00:96::10]:80 (pod %s), [fd00:96::11]:80 (host %s)", ip1, ip2, tb.NbrIP6)
	e.sh(nodeNS, "ip", "link", "set", "vpcbr0", "type", "bridge", "nf_call_ip6tables", "0")
	e.sh(nodeNS, "conntrack", "-F")
	if err := bedtest.Probe(p1, "[fd00:96::11]:80"); err == nil {
		t.Errorf("an IPv6 Service answered with nf_call_ip6tables off on the bridge: the test proves nothing")
	}
	if err := c.Check(bedtest.Ctx(t), testbed.Runtime("v6-1", p1, "eth0", nil)); err == nil || !strings.Contains(err.Error(), "nf_call_ip6tables off") {
		t.Errorf("CHECK with nf_call_ip6tables off: %v; want it named", err)
	}
	e.sh(nodeNS, "ip", "link", "set", "vpcbr0", "type", "bridge", "nf_call_ip6tables", "1")
	reach(t, p1, "[fd00:96::11]:80")
	for _, id := range []struct{ id, ns string }{{"v6-1", p1}, {"v6-2", p2}} {
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime(id.id, id.ns, "eth0", nil)); err != nil {
			t.Fatalf("DEL %s: %v", id.id, err)
		}
	}
	e.waitNoPodLinks()
}
