// Package labagents is the lab's end-to-end test against the real thing:
// Debian's neutron-server with its linuxbridge and L3 agents
// (scripts/neutron.sh, MODE=agents). Simulated VMs are namespaces plugged
// into the agent's brq bridge through tap devices, as Nova would plug them;
// the router is a real qrouter- namespace; port security is the agent's
// iptables and ebtables rules. Two VMs are cluster nodes running vpcnid
// (openstack provider) with pods added by the real plugin through libcni;
// a third is a legacy VM outside the cluster.
package labagents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/testbed"
)

const (
	neutronAddr = "127.0.0.1:19697" // scripts/neutron.sh MODE=agents
	endpoint    = "http://" + neutronAddr + "/"
	prefix      = "vpcni-lagt" // every namespace and Neutron object of this test
	subnetCIDR  = "10.91.0.0/24"
	// subnet2CIDR is a second subnet of the tenant network, on the router
	// too: a node there is served by the same config as one in the first.
	subnet2CIDR = "10.91.2.0/24"
	// The external network's wire, made by scripts/neutron-agents.sh: the
	// agents' physical network, whose far end (namespace extNS, extGW) is
	// the upstream router floating IPs are reached from.
	physnet  = "provider"
	extNS    = "vpcni-nagt-ext"
	extCIDR  = "203.0.113.0/24"
	echoPort = 7777
)

var (
	extGW  = netip.MustParseAddr("203.0.113.1")
	binDir string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the real-Neutron agents e2e tests")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	started := false
	if neutron("status").Run() != nil {
		up := neutron("up")
		up.Stdout, up.Stderr = os.Stdout, os.Stderr
		if err := up.Run(); err != nil {
			fmt.Println("vpcni-test: could not start neutron with its agents:", err)
			down := neutron("down")
			down.Stdout, down.Stderr = os.Stdout, os.Stderr
			_ = down.Run()
			os.Exit(1)
		}
		started = true
	}
	code := m.Run()
	if started {
		down := neutron("down")
		down.Stdout, down.Stderr = os.Stdout, os.Stderr
		_ = down.Run()
	}
	os.Exit(code)
}

func neutron(verb string) *exec.Cmd {
	cmd := exec.Command("bash", "../../scripts/neutron.sh", verb)
	cmd.Env = append(os.Environ(), "MODE=agents")
	return cmd
}

type pod struct {
	ns   string // path
	ip   netip.Addr
	node *vm
	rt   string // container ID
	del  func(context.Context) error
}

