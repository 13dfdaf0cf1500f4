package lab

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
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
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnimv%d", os.Getpid()%100000), Nodes: 2, Subnet: netip.MustParsePrefix("10.91.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	runDir := t.TempDir()
	var agents []*testbed.Agent
	var cnis []*testbed.CNI
	for _, node := range l.Nodes {
		cfg := config.Defaults()
		cfg.NodeName = node.Name
		cfg.SocketPath = filepath.Join(runDir, node.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(runDir, node.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Pool = config.Pool{WarmTarget: 2, BatchSize: 2, MaxFree: 4}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID, Mode: "address-pairs"}}
		cfg.Datapath = config.Datapath{Mode: "macvlan", Settings: &macvlan.Settings{ServiceCIDRs: []string{"10.96.0.0/12"}}}
		agent, err := testbed.StartAgentIn(runDir, node.NS, binDir, cfg)
		if err != nil {
			t.Fatalf("vpcnid on %s: %v", node.Name, err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				if log, err := os.ReadFile(agent.LogPath); err == nil {
					t.Logf("vpcnid %s log:\n%s", node.Name, log)
				}
			}
			_ = agent.Stop()
		})
		agents = append(agents, agent)
		cni, err := testbed.NewCNIIn(node.NS, []string{binDir}, filepath.Join(runDir, node.Name, "cache"), testbed.VpcniConfList("1.1.0", "vpcni-lab", cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		cnis = append(cnis, cni)
	}
	// Pods a and b on n1, c on n2.
	a := mvAddPod(t, c, l, cnis[0], "a")
	b := mvAddPod(t, c, l, cnis[0], "b")
	pc := mvAddPod(t, c, l, cnis[1], "c")
	legacy := netnsutil.Path(l.Legacy.NS)
	n1 := netnsutil.Path(l.Nodes[0].NS)
	for _, s := range []struct {
		ns string
		ip netip.Addr
	}{{legacy, l.Legacy.IP}, {n1, l.Nodes[0].IP}} {
		srv, err := netnsutil.ServeEcho(s.ns, testbed.HostPort(s.ip, 7777))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
	}
	for _, p := range []struct {
		what     string
		from     string
		to       netip.Addr
		deadline time.Duration
	}{
		{"pod a -> pod b (same node)", a.ns, b.ip, 0},
		{"pod b -> pod a (same node)", b.ns, a.ip, 0},
		{"pod a (n1) -> pod c (n2)", a.ns, pc.ip, 0},
		{"pod c (n2) -> pod a (n1)", pc.ns, a.ip, 0},
		{"pod a -> its node n1", a.ns, l.Nodes[0].IP, 0},
		{"node n1 -> pod a", n1, a.ip, 0},
		{"legacy VM -> pod a", legacy, a.ip, 0},
		{"legacy VM -> pod c", legacy, pc.ip, 0},
		{"pod a -> legacy VM", a.ns, l.Legacy.IP, 0},
		{"pod c -> legacy VM", pc.ns, l.Legacy.IP, 0},
	} {
		if err := mvProbe(c, p.from, testbed.HostPort(p.to, 7777)); err != nil {
			t.Errorf("%s: %v", p.what, err)
		}
	}
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
	if err := mvProbe(c, a.ns, svc+":80"); err != nil {
		t.Errorf("pod a (n1) -> Service %s -> pod c (n2): %v", svc, err)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}

	// Port security: the pair of pod a's address on n1's port carries pod
	// a's MAC. n1's agent is stopped (its resync would put the MAC back),
	// the pair is rewritten with the port's own MAC: the VPC bridge drops
	// pod a's frames. With the MAC back, traffic flows again.
	if err := agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	mac := alloc.AddressMAC(a.ip)
	if got := mvPairMAC(t, l, l.Nodes[0].PortID, a.ip); got != mac {
		t.Fatalf("n1's port pairs %s with MAC %q, want %s", a.ip, got, mac)
	}
	mvSetPairMAC(t, l, l.Nodes[0].PortID, a.ip, "")
	if err := mvProbe(c, legacy, testbed.HostPort(a.ip, 7777)); err == nil {
		t.Fatalf("legacy VM still reaches %s with its MAC off the pair: port security does not see pod MACs", a.ip)
	}
	mvSetPairMAC(t, l, l.Nodes[0].PortID, a.ip, mac)
	if err := mvProbe(c, legacy, testbed.HostPort(a.ip, 7777)); err != nil {
		t.Fatalf("legacy VM -> %s with its MAC back on the pair: %v", a.ip, err)
	}
}

type mvPod struct {
	ns string
	ip netip.Addr
}

// mvAddPod makes a pod namespace, ADDs it through cni and serves echo on
// its address.
func mvAddPod(t *testing.T, c context.Context, l *lab.Lab, cni *testbed.CNI, name string) mvPod {
	t.Helper()
	ns := l.Prefix + "-pod" + name
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	res, err := cni.Add(c, testbed.Runtime("mv-"+name, netnsutil.Path(ns), "eth0", nil))
	if err != nil {
		t.Fatalf("ADD pod %s: %v", name, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if out, _ := netnsutil.Output(ns, "ip", "-d", "link", "show", "eth0"); !strings.Contains(out, "macvlan mode bridge") || !strings.Contains(out, alloc.AddressMAC(ip)) {
		t.Fatalf("pod %s's eth0 is not a macvlan with MAC %s:\n%s", name, alloc.AddressMAC(ip), out)
	}
	srv, err := netnsutil.ServeEcho(netnsutil.Path(ns), testbed.HostPort(ip, 7777))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return mvPod{ns: netnsutil.Path(ns), ip: ip}
}

func mvProbe(c context.Context, from, addr string) error {
	pc, cancel := context.WithTimeout(c, 3*time.Second)
	defer cancel()
	return netnsutil.Probe(pc, from, addr)
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
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 10 {
		p, err := ports.Get(c, nc, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
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
		rev := p.RevisionNumber
		_, err = ports.Update(c, nc, portID, ports.UpdateOpts{AllowedAddressPairs: &pairs, RevisionNumber: &rev}).Extract()
		if err == nil {
			return
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Fatal(err)
		}
	}
	t.Fatal("could not update the port")
}
