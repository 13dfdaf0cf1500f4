package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// TestDualStackLab: dual-stack pods in mode veth on two nodes whose
// network has an IPv4 and an IPv6 subnet (Neutron's, with the lab's port
// security for both families), the openstack provider putting each pod's
// addresses on its node's VM port as fixed IPs — its IPv6 subnet found
// from the port. The legacy VM and the pods reach each other by both
// families, across the nodes too; and port security is real for IPv6: a
// pod's IPv6 address taken off its node's port stops passing.
func TestDualStackLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnid6%d", os.Getpid()%100000), Nodes: 2,
		Subnet: netip.MustParsePrefix("10.88.6.0/24"), Subnet6: netip.MustParsePrefix("fd00:88:6::/64")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.IPFamilies = []family.Family{family.V4, family.V6}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
	})
	pods := []labPod{addPod(t, c, l, nodes[0], "0"), addPod(t, c, l, nodes[1], "1")}
	subnet6 := netip.MustParsePrefix("fd00:88:6::/64")
	for i, p := range pods {
		if !p.ip.IsValid() || !subnet6.Contains(p.ip6) {
			t.Fatalf("pod on n%d got %s and %s, want an IPv4 address and one of %s", i+1, p.ip, p.ip6, subnet6)
		}
		on := fixedIPs(t, l, l.Nodes[i].PortID)
		if !slices.Contains(on, p.ip) || !slices.Contains(on, p.ip6) {
			t.Fatalf("pod %s/%s: not both on n%d's VM port (%v)", p.ip, p.ip6, i+1, on)
		}
	}
	legacy := netnsutil.Path(l.Legacy.NS)
	serveEcho(t, legacy, l.Legacy.IP)
	serveEcho(t, legacy, l.Legacy.IP6)
	var paths []reachable
	for _, p := range pods {
		for _, pair := range [][2]netip.Addr{{p.ip, l.Legacy.IP}, {p.ip6, l.Legacy.IP6}} {
			paths = append(paths,
				reachable{fmt.Sprintf("legacy VM -> pod %s", pair[0]), legacy, pair[0]},
				reachable{fmt.Sprintf("pod %s -> legacy VM %s", pair[0], pair[1]), p.ns, pair[1]})
		}
	}
	expectReach(t, c, append(paths,
		reachable{"pod on n1 -> pod on n2 by IPv6", pods[0].ns, pods[1].ip6},
		reachable{"pod on n2 -> pod on n1 by IPv6", pods[1].ns, pods[0].ip6},
		reachable{"pod on n1 -> pod on n2 by IPv4", pods[0].ns, pods[1].ip}))
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("vpcni-test: dual-stack lab: pods %s/%s (n1) and %s/%s (n2) on their VM ports; legacy VM %s/%s <-> pods, pod <-> pod across nodes, both families",
		pods[0].ip, pods[0].ip6, pods[1].ip, pods[1].ip6, l.Legacy.IP, l.Legacy.IP6)

	// Port security for IPv6, as TestLegacyVMReachesPods checks it for
	// IPv4 (n1's pool settled first, so no top-up of its own races).
	settled := time.Now().Add(30 * time.Second)
	for {
		st, err := nodes[0].agent.State()
		if err == nil && len(st.Families) == 2 && st.Families[1].Waiting == 0 && st.Families[1].Free >= st.Families[1].WarmTarget {
			break
		}
		if time.Now().After(settled) {
			t.Fatalf("n1's IPv6 pool did not settle within 30s: %+v, %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip6, false)
	if err := probe(c, legacy, testbed.HostPort(pods[0].ip6, 7777)); err == nil {
		t.Fatalf("legacy VM still reaches %s with the address off the VM port: IPv6 port security is not enforced", pods[0].ip6)
	}
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip6, true)
	if err := probe(c, legacy, testbed.HostPort(pods[0].ip6, 7777)); err != nil {
		t.Fatalf("legacy VM -> %s after the address is back on the port: %v", pods[0].ip6, err)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}
