package integration

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// The node's second NIC in the testbed: a veth from the segment's bridge
// (port node1) into the node (eth1), down and without an address, as a
// hot-plugged NIC arrives.
const (
	nicMAC   = "02:aa:bb:00:00:11"
	nicAddr  = "10.78.0.11"
	nicAddr6 = "fd00:78::11"
)

// TestSecondaryNIC (seed 002): addresses of a range on a second NIC leave
// the node by that NIC and arrive by it. The segment enforces it the way a
// cloud's port security would: the uplink's port drops the NIC range's
// sources, the NIC's port drops anything else, and a counter on the NIC's
// port proves the pod's packets took it. A pod on the uplink and a pod on
// the NIC reach each other (rule 512), and both the neighbour; DEL leaves
// no rule of the pod or proxy entry; an agent restart puts back a rule
// removed by hand.
//
// The pods are dual-stack and every IPv6 address is on the NIC (the
// segment's port security holds for IPv6 too): the pod on the NIC has
// both its addresses there, the pod on the uplink its IPv4 address on the
// uplink and its IPv6 one on the NIC — each address is routed by its own
// lease's NIC. The IPv6 rules and table are asserted as the IPv4 ones.
func TestSecondaryNIC(t *testing.T) {
	e := &env{bedtest.NewDualStack(t, binDir, "vpcnit", "10.78.0.0/24", "10.78.0.0/26", "fd00:78::/64")}
	withoutSelfHeal()(&e.Cfg)
	e.Cfg.IPFamilies = []family.Family{family.V4, family.V6}
	e.Cfg.Provider.Settings = &static.Config{Ranges: []static.Range{
		// One address on the uplink, the rest of the pool on the NIC.
		{CIDR: "10.78.0.0/24", Gateway: "10.78.0.1", Exclude: []string{"10.78.0.0/26", "10.78.0.65/32", "10.78.0.66/31", "10.78.0.68/30", "10.78.0.72/29", "10.78.0.80/28", "10.78.0.96/27", "10.78.0.128/25"}},
		{CIDR: "10.78.0.0/24", Gateway: "10.78.0.1", Exclude: []string{"10.78.0.0/25"}, NIC: &static.NIC{MAC: nicMAC, Address: nicAddr}},
		// IPv6: all on the NIC, from fd00:78::100.
		{CIDR: "fd00:78::/112", Gateway: "fd00:78::1", Exclude: []string{"fd00:78::/120"}, NIC: &static.NIC{MAC: nicMAC, Address: nicAddr6}},
	}}
	e.StartAgent()
	seg, node := e.TB.SegNS(), e.TB.NodeNS()
	mac, _ := net.ParseMAC(nicMAC)
	if err := netnsutil.VethBetween(seg, "node1", node, "eth1", mac); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"ip", "link", "set", "node1", "master", "br0"}, {"ip", "link", "set", "node1", "up"}} {
		if err := netnsutil.Exec(seg, c...); err != nil {
			t.Fatal(err)
		}
	}
	portSecurity := `table bridge vpcni_portsec {
 chain portsec {
  type filter hook forward priority 0; policy accept;
  iifname "node0" ip saddr 10.78.0.128/25 drop
  iifname "node0" arp saddr ip 10.78.0.128/25 drop
  iifname "node1" ether saddr != ` + nicMAC + ` drop
  iifname "node1" ip saddr != { ` + nicAddr + `, 10.78.0.128/25 } drop
  iifname "node1" arp saddr ip != { ` + nicAddr + `, 10.78.0.128/25 } drop
  iifname "node1" ip saddr 10.78.0.128/25 counter
  iifname "node0" ip6 saddr fd00:78::100-fd00:78::ffff drop
  iifname "node1" ip6 saddr != { ::, fe80::/10, ` + nicAddr6 + `, fd00:78::100-fd00:78::ffff } drop
  iifname "node1" ip6 saddr fd00:78::100-fd00:78::ffff counter
 }
}
`
	cmd := exec.Command("ip", "netns", "exec", seg, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(portSecurity)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("segment port security: %v: %s", err, out)
	}

	c := e.cni("1.0.0")
	var onUplink, onNIC, onUplink6, onNIC6 netip.Addr
	var uplinkNS, nicNS, nicID string
	for i := range 3 {
		ns := e.Pod(i)
		id := fmt.Sprintf("nic-%d", i)
		ips := byFamily(t, e.Add(c, id, ns))
		if len(ips) != 2 || !ips[1].Is6() {
			t.Fatalf("ADD gave %v, want an IPv4 and an IPv6 address", ips)
		}
		if ips[0].As4()[3] >= 128 {
			onNIC, onNIC6, nicNS, nicID = ips[0], ips[1], ns, id
		} else {
			onUplink, onUplink6, uplinkNS = ips[0], ips[1], ns
		}
		if onNIC.IsValid() && onUplink.IsValid() {
			break
		}
	}
	if !onNIC.IsValid() || !onUplink.IsValid() {
		t.Fatalf("want one pod on the uplink and one on the NIC, got %v and %v", onUplink, onNIC)
	}
	nbr := netnsutil.Path(e.TB.NbrNS())
	for _, ip := range []netip.Addr{e.TB.NbrIP, e.TB.NbrIP6} {
		bedtest.Echo(t, nbr, ip)
	}
	for _, ip := range []netip.Addr{onNIC, onNIC6} {
		bedtest.Echo(t, nicNS, ip)
	}
	for _, ip := range []netip.Addr{onUplink, onUplink6} {
		bedtest.Echo(t, uplinkNS, ip)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range [][]string{{node, "ip", "rule"}, {node, "ip", "-6", "rule"}, {node, "ip", "route", "show", "table", "all"}, {node, "ip", "-6", "route", "show", "table", "all"},
				{node, "ip", "neigh", "show", "proxy"}, {node, "ip", "-6", "neigh", "show", "proxy"},
				{node, "ip", "addr"}, {node, "sysctl", "net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth1.rp_filter"}, {seg, "nft", "list", "ruleset"}, {e.TB.NbrNS(), "ip", "neigh"}} {
				out, err := netnsutil.Output(c[0], c[1:]...)
				t.Logf("%s: %v\n%s", strings.Join(c[1:], " "), err, out)
			}
		}
	})
	for _, p := range []struct {
		from string
		to   netip.Addr
	}{{nicNS, e.TB.NbrIP}, {nbr, onNIC}, {uplinkNS, e.TB.NbrIP}, {nicNS, onUplink}, {uplinkNS, onNIC},
		{nicNS, e.TB.NbrIP6}, {nbr, onNIC6}, {uplinkNS, e.TB.NbrIP6}, {nbr, onUplink6}, {nicNS, onUplink6}, {uplinkNS, onNIC6}} {
		if err := bedtest.Probe(p.from, testbed.HostPort(p.to, 7777)); err != nil {
			t.Errorf("%s cannot reach %s: %v", p.from, p.to, err)
		}
	}
	out, err := netnsutil.Output(seg, "nft", "list", "chain", "bridge", "vpcni_portsec", "portsec")
	if err != nil || !strings.Contains(out, "counter packets") || strings.Contains(out, "counter packets 0 ") {
		t.Fatalf("no packet of the NIC's pod passed the NIC's port: %v\n%s", err, out)
	}
	rules, _ := netnsutil.Output(node, "ip", "rule")
	rules6, _ := netnsutil.Output(node, "ip", "-6", "rule")
	for _, want := range []string{"512:\tfrom all lookup main suppress_prefixlength 31", "1536:\tfrom " + onNIC.String() + " lookup", "1536:\tfrom " + nicAddr + " lookup"} {
		if !strings.Contains(rules, want) {
			t.Errorf("node rules lack %q:\n%s", want, rules)
		}
	}
	for _, want := range []string{"512:\tfrom all lookup main suppress_prefixlength 127", "1536:\tfrom " + onNIC6.String() + " lookup", "1536:\tfrom " + onUplink6.String() + " lookup", "1536:\tfrom " + nicAddr6 + " lookup"} {
		if !strings.Contains(rules6, want) {
			t.Errorf("node IPv6 rules lack %q:\n%s", want, rules6)
		}
	}
	if strings.Contains(rules, "from "+onUplink.String()+" ") {
		t.Errorf("the IPv4 address on the uplink got a NIC rule:\n%s", rules)
	}
	table6, _ := netnsutil.Output(node, "ip", "-6", "route", "show", "table", "all")
	if !strings.Contains(table6, "default via fd00:78::1 dev eth1 table 28") || !strings.Contains(table6, "fd00:78::/112 dev eth1 table 28") {
		t.Errorf("no IPv6 table of the NIC:\n%s", table6)
	}
	if t.Failed() {
		t.FailNow()
	}

	// A rule removed by hand comes back with the agent's restart.
	if err := netnsutil.Exec(node, "ip", "rule", "del", "priority", "1536", "from", onNIC.String()); err != nil {
		t.Fatal(err)
	}
	if err := e.Agent.Stop(); err != nil {
		t.Fatal(err)
	}
	e.StartAgent()
	bedtest.WaitFor(t, 10*time.Second, "the NIC pod's rule back", func() bool {
		r, _ := netnsutil.Output(node, "ip", "rule")
		return strings.Contains(r, "1536:\tfrom "+onNIC.String()+" lookup")
	})
	bedtest.Reach(t, nbr, testbed.HostPort(onNIC, 7777))

	// The NIC flaps: the kernel flushes its table's routes, the rules stay.
	// CHECK sees it; the agent's restart puts the table back. The pool's
	// first fill after the restart (the probe of its uplink address takes
	// a moment) ends with a reconcile that repairs a flap made before it:
	// the pool is let fill first, and a flap that reconcile caught anyway
	// is made again (self-heal is off: nothing else repairs it).
	bedtest.WaitFor(t, 10*time.Second, "the pool filled", func() bool { return e.state().Pool.Free >= e.Cfg.Pool.WarmTarget })
	var checkErr error
	for range 3 {
		for _, c := range [][]string{{"ip", "link", "set", "eth1", "down"}, {"ip", "link", "set", "eth1", "up"}} {
			if err := netnsutil.Exec(node, c...); err != nil {
				t.Fatal(err)
			}
		}
		if checkErr = c.Check(bedtest.Ctx(t), testbed.Runtime(nicID, nicNS, "eth0", nil)); checkErr != nil {
			break
		}
	}
	if checkErr == nil || !strings.Contains(checkErr.Error(), "no default route") {
		t.Errorf("CHECK after the NIC flapped: %v, want the table's missing default route named", checkErr)
	}
	if err := e.Agent.Stop(); err != nil {
		t.Fatal(err)
	}
	e.StartAgent()
	bedtest.WaitFor(t, 10*time.Second, "the NIC's tables back", func() bool {
		r, _ := netnsutil.Output(node, "ip", "route", "show", "table", "all")
		r6, _ := netnsutil.Output(node, "ip", "-6", "route", "show", "table", "all")
		return strings.Contains(r, "default via 10.78.0.1 dev eth1") && strings.Contains(r6, "default via fd00:78::1 dev eth1 table 28")
	})
	bedtest.Reach(t, nbr, testbed.HostPort(onNIC, 7777))
	bedtest.Reach(t, nbr, testbed.HostPort(onNIC6, 7777))

	// DEL: the pod's rules and its proxy entry on the NIC go.
	if err := c.Del(bedtest.Ctx(t), testbed.Runtime(nicID, nicNS, "eth0", nil)); err != nil {
		t.Fatal(err)
	}
	if rules = bedtest.Sh(t, node, "ip", "rule") + bedtest.Sh(t, node, "ip", "-6", "rule"); strings.Contains(rules, onNIC.String()+" ") || strings.Contains(rules, onNIC6.String()+" ") {
		t.Errorf("rules of %s, %s left after DEL:\n%s", onNIC, onNIC6, rules)
	}
	h := e.node()
	eth1, err := h.LinkByName("eth1")
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		proxies, err := h.NeighProxyList(eth1.Attrs().Index, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range proxies {
			if n.IP.Equal(onNIC.AsSlice()) || n.IP.Equal(onNIC6.AsSlice()) {
				t.Errorf("proxy entry of %s left on eth1 after DEL", n.IP)
			}
		}
	}
}
