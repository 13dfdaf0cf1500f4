// Package lab runs vpcni end to end on the lab: a VPC segment with
// Neutron-like port security, a router, nodes running vpcnid against the
// lab's Neutron-compatible endpoint, and a legacy VM outside the cluster.
package lab

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

var binDir string

func TestMain(m *testing.M) {
	testbed.RequireRoot("the lab tests")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestLegacyVMReachesPods: the point of vpcni. A VM outside the cluster
// reaches pods on two nodes by their own IPs and they reach it; pods reach
// each other across nodes; port security is real — a pod's address works
// only while it is on its node's VM port.
func TestLegacyVMReachesPods(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "l", 2, "10.90.0.0/24")
	nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
	})
	pods := []labPod{addPod(t, c, l, nodes[0], "0"), addPod(t, c, l, nodes[1], "1")}
	legacy := netnsutil.Path(l.Legacy.NS)
	serveEcho(t, legacy, l.Legacy.IP)
	var paths []reachable
	for _, p := range pods {
		paths = append(paths,
			reachable{fmt.Sprintf("legacy VM -> pod %s", p.ip), legacy, p.ip},
			reachable{fmt.Sprintf("pod %s -> legacy VM", p.ip), p.ns, l.Legacy.IP})
	}
	expectReach(t, c, append(paths,
		reachable{"pod on n1 -> pod on n2", pods[0].ns, pods[1].ip},
		reachable{"pod on n2 -> pod on n1", pods[1].ns, pods[0].ip}))
	if t.Failed() {
		t.FailNow()
	}

	// A Service: a kube-proxy-style DNAT rule in node n1 sends its IP to the
	// pod on n2. Pod traffic to it goes through n1's stack (the default
	// route via 169.254.1.1) and its replies come back through conntrack.
	const svc = "10.96.0.10"
	if err := netnsutil.Exec(l.Nodes[0].NS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", testbed.HostPort(pods[1].ip, 7777)); err != nil {
		t.Fatal(err)
	}
	if err := probe(c, pods[0].ns, svc+":80"); err != nil {
		t.Errorf("pod on n1 -> Service %s -> pod on n2 (%s): %v", svc, pods[1].ip, err)
	}

	// A floating IP for pod 0: the external host reaches the pod through it,
	// and the pod reaches the external host (SNAT to the floating IP).
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	fip, err := floatingips.Create(c, nc, floatingips.CreateOpts{FloatingNetworkID: l.ExtNetID, PortID: l.Nodes[0].PortID, FixedIP: pods[0].ip.String()}).Extract()
	if err != nil {
		t.Fatalf("floating IP for %s: %v", pods[0].ip, err)
	}
	external := netnsutil.Path(l.External.NS)
	if err := probe(c, external, testbed.HostPort(netip.MustParseAddr(fip.FloatingIP), 7777)); err != nil {
		t.Errorf("external -> floating IP %s -> pod %s: %v", fip.FloatingIP, pods[0].ip, err)
	}
	serveEcho(t, external, l.External.IP)
	if err := probe(c, pods[0].ns, testbed.HostPort(l.External.IP, 7777)); err != nil {
		t.Errorf("pod %s -> external through its floating IP: %v", pods[0].ip, err)
	}
	// An extra route on the router lands in the router namespace.
	rt := []routers.Route{{DestinationCIDR: "10.244.7.0/24", NextHop: l.Nodes[1].IP.String()}}
	if _, err := extraroutes.Add(c, nc, l.RouterID, extraroutes.Opts{Routes: &rt}).Extract(); err != nil {
		t.Fatal(err)
	}
	if out, _ := netnsutil.Output(l.Router.NS, "ip", "route"); !strings.Contains(out, "10.244.7.0/24 via "+l.Nodes[1].IP.String()) {
		t.Errorf("router routes lack the extra route:\n%s", out)
	}

	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
	// Port security: take pod 0's address off n1's VM port by hand; its
	// traffic is dropped at the VPC bridge. Put it back: it flows again.
	// First n1's pool must be settled: a top-up write of its own in flight
	// would read the port back without pod 0's address and put it back
	// (the knocked-out repair), racing the edit.
	settled := time.Now().Add(30 * time.Second)
	for {
		st, err := nodes[0].agent.State()
		if err == nil && st.Pool.Waiting == 0 && st.Pool.Free >= st.Pool.WarmTarget {
			break
		}
		if time.Now().After(settled) {
			t.Fatalf("n1's pool did not settle within 30s: %+v, %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip, false)
	if err := probe(c, legacy, testbed.HostPort(pods[0].ip, 7777)); err == nil {
		t.Fatalf("legacy VM still reaches %s with the address off the VM port: port security is not enforced", pods[0].ip)
	}
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip, true)
	if err := probe(c, legacy, testbed.HostPort(pods[0].ip, 7777)); err != nil {
		t.Fatalf("legacy VM -> %s after the address is back on the port: %v", pods[0].ip, err)
	}
}

// setOnPort adds or removes an address on a port as a person would.
func setOnPort(t *testing.T, l *lab.Lab, portID string, ip netip.Addr, on bool) {
	t.Helper()
	updatePort(t, l, portID, func(p *ports.Port) ports.UpdateOpts {
		fixed := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.IPAddress == ip.String() })
		if on {
			subnet := l.SubnetID
			if ip.Is6() {
				subnet = l.SubnetID6
			}
			fixed = append(fixed, ports.IP{SubnetID: subnet, IPAddress: ip.String()})
		}
		return ports.UpdateOpts{FixedIPs: fixed}
	})
}
