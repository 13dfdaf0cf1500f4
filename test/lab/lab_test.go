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
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"
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

type pod struct {
	ns string
	ip netip.Addr
}

// TestLegacyVMReachesPods: the point of vpcni. A VM outside the cluster
// reaches pods on two nodes by their own IPs and they reach it; pods reach
// each other across nodes; port security is real — a pod's address works
// only while it is on its node's VM port.
func TestLegacyVMReachesPods(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnil%d", os.Getpid()%100000), Nodes: 2, Subnet: netip.MustParsePrefix("10.90.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	runDir := t.TempDir()
	var pods []pod
	for i, node := range l.Nodes {
		cfg := config.Defaults()
		cfg.NodeName = node.Name
		cfg.SocketPath = filepath.Join(runDir, node.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(runDir, node.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Pool = config.Pool{WarmTarget: 2, BatchSize: 2, MaxFree: 4}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		agent, err := testbed.StartAgentIn(runDir, node.NS, binDir, cfg)
		if err != nil {
			t.Fatalf("vpcnid on %s: %v", node.Name, err)
		}
		t.Cleanup(func() { _ = agent.Stop() })
		cni, err := testbed.NewCNIIn(node.NS, []string{binDir}, filepath.Join(runDir, node.Name, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-lab", cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		ns := fmt.Sprintf("%s-pod%d", l.Prefix, i)
		if err := netnsutil.Add(ns); err != nil {
			t.Fatal(err)
		}
		res, err := cni.Add(c, testbed.Runtime(fmt.Sprintf("lab-%d", i), netnsutil.Path(ns), "eth0", nil))
		if err != nil {
			t.Fatalf("ADD on %s: %v", node.Name, err)
		}
		r, _ := types100.GetResult(res)
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		pods = append(pods, pod{ns: netnsutil.Path(ns), ip: ip})
		srv, err := netnsutil.ServeEcho(netnsutil.Path(ns), testbed.HostPort(ip, 7777))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
	}
	legacy := netnsutil.Path(l.Legacy.NS)
	srv, err := netnsutil.ServeEcho(legacy, testbed.HostPort(l.Legacy.IP, 7777))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	probe := func(from string, to netip.Addr) error {
		pc, pcancel := context.WithTimeout(c, 2*time.Second)
		defer pcancel()
		return netnsutil.Probe(pc, from, testbed.HostPort(to, 7777))
	}
	for _, p := range pods {
		if err := probe(legacy, p.ip); err != nil {
			t.Errorf("legacy VM -> pod %s: %v", p.ip, err)
		}
		if err := probe(p.ns, l.Legacy.IP); err != nil {
			t.Errorf("pod %s -> legacy VM: %v", p.ip, err)
		}
	}
	if err := probe(pods[0].ns, pods[1].ip); err != nil {
		t.Errorf("pod on n1 -> pod on n2: %v", err)
	}
	if err := probe(pods[1].ns, pods[0].ip); err != nil {
		t.Errorf("pod on n2 -> pod on n1: %v", err)
	}
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
	pc, pcancel := context.WithTimeout(c, 3*time.Second)
	if err := netnsutil.Probe(pc, pods[0].ns, svc+":80"); err != nil {
		t.Errorf("pod on n1 -> Service %s -> pod on n2 (%s): %v", svc, pods[1].ip, err)
	}
	pcancel()

	// A floating IP for pod 0: the external host reaches the pod through it,
	// and the pod reaches the external host (SNAT to the floating IP).
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	fip, err := floatingips.Create(c, nc, floatingips.CreateOpts{FloatingNetworkID: l.ExtNetID, PortID: l.Nodes[0].PortID, FixedIP: pods[0].ip.String()}).Extract()
	if err != nil {
		t.Fatalf("floating IP for %s: %v", pods[0].ip, err)
	}
	external := netnsutil.Path(l.External.NS)
	if err := probe(external, netip.MustParseAddr(fip.FloatingIP)); err != nil {
		t.Errorf("external -> floating IP %s -> pod %s: %v", fip.FloatingIP, pods[0].ip, err)
	}
	extSrv, err := netnsutil.ServeEcho(external, testbed.HostPort(l.External.IP, 7777))
	if err != nil {
		t.Fatal(err)
	}
	defer extSrv.Close()
	if err := probe(pods[0].ns, l.External.IP); err != nil {
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
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip, false)
	if err := probe(legacy, pods[0].ip); err == nil {
		t.Fatalf("legacy VM still reaches %s with the address off the VM port: port security is not enforced", pods[0].ip)
	}
	setOnPort(t, l, l.Nodes[0].PortID, pods[0].ip, true)
	if err := probe(legacy, pods[0].ip); err != nil {
		t.Fatalf("legacy VM -> %s after the address is back on the port: %v", pods[0].ip, err)
	}
}

// setOnPort adds or removes an address on a port as a person would.
func setOnPort(t *testing.T, l *lab.Lab, portID string, ip netip.Addr, on bool) {
	t.Helper()
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 10 {
		p, err := ports.Get(c, nc, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		fixed := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.IPAddress == ip.String() })
		if on {
			fixed = append(fixed, ports.IP{SubnetID: l.SubnetID, IPAddress: ip.String()})
		}
		rev := p.RevisionNumber
		_, err = ports.Update(c, nc, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if err == nil {
			return
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Fatal(err)
		}
	}
	t.Fatal("could not update the port")
}