// TestRealNeutronAgents: legacy VM <-> pods by their own IPs, pod <-> pod
// across nodes, pod -> node, pod -> the router's gateway in its qrouter-
// namespace, a floating IP from the external network, and the agent's real
// port security on a pod address: dropped while it is off the VM port,
// flowing once it is on, dropped again after DEL gave it back.
func TestRealNeutronAgents(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	t0 := time.Now()
	// n2 sits in the network's second subnet.
	nc, w, vms := upWorld(t, c, map[string]netip.Addr{"n1": at(211), "n2": at2(212), "legacy": at(230)})
	n1, n2, legacy := vms["n1"], vms["n2"], vms["legacy"]
	for _, v := range []*vm{n1, n2, legacy} {
		serve(t, netnsutil.Path(v.ns), v.ip)
	}
	// The fabric itself: VM to VM through the brq bridge and the agent's
	// rules, before vpcni is involved.
	for _, v := range []*vm{n1, n2} {
		if d, err := eventually(30*time.Second, func() error { return probe(c, netnsutil.Path(legacy.ns), netip.Addr{}, v.ip) }); err != nil {
			t.Fatalf("legacy VM -> %s (%s) on the plain fabric: %v", v.name, v.ip, err)
		} else {
			t.Logf("vpcni-test: legacy VM -> %s reachable %.1fs after its port was ACTIVE", v.name, d.Seconds())
		}
	}
	t.Logf("vpcni-test: network, router and 3 VMs up in %.1fs", time.Since(t0).Seconds())

	// vpcnid on each node, against the real Neutron through a forwarder on
	// the node's loopback, with one config that names no subnet: each
	// node serves its pods from its own VM port's subnet. The pool holds
	// nothing spare (an address goes back as soon as its pod is deleted)
	// and resync is rare, so the hand edits below are not undone behind
	// the test's back.
	runDir := t.TempDir()
	pods := map[string]*pod{}
	for _, node := range []*vm{n1, n2} {
		fw, err := testbed.Forward(node.ns, neutronAddr, neutronAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fw.Close() })
		cfg := config.Defaults()
		cfg.NodeName = node.ns
		cfg.SocketPath = filepath.Join(runDir, node.name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(runDir, node.name, "state")
		cfg.MetricsAddr = ""
		cfg.Cooldown = config.Duration{}
		cfg.Resync = config.Duration{Duration: 10 * time.Minute}
		cfg.Pool = config.Pool{WarmTarget: 0, BatchSize: 1, MaxFree: 0, AddWait: config.Duration{Duration: 30 * time.Second}}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: endpoint}}
		agent, err := testbed.StartAgentIn(runDir, node.ns, binDir, cfg)
		if err != nil {
			t.Fatalf("vpcnid on %s: %v", node.name, err)
		}
		t.Cleanup(func() { _ = agent.Stop() })
		cni, err := testbed.NewCNIIn(node.ns, []string{binDir}, filepath.Join(runDir, node.name, "cache"), testbed.VpcniConfList("1.0.0", prefix, cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		ns := prefix + "-pod-" + node.name
		if err := netnsutil.Add(ns); err != nil {
			t.Fatal(err)
		}
		p := &pod{ns: netnsutil.Path(ns), node: node, rt: "lagt-" + node.name}
		start := time.Now()
		res, err := cni.Add(c, testbed.Runtime(p.rt, p.ns, "eth0", nil))
		if err != nil {
			t.Fatalf("ADD on %s: %v", node.name, err)
		}
		added := time.Since(start)
		r, err := types100.GetResult(res)
		if err != nil {
			t.Fatal(err)
		}
		p.ip, _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		if _, want, _ := w.subnetOf(node.ip); !want.Contains(p.ip) {
			t.Fatalf("pod on %s (%s) got %s, not an address of its node's subnet %s", node.name, node.ip, p.ip, want)
		}
		serve(t, p.ns, p.ip)
		d, err := eventually(30*time.Second, func() error { return probe(c, netnsutil.Path(legacy.ns), netip.Addr{}, p.ip) })
		if err != nil {
			t.Fatalf("legacy VM -> pod %s on %s: %v", p.ip, node.name, err)
		}
		t.Logf("vpcni-test: pod on %s got %s: ADD %.2fs, legacy VM reaches it %.2fs later", node.name, p.ip, added.Seconds(), d.Seconds())
		pods[node.name] = p
		p.del = func(ctx context.Context) error { return cni.Del(ctx, testbed.Runtime(p.rt, p.ns, "eth0", nil)) }
	}
	p1, p2 := pods["n1"], pods["n2"]
	t.Logf("vpcni-test: one config without subnetID: the pod on n1 (%s) got %s of %s, the pod on n2 (%s) %s of %s", n1.ip, p1.ip, subnetCIDR, n2.ip, p2.ip, subnet2CIDR)
	legacyNS := netnsutil.Path(legacy.ns)

	// The connectivity matrix, each pair given the agent's few seconds.
	gwNS := netnsutil.Path(w.qrouterNS())
	if _, err := eventually(60*time.Second, func() error {
		out, err := netnsutil.Output(w.qrouterNS(), "ip", "-4", "-o", "addr")
		if err == nil && !containsAddr(out, w.gw) {
			err = fmt.Errorf("no %s yet:\n%s", w.gw, out)
		}
		return err
	}); err != nil {
		t.Fatalf("the L3 agent's %s: %v", w.qrouterNS(), err)
	}
	serve(t, gwNS, w.gw)
	checks := []struct {
		what string
		from string
		to   netip.Addr
	}{
		{"pod n1 -> legacy VM", p1.ns, legacy.ip},
		{"pod n2 -> legacy VM", p2.ns, legacy.ip},
		{"pod n1 -> pod n2", p1.ns, p2.ip},
		{"pod n2 -> pod n1", p2.ns, p1.ip},
		{"pod n1 -> node n2", p1.ns, n2.ip},
		{"pod n2 -> node n1", p2.ns, n1.ip},
		{"node n1 -> pod n2", netnsutil.Path(n1.ns), p2.ip},
		{"pod n1 -> router gateway in qrouter-", p1.ns, w.gw},
		{"pod n2 -> router gateway in qrouter-", p2.ns, w.gw},
	}
	for _, ck := range checks {
		if _, err := eventually(20*time.Second, func() error { return probe(c, ck.from, netip.Addr{}, ck.to) }); err != nil {
			t.Errorf("%s (%s): %v", ck.what, ck.to, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// A floating IP on pod n1's address: the upstream router on the
	// external network reaches the pod through the qrouter's DNAT, and the
	// pod reaches upstream through its SNAT.
	// Made as vpcni-controller does (its floating IPs door): created
	// already associated, marked for its pod.
	cloud := &cluster.FloatingIPs{NC: nc, Timeout: 30 * time.Second}
	fip, err := cloud.Ensure(c, floatingip.Want{Owner: prefix + "/p1", Network: w.extNetID, Policy: floatingip.Release, PortID: n1.portID, FixedIP: p1.ip})
	if err != nil {
		t.Fatalf("floating IP for %s: %v", p1.ip, err)
	}
	fipAddr := netip.MustParseAddr(fip.Address)
	serve(t, netnsutil.Path(extNS), extGW)
	if d, err := eventually(30*time.Second, func() error { return probe(c, netnsutil.Path(extNS), netip.Addr{}, fipAddr) }); err != nil {
		t.Errorf("external -> floating IP %s -> pod %s: %v", fipAddr, p1.ip, err)
	} else {
		t.Logf("vpcni-test: external -> floating IP %s -> pod %s works %.1fs after the POST", fipAddr, p1.ip, d.Seconds())
	}
	if _, err := eventually(20*time.Second, func() error { return probe(c, p1.ns, netip.Addr{}, extGW) }); err != nil {
		t.Errorf("pod %s -> external %s through its floating IP: %v", p1.ip, extGW, err)
	}

	// The controller's detach (policy release) on the real L3 agent: the
	// floating address stops reaching the pod, the pod's own address
	// still does.
	if done, err := cloud.Detach(c, prefix+"/p1", nil); err != nil || len(done) != 1 {
		t.Fatalf("detach floating IP %s: %v, %v", fipAddr, done, err)
	}
	if d, err := dropped(func() error { return probe(c, netnsutil.Path(extNS), netip.Addr{}, fipAddr) }); err != nil {
		t.Errorf("external -> floating IP %s after the detach: %v", fipAddr, err)
	} else {
		t.Logf("vpcni-test: floating IP %s detached and deleted: external traffic to it dropped %.1fs after", fipAddr, d.Seconds())
	}
	if err := probe(c, legacyNS, netip.Addr{}, p1.ip); err != nil {
		t.Errorf("legacy VM -> pod %s after its floating IP went: %v", p1.ip, err)
	}

	// Port security on pod n2's address, edited by hand: dropped once it
	// is off n2's VM port, flowing once it is back.
	if err := w.setOnPort(c, n2.portID, p2.ip, false); err != nil {
		t.Fatal(err)
	}
	d, err := dropped(func() error { return probe(c, legacyNS, netip.Addr{}, p2.ip) })
	if err != nil {
		t.Fatalf("legacy VM -> pod %s with its address off the VM port: %v", p2.ip, err)
	}
	t.Logf("vpcni-test: port security: pod %s dropped %.2fs after its address left the VM port", p2.ip, d.Seconds())
	if err := w.setOnPort(c, n2.portID, p2.ip, true); err != nil {
		t.Fatal(err)
	}
	d, err = eventually(20*time.Second, func() error { return probe(c, legacyNS, netip.Addr{}, p2.ip) })
	if err != nil {
		t.Fatalf("legacy VM -> pod %s after its address is back on the VM port: %v", p2.ip, err)
	}
	t.Logf("vpcni-test: port security: pod %s allowed %.2fs after its address came back on the VM port", p2.ip, d.Seconds())

	// DEL: vpcnid gives the address back to Neutron, and the agent drops
	// it again — shown by a squatter on node n2 that takes the address.
	if err := p2.del(c); err != nil {
		t.Fatalf("DEL of pod %s: %v", p2.ip, err)
	}
	d, err = eventually(30*time.Second, func() error {
		on, err := w.onPort(c, n2.portID, p2.ip)
		if err == nil && on {
			err = fmt.Errorf("%s is still on the port", p2.ip)
		}
		return err
	})
	if err != nil {
		t.Fatalf("after DEL, vpcnid did not give %s back: %v", p2.ip, err)
	}
	t.Logf("vpcni-test: DEL: %s off the VM port %.2fs after DEL", p2.ip, d.Seconds())
	if err := netnsutil.Exec(n2.ns, "ip", "addr", "add", p2.ip.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	squat := func() error { return probe(c, netnsutil.Path(n2.ns), p2.ip, legacy.ip) }
	if d, err = dropped(squat); err != nil {
		t.Fatalf("after DEL, from %s on node n2: %v", p2.ip, err)
	}
	t.Logf("vpcni-test: DEL: traffic from %s dropped (%.2fs after the squatter took it)", p2.ip, d.Seconds())
	// Control: the same squatter flows once the address is on the port.
	if err := w.setOnPort(c, n2.portID, p2.ip, true); err != nil {
		t.Fatal(err)
	}
	if d, err = eventually(20*time.Second, squat); err != nil {
		t.Fatalf("control: %s on node n2 with the address on the VM port: %v", p2.ip, err)
	}
	t.Logf("vpcni-test: control: %s from node n2 allowed %.2fs after it was put on the port by hand", p2.ip, d.Seconds())
	if err := w.setOnPort(c, n2.portID, p2.ip, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("vpcni-test: whole e2e %.1fs", time.Since(t0).Seconds())
}

// upWorld clears what an earlier run left, builds the world and plugs a
// VM per name (its address, in either subnet), each port ACTIVE before it
// returns; the world is swept again when the test ends.
func upWorld(t *testing.T, c context.Context, vms map[string]netip.Addr) (*gophercloud.ServiceClient, *world, map[string]*vm) {
	t.Helper()
	nc := openstack.NoAuthClient(endpoint, http.Client{Timeout: 30 * time.Second})
	if err := sweep(c, nc); err != nil {
		t.Fatalf("clearing an earlier run: %v", err)
	}
	t.Cleanup(func() {
		sc, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer scancel()
		if err := sweep(sc, nc); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	w, err := build(c, nc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*vm{}
	for name, ip := range vms {
		if out[name], err = w.plug(c, name, ip); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range out {
		ac, acancel := context.WithTimeout(c, time.Minute)
		err := w.waitActive(ac, v)
		acancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return nc, w, out
}

// serve runs an echo server on ip inside the namespace at path until the
// test ends.
func serve(t *testing.T, path string, ip netip.Addr) {
	t.Helper()
	srv, err := netnsutil.ServeEcho(path, netip.AddrPortFrom(ip, echoPort).String())
	if err != nil {
		t.Fatalf("echo server on %s in %s: %v", ip, path, err)
	}
	t.Cleanup(func() { srv.Close() })
}

// probe connects from the namespace at path (from src when it is valid)
// to the echo server on to and checks a line comes back, within a second.
func probe(ctx context.Context, path string, src, to netip.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return netnsutil.ProbeFrom(ctx, path, src, netip.AddrPortFrom(to, echoPort).String())
}

// dropped waits until probe times out — the agent dropped the traffic; a
// refusal or any other answer is not a drop — and then times out twice
// more, and says how long the first drop took to come.
func dropped(probe func() error) (time.Duration, error) {
	isDrop := func(err error) bool {
		var ne net.Error
		return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	}
	d, err := eventually(20*time.Second, func() error {
		if err := probe(); !isDrop(err) {
			return fmt.Errorf("not dropped: the probe ended with %v", err)
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("port security is not enforced: %w", err)
	}
	for range 2 {
		if err := probe(); !isDrop(err) {
			return d, fmt.Errorf("dropped once, then not: the probe ended with %v", err)
		}
	}
	return d, nil
}

// eventually calls f until it succeeds or d has passed, and says how long
// that took.
func eventually(d time.Duration, f func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > d {
			return time.Since(start), err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// containsAddr says whether `ip -o addr` output lists address a.
func containsAddr(ipAddrOutput string, a netip.Addr) bool {
	for _, f := range strings.Fields(ipAddrOutput) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr() == a {
			return true
		}
	}
	return false
}
