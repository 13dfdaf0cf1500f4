package veth

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// nodeEnv names the test's namespaces for its half that runs inside the
// node namespace (TestInNodeIPv6).
const nodeEnv = "VPCNI_VETH_TEST_PREFIX"

// TestIPv6Pods wires dual-stack and IPv6-only pods with the real kernel,
// in namespaces of the test's own:
//
//	<p>-node  the node: uplink up0 10.77.0.10/24 fd00:77::10/64
//	<p>-nbr   a neighbour on the uplink's segment: 10.77.0.20 fd00:77::20
//	<p>-p1..5 pods
//
// and a secondary NIC: the node's nic1 (the port's MAC fa:16:3e:00:00:01)
// on a second segment to the neighbour's eth1, which is that subnet's
// gateway 10.78.0.1 fd00:78::1 and has a peer behind it, 10.79.0.1
// fd00:79::1, that the node's main table does not route: pod 5, dual-stack
// on the NIC, reaches it only by the NIC's table.
//
// The datapath runs in a child process started inside the node namespace
// (ip netns exec): the mode works in its caller's namespace from several
// goroutines (its reaper), as the agent does on a node.
func TestIPv6Pods(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("VPCNI_REQUIRE_ROOT") != "" {
			t.Fatal("VPCNI_REQUIRE_ROOT is set but the test does not run as root")
		}
		t.Skip("NOT RUN: needs root to create network namespaces (make test runs it as root)")
	}
	p := fmt.Sprintf("vpcv6%d", os.Getpid()%100000)
	names := []string{p + "-node", p + "-nbr", p + "-p1", p + "-p2", p + "-p3", p + "-p4", p + "-p5"}
	del := func() {
		for _, n := range names {
			if netnsutil.Exists(n) {
				_ = netnsutil.Delete(n)
			}
		}
	}
	del()
	t.Cleanup(del)
	for _, n := range names {
		if err := netnsutil.Add(n); err != nil {
			t.Fatal(err)
		}
		run(t, "ip", "-n", n, "link", "set", "lo", "up")
	}
	node, nbr := p+"-node", p+"-nbr"
	run(t, "ip", "-n", node, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", nbr)
	for _, c := range [][]string{
		{"-n", node, "addr", "add", "10.77.0.10/24", "dev", "up0"},
		{"-n", node, "addr", "add", "fd00:77::10/64", "dev", "up0", "nodad"},
		{"-n", node, "link", "set", "up0", "up"},
		{"-n", nbr, "addr", "add", "10.77.0.20/24", "dev", "eth0"},
		{"-n", nbr, "addr", "add", "fd00:77::20/64", "dev", "eth0", "nodad"},
		{"-n", nbr, "link", "set", "eth0", "up"},
		{"-n", node, "link", "add", "nic1", "address", "fa:16:3e:00:00:01", "type", "veth", "peer", "name", "eth1", "netns", nbr},
		{"-n", node, "link", "set", "nic1", "up"},
		{"-n", nbr, "addr", "add", "10.78.0.1/24", "dev", "eth1"},
		{"-n", nbr, "addr", "add", "fd00:78::1/64", "dev", "eth1", "nodad"},
		{"-n", nbr, "addr", "add", "10.79.0.1/32", "dev", "lo"},
		{"-n", nbr, "addr", "add", "fd00:79::1/128", "dev", "lo"},
		{"-n", nbr, "link", "set", "eth1", "up"},
	} {
		run(t, append([]string{"ip"}, c...)...)
	}
	// Until the kernel has seen the carrier come up (its link watch runs
	// apart, and may wait), a link's queue drops every packet: an
	// announcement sent then is lost. A node's uplink is up long before
	// its pods; so is this one.
	waitFor(t, 3*time.Second, "the uplink's carrier", func() bool {
		return operUp(t, node, "up0") && operUp(t, nbr, "eth0") && operUp(t, node, "nic1") && operUp(t, nbr, "eth1")
	})
	// The NIC took router advertisements: wiring IPv6 by it stops that.
	run(t, "ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv6.conf.nic1.accept_ra=2")
	// Pod 3's runtime turned IPv6 off in its namespace.
	run(t, "ip", "netns", "exec", p+"-p3", "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", node, os.Args[0], "-test.run", "^TestInNodeIPv6$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), nodeEnv+"="+p)
	out, err := cmd.CombinedOutput()
	t.Logf("in the node namespace:\n%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS: TestInNodeIPv6") {
		t.Fatalf("the node half failed: %v", err)
	}
}

// TestInNodeIPv6 is TestIPv6Pods' half inside the node namespace.
func TestInNodeIPv6(t *testing.T) {
	p := os.Getenv(nodeEnv)
	if p == "" {
		t.Skip("NOT RUN on its own: TestIPv6Pods runs it inside the network namespaces it builds")
	}
	pod := func(i int) string { return netnsutil.Path(fmt.Sprintf("%s-p%d", p, i)) }
	nbr := p + "-nbr"
	ip := netip.MustParseAddr
	ctx := t.Context()

	v, err := NewVeth("up0", 0, true, family.V4, family.V6)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	for key, want := range map[string]string{
		"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1", "net/ipv6/conf/up0/proxy_ndp": "1",
		"net/ipv6/neigh/up0/proxy_delay": "0", "net/ipv6/conf/up0/accept_ra": "2", "net/ipv6/conf/up0/disable_ipv6": "0",
	} {
		if got := sysctl(t, "", key); got != want {
			t.Errorf("node %s = %s, want %s", key, got, want)
		}
	}

	a := &alloc.Allocation{ContainerID: "a", IfName: "eth0", Netns: pod(1),
		Lease: alloc.Lease{Address: ip("10.77.0.101")}, Others: []alloc.Lease{{Address: ip("fd00:77::101")}}}
	b := &alloc.Allocation{ContainerID: "b", IfName: "eth0", Netns: pod(2),
		Lease: alloc.Lease{Address: ip("10.77.0.102")}, Others: []alloc.Lease{{Address: ip("fd00:77::102")}}}
	c := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Netns: pod(3), Lease: alloc.Lease{Address: ip("fd00:77::103")}}
	d := &alloc.Allocation{ContainerID: "d", IfName: "eth0", Netns: pod(4), Lease: alloc.Lease{Address: ip("fd00:77::104")}}

	// The neighbour knew pod d's address at another MAC (its last home):
	// the unsolicited advertisement at Setup moves it to the uplink's.
	run(t, "ip", "-n", nbr, "-6", "neigh", "replace", "fd00:77::104", "lladdr", "02:00:00:00:99:99", "dev", "eth0", "nud", "stale")

	wired := map[string]alloc.Wiring{}
	for _, x := range []*alloc.Allocation{a, b, c, d} {
		start := time.Now()
		w, err := v.Setup(ctx, x)
		if err != nil {
			t.Fatalf("Setup %s: %v", x.Key(), err)
		}
		t.Logf("Setup %s (%v): %v", x.Key(), x.Addresses(), time.Since(start))
		wired[x.ContainerID] = w
		if x == c {
			// The node's first packet to a new pod: its host veth's own
			// link-local address is still tentative, which would hold
			// the node's neighbour solicitation back for ~2 s; the
			// permanent neighbour entry needs none. (Once the kernel's
			// link watch has seen the carrier, which it does apart from
			// Setup: before, the host veth's queue drops what it is
			// given, and the pod's address has no local route yet — a
			// SYN then was counted in the pod's Ip6InAddrErrors.)
			setupDone := time.Now()
			waitFor(t, 3*time.Second, "pod c's carrier", func() bool {
				return operUp(t, "", HostIfName("c", "eth0")) && operUp(t, p+"-p3", "eth0") &&
					strings.Contains(run(t, "ip", "-n", p+"-p3", "-6", "route", "show", "table", "local", "fd00:77::103"), "fd00:77::103")
			})
			t.Logf("pod c's carrier and local route %v after Setup returned", time.Since(setupDone))
			start := time.Now()
			if err := probe("", "[fd00:77::103]:7777", 0); err != nil && !isRefused(err) {
				t.Errorf("node -> new pod c: %v", err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("node -> new pod c took %v, want well under the 2 s of a link-local DAD", took)
			} else {
				t.Logf("node -> pod c right after Setup: %v", took)
			}
		}
	}
	upMAC := v.uplinkMAC.String()
	waitFor(t, 3*time.Second, "the neighbour learns pod d's address at the uplink's MAC", func() bool {
		out := run(t, "ip", "-n", nbr, "-6", "neigh", "show", "fd00:77::104", "dev", "eth0")
		return strings.Contains(out, upMAC)
	})

	// The CNI result: one IPConfig per address, a default route per family.
	if got := fmt.Sprint(wired["a"].IPs, wired["a"].Routes); !strings.Contains(got, "10.77.0.101/32") || !strings.Contains(got, "fd00:77::101/128") ||
		len(wired["a"].IPs) != 2 || len(wired["a"].Routes) != 2 || wired["a"].Routes[1].Dst.String() != "::/0" || wired["a"].Routes[1].GW != Gateway6 {
		t.Errorf("dual-stack wiring %s", got)
	}
	if w := wired["c"]; len(w.IPs) != 1 || w.IPs[0].Address.String() != "fd00:77::103/128" || w.IPs[0].Gateway != Gateway6 ||
		len(w.Routes) != 1 || w.Routes[0].Dst.String() != "::/0" {
		t.Errorf("IPv6-only wiring %+v", w)
	}
	// The IPv6-only pod has nothing of IPv4; its interface takes IPv6
	// although the runtime had turned it off, and takes no RAs, no DAD.
	if out := run(t, "ip", "-n", p+"-p3", "-4", "route", "show"); strings.TrimSpace(out) != "" {
		t.Errorf("IPv6-only pod has IPv4 routes: %s", out)
	}
	if out := run(t, "ip", "-n", p+"-p3", "-4", "neigh", "show"); strings.Contains(out, "169.254.1.1") {
		t.Errorf("IPv6-only pod has the IPv4 gateway: %s", out)
	}
	for key, want := range map[string]string{"disable_ipv6": "0", "accept_ra": "0", "accept_dad": "0"} {
		if got := sysctl(t, p+"-p3", "net/ipv6/conf/eth0/"+key); got != want {
			t.Errorf("pod c eth0 %s = %s, want %s", key, got, want)
		}
	}
	if out := run(t, "ip", "-n", p+"-p1", "-6", "route", "show", "default"); !strings.Contains(out, "via fe80::1 dev eth0") {
		t.Errorf("pod a's IPv6 default route: %q", out)
	}

	// Every pod serves; the node serves too (this process is in its
	// namespace).
	for i := 1; i <= 4; i++ {
		l := listen(t, pod(i), "[::]:7777")
		defer l.Close()
	}
	nl, err := net.Listen("tcp", "[::]:7778")
	if err != nil {
		t.Fatal(err)
	}
	go serve(nl)
	defer nl.Close()
	for _, c := range []struct{ from, to string }{
		{pod(1), "10.77.0.102:7777"}, {pod(1), "[fd00:77::102]:7777"}, // pod to pod, both families
		{pod(3), "[fd00:77::101]:7777"},                             // IPv6-only pod to dual-stack pod
		{pod(1), "10.77.0.10:7778"}, {pod(1), "[fd00:77::10]:7778"}, // pod to node
		{pod(3), "[fd00:77::10]:7778"},
		{"", "[fd00:77::101]:7777"}, {"", "10.77.0.101:7777"}, // node to pod
		{netnsutil.Path(nbr), "10.77.0.101:7777"}, {netnsutil.Path(nbr), "[fd00:77::101]:7777"}, // the segment, by proxy ARP/NDP
		{netnsutil.Path(nbr), "[fd00:77::103]:7777"},
	} {
		if err := probe(c.from, c.to, 3*time.Second); err != nil {
			t.Errorf("%s -> %s: %v", nameOf(c.from), c.to, err)
		}
	}

	// Check and Trace see the IPv6 pieces.
	for _, x := range []*alloc.Allocation{a, b, c, d} {
		if _, err := v.Check(ctx, x); err != nil {
			t.Errorf("Check %s: %v", x.Key(), err)
		}
	}
	hops := v.Trace(ctx, a)
	for _, want := range []string{"route fd00:77::101/128 dev", "route 10.77.0.101/32 dev", "proxy NDP entry fd00:77::101 on up0",
		"proxy ARP entry 10.77.0.101 on up0", "neighbour fd00:77::101 -> ", "address fd00:77::101/128 on eth0",
		"default route via fe80::1 dev eth0", "neighbour fe80::1 -> "} {
		if !slices.ContainsFunc(hops, func(h datapath.Hop) bool { return strings.Contains(h.What, want) && h.State == datapath.HopOK }) {
			t.Errorf("trace of a has no ok hop %q: %+v", want, hops)
		}
	}

	// Damage pod a's IPv6 pieces on the node: Check names them, Reconcile
	// puts them back, and the segment reaches the pod again.
	hostIdx := linkIndex(t, HostIfName("a", "eth0"))
	if err := netlink.RouteDel(v.hostRoute(hostIdx, ip("fd00:77::101"))); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighDel(v.proxyEntry(ip("fd00:77::101"))); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighDel(podNeighbour(hostIdx, ip("fd00:77::101"), macFor(a.Key(), "pod"))); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Check(ctx, a); err == nil || !strings.Contains(err.Error(), "fd00:77::101/128") || !strings.Contains(err.Error(), "proxy NDP entry") {
		t.Errorf("Check of damaged a: %v", err)
	}
	// Stale pieces: a vpcni /128 no pod has, an idle address's proxy entry.
	run(t, "ip", "-6", "route", "add", "fd00:77::199/128", "dev", "up0", "proto", "167")
	run(t, "ip", "-6", "neigh", "add", "proxy", "fd00:77::198", "dev", "up0")
	rep, err := v.Reconcile(ctx, datapath.Desired{Allocations: []*alloc.Allocation{a, b, c, d}, Idle: []netip.Addr{ip("fd00:77::198")}})
	if err != nil || len(rep.Failed) > 0 || len(rep.Broken) > 0 {
		t.Fatalf("Reconcile: %+v %v", rep, err)
	}
	got := fmt.Sprint(rep.Repaired, rep.Removed)
	for _, want := range []string{"route fd00:77::101/128", "proxy NDP entry fd00:77::101", "neighbour fd00:77::101", "stale route fd00:77::199/128", "proxy NDP entry of idle address fd00:77::198"} {
		if !strings.Contains(got, want) {
			t.Errorf("Reconcile report %s lacks %q", got, want)
		}
	}
	if len(rep.Repaired) != 3 {
		t.Errorf("Reconcile repaired %d pieces, want the 3 deleted: %+v", len(rep.Repaired), rep.Repaired)
	}
	if _, err := v.Check(ctx, a); err != nil {
		t.Errorf("Check after Reconcile: %v", err)
	}
	run(t, "ip", "-n", nbr, "-6", "neigh", "flush", "dev", "eth0")
	if err := probe(netnsutil.Path(nbr), "[fd00:77::101]:7777", 3*time.Second); err != nil {
		t.Errorf("neighbour -> a after Reconcile: %v", err)
	}
	if rep, err := v.Reconcile(ctx, datapath.Desired{Allocations: []*alloc.Allocation{a, b, c, d}}); err != nil || len(rep.Repaired)+len(rep.Removed)+len(rep.Failed) > 0 {
		t.Errorf("a second Reconcile found work: %+v %v", rep, err)
	}

	// Teardown takes both families' routes and proxy entries at once.
	if err := v.Teardown(ctx, a); err != nil {
		t.Fatal(err)
	}
	for _, x := range []netip.Addr{ip("10.77.0.101"), ip("fd00:77::101")} {
		if v.hasProxyEntry(x) {
			t.Errorf("proxy entry of %s left after Teardown", x)
		}
		if routes, err := netlink.RouteListFiltered(nlFamily(x), &netlink.Route{Dst: ipNet(family.Host(x))}, netlink.RT_FILTER_DST); err != nil || len(routes) > 0 {
			t.Errorf("route to %s left after Teardown: %v %v", x, routes, err)
		}
	}

	// What the mode refuses, before making anything.
	v4only, err := NewVeth("up0", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer v4only.Close()
	if _, err := v4only.Setup(ctx, &alloc.Allocation{ContainerID: "x", IfName: "eth0", Netns: pod(1), Lease: alloc.Lease{Address: ip("fd00:77::106")}}); err == nil || !strings.Contains(err.Error(), "not prepared for ipv6") {
		t.Errorf("IPv6 on an IPv4 node: %v", err)
	}
	if _, err := netlink.LinkByName(HostIfName("x", "eth0")); err == nil {
		t.Error("a refused Setup made a host veth")
	}

	dualStackOnNIC(t, v, p, []*alloc.Allocation{b, c, d})
}

// dualStackOnNIC: a dual-stack pod whose two addresses live on the
// secondary NIC nic1 (TestIPv6Pods' fixture) reaches the peer behind the
// NIC's gateway by both families — the node's main table has no route
// there, so only the NIC's table (one number, both families) gets it
// there — and is reached from the NIC's segment by proxy ARP and proxy
// NDP on the NIC. The rules and tables are as nic.go says; Trace shows
// the IPv6 pieces, Reconcile puts them back, Teardown takes the pod's.
// The node's other pods are others.
func dualStackOnNIC(t *testing.T, v *Veth, p string, others []*alloc.Allocation) {
	ip, pfx := netip.MustParseAddr, netip.MustParsePrefix
	ctx, nbr := t.Context(), netnsutil.Path(p+"-nbr")
	const mac = "fa:16:3e:00:00:01"
	e := &alloc.Allocation{ContainerID: "e", IfName: "eth0", Netns: netnsutil.Path(p + "-p5"),
		Lease:  alloc.Lease{Address: ip("10.78.0.105"), Prefix: pfx("10.78.0.0/24"), Gateway: ip("10.78.0.1"), NIC: &alloc.NIC{MAC: mac, Address: ip("10.78.0.5")}},
		Others: []alloc.Lease{{Address: ip("fd00:78::105"), Prefix: pfx("fd00:78::/64"), Gateway: ip("fd00:78::1"), NIC: &alloc.NIC{MAC: mac, Address: ip("fd00:78::5")}}}}
	start := time.Now()
	if _, err := v.Setup(ctx, e); err != nil {
		t.Fatalf("Setup of a dual-stack pod on a NIC: %v", err)
	}
	t.Logf("Setup e on nic1: %v", time.Since(start))
	table := fmt.Sprint(nicTableBase + linkIndex(t, "nic1"))
	for _, c := range []struct {
		argv []string
		want []string
	}{
		{[]string{"ip", "-4", "rule"}, []string{"512:\tfrom all lookup main suppress_prefixlength 31 proto 167", "1536:\tfrom 10.78.0.105 lookup " + table, "1536:\tfrom 10.78.0.5 lookup " + table}},
		{[]string{"ip", "-6", "rule"}, []string{"512:\tfrom all lookup main suppress_prefixlength 127 proto 167", "1536:\tfrom fd00:78::105 lookup " + table, "1536:\tfrom fd00:78::5 lookup " + table}},
		{[]string{"ip", "-4", "route", "show", "table", table}, []string{"default via 10.78.0.1 dev nic1", "10.78.0.0/24 dev nic1 proto 167 scope link src 10.78.0.5"}},
		{[]string{"ip", "-6", "route", "show", "table", table}, []string{"default via fd00:78::1 dev nic1", "fd00:78::/64 dev nic1 proto 167 src fd00:78::5"}},
		{[]string{"ip", "-6", "neigh", "show", "proxy"}, []string{"fd00:78::105 dev nic1 proxy"}},
		{[]string{"ip", "-4", "neigh", "show", "proxy"}, []string{"10.78.0.105 dev nic1 proxy"}},
		{[]string{"ip", "addr", "show", "dev", "nic1"}, []string{"inet 10.78.0.5/24", "inet6 fd00:78::5/64 scope global nodad noprefixroute"}},
	} {
		out := run(t, c.argv...)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s lacks %q:\n%s", strings.Join(c.argv, " "), w, out)
			}
		}
	}
	if out := run(t, "ip", "-6", "route", "show", "default"); strings.Contains(out, "nic1") {
		t.Errorf("main table has an IPv6 default route by the NIC: %s", out)
	}
	for key, want := range map[string]string{"net/ipv6/conf/nic1/proxy_ndp": "1", "net/ipv6/conf/nic1/accept_ra": "0", "net/ipv6/neigh/nic1/proxy_delay": "0"} {
		if got := sysctl(t, "", key); got != want {
			t.Errorf("node %s = %s, want %s", key, got, want)
		}
	}
	peer := listen(t, nbr, "[::]:7779")
	defer peer.Close()
	pe := listen(t, e.Netns, "[::]:7777")
	defer pe.Close()
	reach := func(when string) {
		for _, c := range []struct{ from, to string }{
			{e.Netns, "10.79.0.1:7779"}, {e.Netns, "[fd00:79::1]:7779"}, // by the NIC's table
			{nbr, "10.78.0.105:7777"}, {nbr, "[fd00:78::105]:7777"}, // by proxy ARP/NDP on the NIC
			{e.Netns, "[fd00:77::102]:7777"}, {e.Netns, "10.77.0.102:7777"}, // a local pod, by rule 512
		} {
			if err := probe(c.from, c.to, 3*time.Second); err != nil {
				t.Errorf("%s: %s -> %s: %v", when, nameOf(c.from), c.to, err)
			}
		}
	}
	reach("after Setup")
	if _, err := v.Check(ctx, e); err != nil {
		t.Errorf("Check e: %v", err)
	}
	hops := v.Trace(ctx, e)
	for _, want := range []string{"rule 512: lookup main suppress_prefixlength 127", "rule 1536: from fd00:78::105 lookup " + table,
		"table " + table + " ipv6 default route (NIC nic1)", "proxy NDP entry fd00:78::105 on NIC nic1",
		"rule 1536: from 10.78.0.105 lookup " + table, "proxy ARP entry 10.78.0.105 on NIC nic1"} {
		if !slices.ContainsFunc(hops, func(h datapath.Hop) bool { return strings.Contains(h.What, want) && h.State == datapath.HopOK }) {
			t.Errorf("trace of e has no ok hop %q: %+v", want, hops)
		}
	}

	// The IPv6 side damaged (a NIC that went down and up loses its
	// table's routes; rules and proxy entries deleted): Reconcile puts it
	// back and the pod is reached again.
	run(t, "ip", "-6", "route", "flush", "table", table)
	run(t, "ip", "-6", "rule", "del", "pref", "1536", "from", "fd00:78::105")
	run(t, "ip", "-6", "rule", "del", "pref", "512")
	run(t, "ip", "-6", "neigh", "del", "proxy", "fd00:78::105", "dev", "nic1")
	for _, h := range v.Trace(ctx, e) {
		if (strings.Contains(h.What, "1536: from fd00:78::105") || strings.Contains(h.What, "proxy NDP entry fd00:78::105") ||
			strings.Contains(h.What, "ipv6 default route") || strings.Contains(h.What, "suppress_prefixlength 127")) && h.State == datapath.HopOK {
			t.Errorf("trace after the damage: %+v", h)
		}
	}
	all := append(others, e)
	rep, err := v.Reconcile(ctx, datapath.Desired{Allocations: all})
	if err != nil || len(rep.Failed) > 0 {
		t.Fatalf("Reconcile: %+v %v", rep, err)
	}
	got := fmt.Sprint(rep.Repaired)
	for _, want := range []string{"table " + table + " (ipv6)", "ipv6 rule 512 to local pods", "rule 1536 from fd00:78::105", "proxy NDP entry fd00:78::105 on NIC nic1"} {
		if !strings.Contains(got, want) {
			t.Errorf("Reconcile report %s lacks %q", got, want)
		}
	}
	if strings.Contains(got, "10.78.0.105") {
		t.Errorf("Reconcile repaired the intact IPv4 side: %s", got)
	}
	run(t, "ip", "-n", p+"-nbr", "-6", "neigh", "flush", "dev", "eth1")
	reach("after Reconcile")
	if rep, err := v.Reconcile(ctx, datapath.Desired{Allocations: all}); err != nil || len(rep.Repaired)+len(rep.Failed) > 0 {
		t.Errorf("a second Reconcile found work: %+v %v", rep, err)
	}

	// Teardown takes the pod's rules and proxy entries of both families;
	// the NIC's table and own rules stay for its next pod.
	if err := v.Teardown(ctx, e); err != nil {
		t.Fatal(err)
	}
	rules := run(t, "ip", "-4", "rule") + run(t, "ip", "-6", "rule")
	proxies := run(t, "ip", "-4", "neigh", "show", "proxy") + run(t, "ip", "-6", "neigh", "show", "proxy")
	for _, x := range []string{"10.78.0.105", "fd00:78::105"} {
		if strings.Contains(rules, x+" ") || strings.Contains(proxies, x+" ") {
			t.Errorf("%s left after Teardown:\n%s%s", x, rules, proxies)
		}
	}
	if out := run(t, "ip", "-6", "route", "show", "table", table); !strings.Contains(out, "default via fd00:78::1") {
		t.Errorf("the NIC's IPv6 table went with its last pod: %q", out)
	}

	// A pod's leases are routed one at a time: its IPv4 address on the
	// NIC and its IPv6 one on the uplink's port each leave by their own.
	f := &alloc.Allocation{ContainerID: "f", IfName: "eth0", Netns: e.Netns, Lease: e.Lease, Others: []alloc.Lease{{Address: ip("fd00:77::106")}}}
	if _, err := v.Setup(ctx, f); err != nil {
		t.Fatalf("Setup of a pod with its IPv4 address on a NIC, its IPv6 one on the uplink: %v", err)
	}
	for _, to := range []string{"10.79.0.1:7779", "[fd00:77::20]:7780"} {
		if to == "[fd00:77::20]:7780" {
			l := listen(t, nbr, to)
			defer l.Close()
		}
		if err := probe(f.Netns, to, 3*time.Second); err != nil {
			t.Errorf("pod f -> %s: %v", to, err)
		}
	}
	if rules := run(t, "ip", "-6", "rule"); strings.Contains(rules, "fd00:77::106") {
		t.Errorf("an IPv6 address on the uplink got a NIC rule:\n%s", rules)
	}
	if err := v.Teardown(ctx, f); err != nil {
		t.Fatal(err)
	}
}

