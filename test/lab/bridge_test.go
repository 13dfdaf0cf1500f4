package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

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
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnibr%d", os.Getpid()%100000), Nodes: 2, Subnet: netip.MustParsePrefix("10.92.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	runDir := t.TempDir()
	legacy := netnsutil.Path(l.Legacy.NS)
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
		cfg.Datapath = config.Datapath{Mode: "bridge"}
		pinger, err := lab.StartPinger(legacy, node.IP, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if err := pinger.WaitAnswered(3 * time.Second); err != nil {
			pinger.Stop()
			t.Fatalf("legacy VM -> %s before the move: %v", node.Name, err)
		}
		agent, err := testbed.StartAgentIn(runDir, node.NS, binDir, cfg)
		move := pinger.Stop()
		if err != nil {
			t.Fatalf("vpcnid on %s: %v", node.Name, err)
		}
		fmt.Printf("bridge-move: %s node=%s (lab)\n", move, node.Name)
		if move.Gap > time.Second {
			t.Errorf("the legacy VM lost %s for %s while the bridge took its uplink", node.Name, move.Gap)
		}
		t.Cleanup(func() {
			if t.Failed() {
				if log, err := os.ReadFile(agent.LogPath); err == nil {
					t.Logf("vpcnid %s log:\n%s", node.Name, log)
				}
			}
			_ = agent.Stop()
		})
		if out, _ := netnsutil.Output(node.NS, "ip", "-4", "addr", "show", "vpcbr0"); !strings.Contains(out, node.IP.String()+"/") {
			t.Fatalf("%s's address is not on vpcbr0:\n%s", node.Name, out)
		}
		cni, err := testbed.NewCNIIn(node.NS, []string{binDir}, filepath.Join(runDir, node.Name, "cache"), testbed.VpcniConfList("1.1.0", "vpcni-lab", cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		cnis = append(cnis, cni)
	}
	a := brAddPod(t, c, l, cnis[0], "a")
	b := brAddPod(t, c, l, cnis[0], "b")
	pc := brAddPod(t, c, l, cnis[1], "c")
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
		what string
		from string
		to   netip.Addr
	}{
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
	} {
		if err := brProbe(c, p.from, testbed.HostPort(p.to, 7777)); err != nil {
			t.Errorf("%s: %v", p.what, err)
		}
	}
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
		if err := brProbe(c, a.ns, svc+":80"); err != nil {
			t.Errorf("pod a (n1) -> Service %s -> %s: %v", svc, backend, err)
		}
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}

type brPod struct {
	ns string
	ip netip.Addr
}

// brAddPod makes a pod namespace, ADDs it through cni, checks its eth0
// carries the pod's own MAC, and serves echo on its address.
func brAddPod(t *testing.T, c context.Context, l *lab.Lab, cni *testbed.CNI, name string) brPod {
	t.Helper()
	ns := l.Prefix + "-pod" + name
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	res, err := cni.Add(c, testbed.Runtime("br-"+name, netnsutil.Path(ns), "eth0", nil))
	if err != nil {
		t.Fatalf("ADD pod %s: %v", name, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if out, _ := netnsutil.Output(ns, "ip", "link", "show", "eth0"); !strings.Contains(out, alloc.AddressMAC(ip)) {
		t.Fatalf("pod %s's eth0 lacks its MAC %s:\n%s", name, alloc.AddressMAC(ip), out)
	}
	srv, err := netnsutil.ServeEcho(netnsutil.Path(ns), testbed.HostPort(ip, 7777))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return brPod{ns: netnsutil.Path(ns), ip: ip}
}

func brProbe(c context.Context, from, addr string) error {
	pc, cancel := context.WithTimeout(c, 3*time.Second)
	defer cancel()
	return netnsutil.Probe(pc, from, addr)
}
