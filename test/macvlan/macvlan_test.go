package macvlan

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestMacvlanLifecycle: for every CNI version, two pods on the node get
// macvlan eth0s on the subnet and service veths; the result, the kernel
// state and the traffic are as designed; CHECK passes; DEL (or GC) leaves
// nothing on the node or in the pods.
func TestMacvlanLifecycle(t *testing.T) {
	t.Run("0.3.1", func(t *testing.T) {
		// vpcni speaks CNI 0.4.0 and later (CHECK, prevResult): a 0.3.1
		// config is refused up front with error 1, and nothing is made.
		t.Parallel()
		e := newEnv(t, macvlan.MACVLAN)
		p := e.Pod(1)
		_, err := e.cni("0.3.1").Add(bedtest.Ctx(t), testbed.Runtime("old", p, "eth0", nil))
		if !bedtest.IsCode(err, 1) || !strings.Contains(err.Error(), "incompatible CNI versions") {
			t.Fatalf("ADD with 0.3.1: %v; want CNI error 1", err)
		}
		if links := podLinks(t, p); len(links) != 0 || !e.node().empty() {
			t.Fatalf("a refused ADD left links: pod %v, node %+v", links, e.node())
		}
	})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			lifecycle(t, macvlan.MACVLAN, v)
		})
	}
}