func nameOf(path string) string {
	if path == "" {
		return "node"
	}
	return path
}

// run runs a command and returns its output; a failure fails the test.
func run(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// sysctl reads /proc/sys/<key> in the named namespace ("" = this one).
func sysctl(t *testing.T, ns, key string) string {
	t.Helper()
	if ns == "" {
		b, err := os.ReadFile("/proc/sys/" + key)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	return strings.TrimSpace(run(t, "ip", "netns", "exec", ns, "cat", "/proc/sys/"+key))
}

// operUp says whether a link's operational state is up (ns "" = this
// namespace).
func operUp(t *testing.T, ns, name string) bool {
	t.Helper()
	argv := []string{"ip", "-o", "link", "show", "dev", name}
	if ns != "" {
		argv = append([]string{"ip", "-n", ns}, argv[1:]...)
	}
	return strings.Contains(run(t, argv...), "state UP")
}

func linkIndex(t *testing.T, name string) int {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// listen opens an echo server on addr (both families on "[::]") in the
// namespace at path.
func listen(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	err := netnsutil.Do(path, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
	go serve(l)
	return l
}

func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.Copy(c, c)
		}()
	}
}

// probe connects from the namespace at path ("" = this one) to addr and
// has a line echoed; d = 0 only connects once, for a quick answer (a
// refusal counts: the packet got there and back).
func probe(path, addr string, d time.Duration) error {
	dial := func() (net.Conn, error) {
		var c net.Conn
		var err error
		f := func() error {
			c, err = net.DialTimeout("tcp", addr, 3*time.Second)
			return nil
		}
		if path == "" {
			_ = f()
		} else if derr := netnsutil.Do(path, f); derr != nil {
			return nil, derr
		}
		return c, err
	}
	c, err := dial()
	for end := time.Now().Add(d); err != nil && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		c, err = dial()
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "vpcni\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "vpcni\n" {
		return fmt.Errorf("echo %q: %v", line, err)
	}
	return nil
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
