package passthrough

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// TestDualStackNIC wires a dual-stack pod in real namespaces: a node
// (uplink with an address of each family), a "NIC" (a veth with the
// port's MAC whose other end sits in a router namespace holding both
// subnets' gateways) and a pod. The NIC moves into the pod with both
// addresses (IPv6 nodad, accept_ra 0) and a default route per family; the
// pod reaches its gateways and its node in both families (the node over
// the service veth, IPv6 via fe80::1); the router's stale entry for the
// pod's IPv6 address takes the NIC's MAC from the unsolicited
// advertisement; CHECK is clean; Teardown gives the NIC back bare.
func TestDualStackNIC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("NOT RUN: needs root to create network namespaces (make test runs it as root)")
	}
	tag := fmt.Sprint(os.Getpid())
	node, pod, gw := "vpcni-ptn"+tag, "vpcni-ptp"+tag, "vpcni-ptg"+tag
	run := func(argv ...string) string {
		t.Helper()
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, out)
		}
		return string(out)
	}
	for _, ns := range []string{node, pod, gw} {
		run("ip", "netns", "add", ns)
		t.Cleanup(func() { _ = netnsutil.Delete(ns) })
	}
	const mac = "02:aa:00:00:00:05"
	for _, c := range [][]string{
		{"ip", "-n", node, "link", "add", "eth0", "type", "veth", "peer", "name", "up0", "netns", gw},
		{"ip", "-n", node, "addr", "add", "10.99.0.10/24", "dev", "eth0"},
		{"ip", "-n", node, "addr", "add", "2001:db8:99::10/64", "dev", "eth0", "nodad"},
		{"ip", "-n", node, "link", "set", "eth0", "up"},
		{"ip", "-n", node, "route", "add", "default", "via", "10.99.0.1"},
		{"ip", "-n", node, "link", "add", "nic0", "address", mac, "type", "veth", "peer", "name", "wire0", "netns", gw},
		{"ip", "-n", gw, "addr", "add", "10.99.1.1/24", "dev", "wire0"},
		{"ip", "-n", gw, "addr", "add", "2001:db8:1::1/64", "dev", "wire0", "nodad"},
		{"ip", "-n", gw, "link", "set", "wire0", "up"},
		{"ip", "-n", gw, "link", "set", "up0", "up"},
		{"ip", "-n", gw, "link", "set", "lo", "up"},
		// A stale entry at another MAC: the pod's advertisement must win.
		{"ip", "-n", gw, "-6", "neigh", "replace", "2001:db8:1::5", "lladdr", "02:00:00:00:00:99", "dev", "wire0", "nud", "stale"},
	} {
		run(c...)
	}
	a := &alloc.Allocation{ContainerID: "pt-ds", IfName: "eth0", Netns: netnsutil.Path(pod),
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.99.1.5"), Prefix: netip.MustParsePrefix("10.99.1.0/24"),
			Gateway: netip.MustParseAddr("10.99.1.1"), NIC: &alloc.NIC{MAC: mac, Address: netip.MustParseAddr("10.99.1.5")}},
		Others: []alloc.Lease{{Address: netip.MustParseAddr("2001:db8:1::5"), Prefix: netip.MustParsePrefix("2001:db8:1::/64"),
			Gateway: netip.MustParseAddr("2001:db8:1::1"), NIC: &alloc.NIC{MAC: mac, Address: netip.MustParseAddr("10.99.1.5")}}}}

	// The mode runs in the node's namespace, on a thread of its own that
	// dies with the test's use of it (never unlocked).
	inNode := func(f func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			h, err := netns.GetFromName(node)
			if err != nil {
				t.Errorf("node netns: %v", err)
				return
			}
			defer h.Close()
			if err := netns.Set(h); err != nil {
				t.Errorf("enter node netns: %v", err)
				return
			}
			f()
		}()
		<-done
	}
	var m *Mode
	inNode(func() {
		var err error
		s := &Settings{}
		s.ServiceCIDRs = []string{"10.96.0.0/12", "fd00:96::/112"}
		if m, err = New(datapath.Node{Uplink: "eth0", Families: []family.Family{family.V4, family.V6}}, s); err != nil {
			t.Errorf("New: %v", err)
			return
		}
		w, err := m.Setup(context.Background(), a)
		if err != nil {
			t.Errorf("Setup: %v", err)
		}
		a.Wiring = &w // as the agent records it: DEL gives the NIC back under its name
	})
	if t.Failed() {
		t.FailNow()
	}
	t0 := time.Now()
	for time.Since(t0) < 2*time.Second {
		if out, _ := netnsutil.Output(gw, "ip", "-6", "neigh", "show", "2001:db8:1::5", "dev", "wire0"); strings.Contains(out, mac) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, _ := netnsutil.Output(gw, "ip", "-6", "neigh", "show", "2001:db8:1::5", "dev", "wire0"); !strings.Contains(out, mac) {
		t.Errorf("the router did not take the NIC's MAC for 2001:db8:1::5 from the advertisement: %q", out)
	}
	for _, c := range []struct {
		argv []string
		want []string
	}{
		{[]string{"ip", "addr", "show", "dev", "eth0"}, []string{"link/ether " + mac, "10.99.1.5/24", "2001:db8:1::5/64 scope global nodad"}},
		{[]string{"ip", "-6", "route"}, []string{"default via 2001:db8:1::1 dev eth0", "fd00:96::/112 via fe80::1 dev vpcni-svc src 2001:db8:1::5", "2001:db8:99::10 via fe80::1 dev vpcni-svc src 2001:db8:1::5"}},
		{[]string{"ip", "-4", "route"}, []string{"default via 10.99.1.1 dev eth0", "10.96.0.0/12 via 169.254.1.1 dev vpcni-svc src 10.99.1.5"}},
		{[]string{"cat", "/proc/sys/net/ipv6/conf/eth0/accept_ra"}, []string{"0"}},
	} {
		out, err := netnsutil.Output(pod, c.argv...)
		for _, w := range c.want {
			if err != nil || !strings.Contains(out, w) {
				t.Errorf("pod %v lacks %q (%v):\n%s", c.argv, w, err, out)
			}
		}
	}
	// Traffic: the gateways on the NIC's wire, the node over the service
	// veth, each family.
	for _, srv := range []struct{ ns, addr string }{
		{gw, "10.99.1.1:7777"}, {gw, "[2001:db8:1::1]:7777"},
		{node, "10.99.0.10:7777"}, {node, "[2001:db8:99::10]:7777"},
	} {
		e, err := netnsutil.ServeEcho(netnsutil.Path(srv.ns), srv.addr)
		if err != nil {
			t.Fatalf("echo on %s: %v", srv.addr, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if err := netnsutil.Probe(ctx, netnsutil.Path(pod), srv.addr); err != nil {
			t.Errorf("pod -> %s (%s): %v", srv.addr, srv.ns, err)
		}
		cancel()
		e.Close()
	}
	if n := run("ip", "-n", node, "-6", "neigh", "show", "2001:db8:1::5", "dev", svcpath.HostIfName(a.ContainerID, a.IfName)); !strings.Contains(n, "PERMANENT") {
		t.Errorf("node has no permanent neighbour for the pod's IPv6 address on its service veth: %q", n)
	}
	inNode(func() {
		if _, err := m.Check(context.Background(), a); err != nil {
			t.Errorf("Check: %v", err)
		}
		if err := m.Teardown(context.Background(), a); err != nil {
			t.Errorf("Teardown: %v", err)
		}
	})
	back := run("ip", "-n", node, "-o", "addr", "show", "dev", "nic0")
	if strings.Contains(back, "2001:db8") || strings.Contains(back, "10.99.1.5") {
		t.Errorf("the NIC came back with addresses:\n%s", back)
	}
	if out := run("ip", "-n", pod, "-o", "link"); strings.Contains(out, "eth0") || strings.Contains(out, "vpcni-svc") {
		t.Errorf("Teardown left links in the pod:\n%s", out)
	}
}