func lifecycle(t *testing.T, kind macvlan.Kind, version string) {
	e := newEnv(t, kind)
	c := e.cni(version)
	p1, p2 := e.Pod(1), e.Pod(2)
	r1, r2 := e.Add(c, "l2-1", p1), e.Add(c, "l2-2", p2)
	ip1, ip2 := bedtest.ResultIP(t, r1), bedtest.ResultIP(t, r2)
	checkResult(t, kind, r1, ip1, e.TB.Gateway)
	checkPod(t, kind, p1, ip1, e.TB)
	if got := e.node(); len(got.Links) != 2 || len(got.Routes) != 2 {
		t.Fatalf("node holds %+v, want two service veths and two /32 routes", got)
	}
	for _, p := range []struct{ id, ns string }{{"l2-1", p1}, {"l2-2", p2}} {
		if err := c.Check(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
			t.Fatalf("CHECK %s: %v", p.id, err)
		}
	}

	nodeNS, nbrNS := netnsutil.Path(e.TB.NodeNS()), netnsutil.Path(e.TB.NbrNS())
	bedtest.Echo(t, p1, ip1)
	bedtest.Echo(t, p2, ip2)
	bedtest.Echo(t, nodeNS, e.TB.NodeIP)
	bedtest.Echo(t, nbrNS, e.TB.NbrIP)
	bedtest.Reach(t, p1, testbed.HostPort(ip2, 7777))         // pod -> pod, same node (inside the parent)
	bedtest.Reach(t, p2, testbed.HostPort(ip1, 7777))         // and back
	bedtest.Reach(t, p1, testbed.HostPort(e.TB.NodeIP, 7777)) // pod -> node (service veth)
	bedtest.Reach(t, nodeNS, testbed.HostPort(ip1, 7777))     // node -> pod (service veth)
	bedtest.Reach(t, p1, testbed.HostPort(e.TB.NbrIP, 7777))  // pod -> neighbour host (L2)
	bedtest.Reach(t, nbrNS, testbed.HostPort(ip1, 7777))      // neighbour -> pod (L2)

	// Without the service veth's route to the node, pod -> node takes the
	// macvlan, which its parent does not talk to: it fails. The route put
	// back, it works again.
	svcRoute := []string{e.TB.NodeIP.String() + "/32", "via", "169.254.1.1", "dev", "vpcni-svc", "src", ip1.String()}
	if err := netnsutil.Exec(filepath.Base(p1), append([]string{"ip", "route", "del"}, svcRoute...)...); err != nil {
		t.Fatal(err)
	}
	if err := bedtest.Probe(p1, testbed.HostPort(e.TB.NodeIP, 7777)); err == nil {
		t.Errorf("pod -> node worked without the service veth's route: the test would not show why the service veth is there")
	}
	if err := netnsutil.Exec(filepath.Base(p1), append([]string{"ip", "route", "add"}, svcRoute...)...); err != nil {
		t.Fatal(err)
	}
	bedtest.Reach(t, p1, testbed.HostPort(e.TB.NodeIP, 7777))

	if version == "1.1.0" {
		// GC with only pod 1 valid frees pod 2, from a runtime that has
		// no cache of it (only vpcni's GC can).
		fresh, err := e.TB.NewCNI([]string{binDir}, t.TempDir(), testbed.VpcniConfList(version, "vpcni-test", e.Cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.GC(bedtest.Ctx(t), []types.GCAttachment{{ContainerID: "l2-1", IfName: "eth0"}}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if links := podLinks(t, p2); len(links) != 0 {
			t.Fatalf("GC left links in pod 2: %v", links)
		}
		if got := e.node(); len(got.Links) != 1 {
			t.Fatalf("after GC the node holds %+v, want pod 1's service veth alone", got)
		}
		bedtest.Reach(t, p1, testbed.HostPort(e.TB.NodeIP, 7777))
	}
	for _, p := range []struct{ id, ns string }{{"l2-1", p1}, {"l2-2", p2}} {
		for range 2 { // DEL is idempotent
			if err := c.Del(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
				t.Fatalf("DEL %s: %v", p.id, err)
			}
		}
	}
	if got := e.node(); !got.empty() {
		t.Fatalf("DEL left on the node: %+v", got)
	}
	for _, p := range []string{p1, p2} {
		if links := podLinks(t, p); len(links) != 0 {
			t.Fatalf("DEL left links in %s: %v", p, links)
		}
	}
	if st, err := e.Agent.State(); err != nil || len(st.Allocations) != 0 {
		t.Fatalf("allocations left: %+v %v", st, err)
	}
}

// checkResult: node end of the service veth, eth0 with the subnet's
// prefix and gateway, the pod's end of the service veth; the default
// route via the real gateway and the service routes via 169.254.1.1.
func checkResult(t *testing.T, kind macvlan.Kind, r *types100.Result, ip, gw netip.Addr) {
	t.Helper()
	if len(r.Interfaces) != 3 || r.Interfaces[0].Sandbox != "" || r.Interfaces[1].Name != "eth0" || r.Interfaces[2].Name != svcpath.PodIfName {
		t.Fatalf("result interfaces: %+v", r.Interfaces)
	}
	if kind == macvlan.MACVLAN && r.Interfaces[1].Mac != alloc.AddressMAC(ip) {
		t.Errorf("eth0 MAC in the result is %q, want %s", r.Interfaces[1].Mac, alloc.AddressMAC(ip))
	}
	c := r.IPs[0]
	if ones, _ := c.Address.Mask.Size(); ones != 24 || !c.Gateway.Equal(gw.AsSlice()) || c.Interface == nil || *c.Interface != 1 {
		t.Errorf("result IP %+v: want /24 via %s on interface 1", c, gw)
	}
	var routes []string
	for _, rt := range r.Routes {
		routes = append(routes, rt.Dst.String()+" via "+rt.GW.String())
	}
	want := []string{"0.0.0.0/0 via " + gw.String(), serviceCIDR + " via 169.254.1.1"}
	for _, w := range want {
		if !slices.Contains(routes, w) {
			t.Errorf("result routes %v lack %q", routes, w)
		}
	}
}

// checkPod asserts the pod's kernel state as `ip` shows it.
func checkPod(t *testing.T, kind macvlan.Kind, pod string, ip netip.Addr, tb *testbed.Topology) {
	t.Helper()
	h := bedtest.HandleIn(t, pod)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Type() != string(kind) {
		t.Fatalf("eth0 is a %s", l.Type())
	}
	if kind == macvlan.MACVLAN {
		if l.(*netlink.Macvlan).Mode != netlink.MACVLAN_MODE_BRIDGE || l.Attrs().HardwareAddr.String() != alloc.AddressMAC(ip) {
			t.Fatalf("eth0: mode %v MAC %s", l.(*netlink.Macvlan).Mode, l.Attrs().HardwareAddr)
		}
	}
	ns := strings.TrimPrefix(pod, "/run/netns/")
	routes := bedtest.Sh(t, ns, "ip", "-4", "route", "show")
	for _, want := range []string{
		"default via " + tb.Gateway.String() + " dev eth0",
		tb.Subnet.String() + " dev eth0 proto kernel scope link src " + ip.String(),
		serviceCIDR + " via 169.254.1.1 dev " + svcpath.PodIfName + " src " + ip.String(),
		tb.NodeIP.String() + " via 169.254.1.1 dev " + svcpath.PodIfName + " src " + ip.String(),
	} {
		if !strings.Contains(routes, want) {
			t.Errorf("pod routes lack %q:\n%s", want, routes)
		}
	}
	if neigh := bedtest.Sh(t, ns, "ip", "neigh", "show", "dev", svcpath.PodIfName); !strings.Contains(neigh, "169.254.1.1 lladdr") || !strings.Contains(neigh, "PERMANENT") {
		t.Errorf("pod has no permanent neighbour for 169.254.1.1: %s", neigh)
	}
	nodeRoutes := bedtest.Sh(t, tb.NodeNS(), "ip", "-4", "route", "show", ip.String()+"/32")
	if !strings.Contains(nodeRoutes, "dev "+svcpath.HostPrefix) || !strings.Contains(nodeRoutes, "proto 167") {
		t.Errorf("node route to %s is %q, want dev vsv... proto 167 (vpcni)", ip, nodeRoutes)
	}
}

// TestMacvlanService: a pod reaches a ClusterIP (a kube-proxy-style DNAT
// rule in the node's iptables) whose backend is (a) a pod on the same
// node, (b) a host elsewhere on the subnet (as a pod on another node is).
// Both need the service path's masquerade: without it (table removed, the
// agent stopped so it cannot put it back) both fail, since the backend
// answers the client over L2, past the node's conntrack.
func TestMacvlanService(t *testing.T) {
	t.Parallel()
	e := newEnv(t, macvlan.MACVLAN)
	c := e.cni("1.1.0")
	client, backend := e.Pod(1), e.Pod(2)
	e.Add(c, "svc-client", client)
	ipB := bedtest.ResultIP(t, e.Add(c, "svc-backend", backend))
	bedtest.Echo(t, backend, ipB)
	bedtest.Echo(t, netnsutil.Path(e.TB.NbrNS()), e.TB.NbrIP)
	for _, rule := range [][]string{
		{"iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.10/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", ipB.String() + ":7777"},
		{"iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.11/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", e.TB.NbrIP.String() + ":7777"},
	} {
		bedtest.Sh(t, e.TB.NodeNS(), rule...)
	}
	if rs := bedtest.Sh(t, e.TB.NodeNS(), "nft", "list", "table", "ip", svcpath.NATTable); !strings.Contains(rs, `iifname "vsv*" ct status dnat masquerade`) {
		t.Fatalf("no masquerade rule on the node:\n%s", rs)
	}
	bedtest.Reach(t, client, "10.96.0.10:80") // backend on the same node
	bedtest.Reach(t, client, "10.96.0.11:80") // backend elsewhere on the subnet

	if err := e.Agent.Stop(); err != nil {
		t.Fatal(err)
	}
	bedtest.Sh(t, e.TB.NodeNS(), "nft", "delete", "table", "ip", svcpath.NATTable)
	for _, svc := range []string{"10.96.0.10:80", "10.96.0.11:80"} {
		if err := bedtest.Probe(client, svc); err == nil {
			t.Fatalf("%s answered without the masquerade rule: the test proves nothing", svc)
		}
	}
	e.StartAgent() // its start-up reconcile puts the table back
	bedtest.WaitFor(t, 10*time.Second, "the NAT table to be back", func() bool {
		out, err := netnsutil.Output(e.TB.NodeNS(), "nft", "list", "table", "ip", svcpath.NATTable)
		return err == nil && strings.Contains(out, "masquerade")
	})
	bedtest.Reach(t, client, "10.96.0.10:80")
	bedtest.Reach(t, client, "10.96.0.11:80")
}

// TestMacvlanRestart: pods keep their traffic while the agent is down; the
// restarted agent puts back a deleted node route, re-wires a pod whose
// service veth was deleted (Reconcile reports it Broken), removes an
// orphan service veth, and CHECK and DEL work after it.
func TestMacvlanRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, macvlan.MACVLAN)
	c := e.cni("1.1.0")
	p1, p2 := e.Pod(1), e.Pod(2)
	ip1, ip2 := bedtest.ResultIP(t, e.Add(c, "rs-1", p1)), bedtest.ResultIP(t, e.Add(c, "rs-2", p2))
	nodeNS := netnsutil.Path(e.TB.NodeNS())
	bedtest.Echo(t, p1, ip1)
	bedtest.Echo(t, p2, ip2)
	bedtest.Echo(t, nodeNS, e.TB.NodeIP)

	if err := e.Agent.Kill(); err != nil {
		t.Fatal(err)
	}
	bedtest.Reach(t, p1, testbed.HostPort(ip2, 7777))
	bedtest.Reach(t, nodeNS, testbed.HostPort(ip1, 7777))
	bedtest.Reach(t, p2, testbed.HostPort(e.TB.NodeIP, 7777))
	// Damage: pod 1's node route goes; pod 2's service veth goes (its pod
	// end with it: only a re-wiring from the pod brings it back); an orphan
	// service veth appears.
	host1 := svcpath.HostIfName("rs-1", "eth0")
	bedtest.Sh(t, e.TB.NodeNS(), "ip", "route", "del", ip1.String()+"/32", "dev", host1)
	bedtest.Sh(t, e.TB.NodeNS(), "ip", "link", "del", svcpath.HostIfName("rs-2", "eth0"))
	bedtest.Sh(t, e.TB.NodeNS(), "ip", "link", "add", "vsvdeadbeef0000", "type", "veth", "peer", "name", "vpcnitmp0")
	bedtest.Sh(t, e.TB.NodeNS(), "ip", "link", "set", "vsvdeadbeef0000", "alias", "vpcni:gone/eth0")
	if err := bedtest.Probe(nodeNS, testbed.HostPort(ip1, 7777)); err == nil {
		t.Fatal("node reached pod 1 without its route: the damage proves nothing")
	}

	e.StartAgent()
	bedtest.WaitFor(t, 10*time.Second, "the routes and pod 2's service veth back, the orphan gone", func() bool {
		s := e.node()
		return len(s.Routes) == 2 && len(s.Links) == 2 && !slices.Contains(s.Links, "vsvdeadbeef0000")
	})
	bedtest.Reach(t, nodeNS, testbed.HostPort(ip1, 7777))
	bedtest.Reach(t, p2, testbed.HostPort(e.TB.NodeIP, 7777))
	bedtest.Reach(t, p1, testbed.HostPort(ip2, 7777))
	for _, p := range []struct{ id, ns string }{{"rs-1", p1}, {"rs-2", p2}} {
		if err := c.Check(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
			t.Fatalf("CHECK %s after restart: %v", p.id, err)
		}
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime(p.id, p.ns, "eth0", nil)); err != nil {
			t.Fatalf("DEL %s: %v", p.id, err)
		}
	}
	if got := e.node(); !got.empty() {
		t.Fatalf("DEL left on the node: %+v", got)
	}
}

