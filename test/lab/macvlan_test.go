package lab

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// TestMacvlanLab: two nodes in datapath mode macvlan against the lab's
// Neutron endpoint, provider openstack in address-pairs mode (each pod's
// pair carries its MAC, 0a:58:<ip>). Pods reach each other on one node and
// across nodes, the node and the legacy VM reach them and back, a pod
// reaches a Service DNATed in n1 to a pod on n2, and the lab's port
// security proves the pod's frames leave with its own MAC: with the MAC
// taken off its pair, the legacy VM no longer reaches it.
func TestMacvlanLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "mv", 2, "10.91.0.0/24")
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID, Mode: "address-pairs"}}
		cfg.Datapath = config.Datapath{Mode: "macvlan", Settings: &macvlan.Settings{Settings: svcpath.Settings{ServiceCIDRs: []string{"10.96.0.0/12"}}}}
	})
	// Pods a and b on n1, c on n2.
	a := addPod(t, c, l, nodes[0], "a")
	b := addPod(t, c, l, nodes[0], "b")
	pc := addPod(t, c, l, nodes[1], "c")
	for _, p := range []labPod{a, b, pc} {
		mvCheckEth0(t, p)
	}
	legacy := netnsutil.Path(l.Legacy.NS)
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

	// A Service: a kube-proxy-style DNAT rule in n1 sends its IP to pod c on
	// n2. Pod a's traffic to it takes the service veth into n1's stack;
	// n1 masquerades it, so pod c's reply comes back through n1's
	// conntrack rather than straight to pod a over L2.
	const svc = "10.96.0.10"
	if err := netnsutil.Exec(l.Nodes[0].NS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", testbed.HostPort(pc.ip, 7777)); err != nil {
		t.Fatal(err)
	}
	if err := probe(c, a.ns, svc+":80"); err != nil {
		t.Errorf("pod a (n1) -> Service %s -> pod c (n2): %v", svc, err)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}

	// Port security: the pair of pod a's address on n1's port carries pod
	// a's MAC. n1's agent is stopped (its resync would put the MAC back),
	// the pair is rewritten with the port's own MAC: the VPC bridge drops
	// pod a's frames. With the MAC back, traffic flows again.
	if err := nodes[0].agent.Stop(); err != nil {
		t.Fatal(err)
	}
	mac := alloc.AddressMAC(a.ip)
	if got := mvPairMAC(t, l, l.Nodes[0].PortID, a.ip); got != mac {
		t.Fatalf("n1's port pairs %s with MAC %q, want %s", a.ip, got, mac)
	}
	mvSetPairMAC(t, l, l.Nodes[0].PortID, a.ip, "")
	if err := probe(c, legacy, testbed.HostPort(a.ip, 7777)); err == nil {
		t.Fatalf("legacy VM still reaches %s with its MAC off the pair: port security does not see pod MACs", a.ip)
	}
	mvSetPairMAC(t, l, l.Nodes[0].PortID, a.ip, mac)
	if err := probe(c, legacy, testbed.HostPort(a.ip, 7777)); err != nil {
		t.Fatalf("legacy VM -> %s with its MAC back on the pair: %v", a.ip, err)
	}
}

// mvCheckEth0 fails the test unless the pod's eth0 is a macvlan in
// bridge mode carrying the pod's own MAC, the one its address pair names.
func mvCheckEth0(t *testing.T, p labPod) {
	t.Helper()
	if out, _ := netnsutil.Output(p.name, "ip", "-d", "link", "show", "eth0"); !strings.Contains(out, "macvlan mode bridge") || !strings.Contains(out, alloc.AddressMAC(p.ip)) {
		t.Fatalf("pod %s's eth0 is not a macvlan with MAC %s:\n%s", p.id, alloc.AddressMAC(p.ip), out)
	}
}

// mvPairMAC is the MAC of the port's allowed address pair for ip ("" if
// none).
func mvPairMAC(t *testing.T, l *lab.Lab, portID string, ip netip.Addr) string {
	t.Helper()
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	p, err := ports.Get(context.Background(), nc, portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for _, ap := range p.AllowedAddressPairs {
		if ap.IPAddress == ip.String() || ap.IPAddress == ip.String()+"/32" {
			return ap.MACAddress
		}
	}
	return ""
}

// mvSetPairMAC rewrites the MAC of the port's pair for ip as a person
// would ("" = the port's own MAC).
func mvSetPairMAC(t *testing.T, l *lab.Lab, portID string, ip netip.Addr, mac string) {
	t.Helper()
	updatePort(t, l, portID, func(p *ports.Port) ports.UpdateOpts {
		pairs := make([]ports.AddressPair, 0, len(p.AllowedAddressPairs))
		for _, ap := range p.AllowedAddressPairs {
			if ap.IPAddress == ip.String() || ap.IPAddress == ip.String()+"/32" {
				ap.MACAddress = mac
				if mac == "" {
					ap.MACAddress = p.MACAddress
				}
			}
			pairs = append(pairs, ap)
		}
		return ports.UpdateOpts{AllowedAddressPairs: &pairs}
	})
}
