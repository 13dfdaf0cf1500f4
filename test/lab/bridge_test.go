package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// TestBridgeLab: two nodes in datapath mode bridge against the lab's
// Neutron endpoint, provider openstack in address-pairs mode (each pair
// carries its pod's MAC, which the lab's port security checks). The
// legacy VM probes each node every 10 ms while its agent's start moves the
// node's address onto the bridge; then pods reach each other on one node
// and across nodes, their node, the legacy VM and back, and Services
// DNATed in n1 to a pod on n1 and to a pod on n2.
func TestBridgeLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "br", 2, "10.92.0.0/24")
	legacy := netnsutil.Path(l.Legacy.NS)
	nodes := configureNodes(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID, Mode: "address-pairs"}}
		cfg.Datapath = config.Datapath{Mode: "bridge"}
	})
	for _, n := range nodes {
		node := n.host
		pinger, err := lab.StartPinger(legacy, node.IP, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if err := pinger.WaitAnswered(3 * time.Second); err != nil {
			pinger.Stop()
			t.Fatalf("legacy VM -> %s before the move: %v", node.Name, err)
		}
		err = n.launch(t)
		move := pinger.Stop()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("bridge-move: %s node=%s (lab)\n", move, node.Name)
		if move.Gap > time.Second {
			t.Errorf("the legacy VM lost %s for %s while the bridge took its uplink", node.Name, move.Gap)
		}
		if out, _ := netnsutil.Output(node.NS, "ip", "-4", "addr", "show", "vpcbr0"); !strings.Contains(out, node.IP.String()+"/") {
			t.Fatalf("%s's address is not on vpcbr0:\n%s", node.Name, out)
		}
	}
	a := addPod(t, c, l, nodes[0], "a")
	b := addPod(t, c, l, nodes[0], "b")
	pc := addPod(t, c, l, nodes[1], "c")
	for _, p := range []labPod{a, b, pc} {
		brCheckMAC(t, p)
	}
	n1 := netnsutil.Path(l.Nodes[0].NS)
	serveEcho(t, legacy, l.Legacy.IP)
	serveEcho(t, n1, l.Nodes[0].IP)
	expectReach(t, c, []reachable{
		{"pod a -> pod b (same node)", a.ns, b.ip},
		{"pod b -> pod a (same node)", b.ns, a.ip},
		{"pod a (n1) -> pod c (n2)", a.ns, pc.ip},
		{"pod c (n2) -> pod a (n1)", pc.ns, a.ip},
		{"pod a -> its node n1", a.ns, l.Nodes[0].IP},
		{"node n1 -> pod a", n1, a.ip},
		{"legacy VM -> pod a", legacy, a.ip},
		{"legacy VM -> pod c", legacy, pc.ip},
		{"pod a -> legacy VM", a.ns, l.Legacy.IP},
		{"pod c -> legacy VM", pc.ns, l.Legacy.IP},
	})
	if t.Failed() {
		t.FailNow()
	}
	// Services: kube-proxy-style DNAT rules in n1. Pod a's frames to the
	// Service IP are bridged towards the router; n1's bridge hands them to
	// iptables (its own nf_call_iptables), which DNATs them to pod b on n1
	// or pod c on n2; the reply is un-DNATed by conntrack on the bridge.
	for svc, backend := range map[string]netip.Addr{"10.96.0.10": b.ip, "10.96.0.11": pc.ip} {
		if err := netnsutil.Exec(l.Nodes[0].NS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp", "--dport", "80",
			"-j", "DNAT", "--to-destination", testbed.HostPort(backend, 7777)); err != nil {
			t.Fatal(err)
		}
		if err := probe(c, a.ns, svc+":80"); err != nil {
			t.Errorf("pod a (n1) -> Service %s -> %s: %v", svc, backend, err)
		}
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}

// brCheckMAC fails the test unless the pod's eth0 carries the pod's own
// MAC, the one its address pair names.
func brCheckMAC(t *testing.T, p labPod) {
	t.Helper()
	if out, _ := netnsutil.Output(p.name, "ip", "link", "show", "eth0"); !strings.Contains(out, alloc.AddressMAC(p.ip)) {
		t.Fatalf("pod %s's eth0 lacks its MAC %s:\n%s", p.id, alloc.AddressMAC(p.ip), out)
	}
}