// TestMacvlanBadInput: an ADD the pod's namespace cannot take gets CNI
// error 4 with the reason, and leaves nothing: no allocation, no service
// veth, the pod's own links as they were.
func TestMacvlanBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, macvlan.MACVLAN)
	c := e.cni("1.1.0")
	clash := e.Pod(1)
	bedtest.Sh(t, e.TB.PodNS(1), "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "theirs0")
	for _, tc := range []struct {
		name, ns, ifname, says string
	}{
		{"eth0 exists in the pod", clash, "eth0", "eth0 already exists"},
		{"ifname is the service veth's", e.Pod(2), svcpath.PodIfName, "vpcni's service veth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Add(bedtest.Ctx(t), testbed.Runtime("bad", tc.ns, tc.ifname, nil))
			if !bedtest.IsCode(err, 4) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v; want CNI error 4 saying %q", err, tc.says)
			}
			if st, err := e.Agent.State(); err != nil || len(st.Allocations) != 0 {
				t.Fatalf("allocation left: %+v %v", st, err)
			}
			if got := e.node(); !got.empty() {
				t.Fatalf("left on the node: %+v", got)
			}
		})
	}
	if links := podLinks(t, clash); fmt.Sprint(links) != "[theirs0 eth0]" && fmt.Sprint(links) != "[eth0 theirs0]" {
		t.Fatalf("the pod's own links changed: %v", links)
	}
	if links := podLinks(t, e.Pod(3)); len(links) != 0 {
		t.Fatal("fresh pod not empty")
	}
	// The agent still wires a good pod after that.
	p := e.Pod(4)
	e.Add(c, "good", p)
	if err := c.Del(bedtest.Ctx(t), testbed.Runtime("good", p, "eth0", nil)); err != nil {
		t.Fatal(err)
	}
}

// TestIpvlan runs the lifecycle in ipvlan mode where the kernel has ipvlan.
// Where it has not, it says so loudly and checks what an ADD does on such a
// kernel: a clear error naming the missing feature, nothing left behind.
func TestIpvlan(t *testing.T) {
	missing := ipvlanMissing(t)
	if missing == "" {
		lifecycle(t, macvlan.IPVLAN, "1.1.0")
		return
	}
	e := newEnv(t, macvlan.IPVLAN)
	c := e.cni("1.1.0")
	p := e.Pod(1)
	_, err := c.Add(bedtest.Ctx(t), testbed.Runtime("iv", p, "eth0", nil))
	if err == nil || !strings.Contains(err.Error(), "no ipvlan (CONFIG_IPVLAN)") {
		t.Fatalf("ADD in ipvlan mode on a kernel without ipvlan: %v; want an error naming CONFIG_IPVLAN", err)
	}
	if links := podLinks(t, p); len(links) != 0 {
		t.Fatalf("failed ADD left links in the pod: %v", links)
	}
	if got := e.node(); !got.empty() {
		t.Fatalf("failed ADD left on the node: %+v", got)
	}
	t.Skipf("SKIPPED LOUDLY: this kernel has no ipvlan (CONFIG_IPVLAN): creating one in a scratch namespace failed (%s). "+
		"The ipvlan mode's pod traffic, IPv4 and IPv6, is NOT proven here; its code path is macvlan's (proven by TestMacvlanLifecycle and TestMacvlanDualStack) and its link, settings and registration are unit-tested in internal/datapath/macvlan and internal/datapath/ipvlan. "+
		"What ran: an ADD in ipvlan mode fails with a clear error and leaves nothing.", missing)
}
