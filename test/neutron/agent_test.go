package neutron

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/faultproxy"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// forward serves 127.0.0.1:19696 inside a namespace, spliced to the real
// neutron-server.
func forward(t *testing.T, ns string) {
	t.Helper()
	l, err := testbed.Forward(ns, "127.0.0.1:19696", "127.0.0.1:19696")
	if err != nil {
		t.Fatalf("forwarder in %s: %v", ns, err)
	}
	t.Cleanup(func() { l.Close() })
}

var binDir string

func bin(t *testing.T) string {
	t.Helper()
	if binDir != "" {
		return binDir
	}
	if d := os.Getenv("VPCNI_BIN"); d != "" {
		binDir = d
		return d
	}
	t.Fatal("VPCNI_BIN must name the directory with the built vpcni, vpcnid (make integration sets it)")
	return ""
}

// TestAgentAgainstNeutron: vpcnid with the openstack provider on a node
// whose VM port lives in the real Neutron. ADD puts the pod's address on
// the VM port, DEL takes it off; an agent killed in the middle of a burst
// of ADDs leaks nothing and doubles nothing.
func TestAgentAgainstNeutron(t *testing.T) {
	binDir := bin(t)
	sn := realNeutron{}.NewSubnet(t, "10.78.0.0/24", 150) // pool .2-.151
	node := realNeutron{}.NewNode(t, sn, netip.MustParseAddr("10.78.0.10"))
	nbr := realNeutron{}.NewNode(t, sn, netip.MustParseAddr("10.78.0.20"))
	_ = nbr

	tb := testbed.New(fmt.Sprintf("vpcnin%d", os.Getpid()%100000), netip.MustParsePrefix("10.78.0.0/24"))
	if err := tb.Up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Down() })
	forward(t, tb.NodeNS())

	dir := t.TempDir()
	cfg := tb.AgentConfig(dir, "10.78.0.0/24")
	cfg.Cooldown.Duration = 0
	cfg.Pool = config.Pool{WarmTarget: 0, BatchSize: 4, MaxFree: 0} // surplus back at once
	cfg.Resync.Duration = time.Second
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: "http://127.0.0.1:19696/", SubnetID: sn.ID}}
	agent, err := tb.StartAgent(binDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			log, _ := os.ReadFile(agent.LogPath)
			t.Logf("vpcnid log:\n%s", log)
		}
	}()
	cni, err := tb.NewCNI([]string{binDir}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-os", cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	podIPs := func() []netip.Addr {
		return slices.DeleteFunc(node.PortIPs(t), func(a netip.Addr) bool { return a.String() == "10.78.0.10" })
	}

	// ADD: the pod's address appears on the VM port; the neighbour reaches it.
	p0, _ := tb.AddPod(0)
	res, err := cni.Add(c, testbed.Runtime("os-0", p0, "eth0", nil))
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	ip := ipOf(t, res)
	if !slices.Contains(podIPs(), ip) {
		t.Fatalf("VM port holds %v, not the pod's %s", podIPs(), ip)
	}
	// The empty pool asked for a whole batch; with maxFree 0 the rest
	// goes back, and the port holds just the pod's address.
	waitFor(t, 30*time.Second, "the surplus to leave the VM port", func() bool { return slices.Equal(podIPs(), []netip.Addr{ip}) })
	srv, err := netnsutil.ServeEcho(p0, testbed.HostPort(ip, 7777))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pctx, pcancel := context.WithTimeout(c, 3*time.Second)
	if err := netnsutil.Probe(pctx, netnsutil.Path(tb.NbrNS()), testbed.HostPort(ip, 7777)); err != nil {
		t.Errorf("neighbour cannot reach the pod at %s: %v", ip, err)
	}
	pcancel()

	// Someone takes the running pod's address off the VM port by hand: the
	// agent's periodic resync asks Neutron for it again.
	removeByHand(t, podPortID(t, "10.78.0.10", sn.ID), ip)
	waitFor(t, 30*time.Second, "the resync to put the pod's address back", func() bool { return slices.Contains(podIPs(), ip) })

	// DEL: the address leaves the VM port.
	if err := cni.Del(c, testbed.Runtime("os-0", p0, "eth0", nil)); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	waitFor(t, 30*time.Second, "the address to leave the VM port", func() bool { return len(podIPs()) == 0 })

	// A burst of ADDs with the agent killed in the middle.
	const n = 6
	paths := make([]string, n)
	for i := range n {
		paths[i], _ = tb.AddPod(10 + i)
	}
	var wg sync.WaitGroup
	var done atomic.Int32
	burstErrs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, burstErrs[i] = cni.Add(c, testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil))
			done.Add(1)
		})
	}
	// The kill lands once the first ADDs are served from the pool, while
	// the rest wait on a Neutron PUT (0.4-0.9 s here), or at 700 ms: a
	// fixed sleep alone was seen to land after a fast PUT had served all.
	for start := time.Now(); done.Load() == 0 && time.Since(start) < 700*time.Millisecond; {
		time.Sleep(5 * time.Millisecond)
	}
	if err := agent.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	cut := 0
	for _, err := range burstErrs {
		if err != nil {
			cut++
		}
	}
	if cut == 0 {
		t.Fatalf("the kill landed after every ADD had finished: the test proves nothing; kill sooner")
	}
	t.Logf("vpcni-test: the kill cut %d of %d ADDs short", cut, n)
	if agent, err = tb.Restart(binDir, agent); err != nil {
		t.Fatal(err)
	}
	// The runtime retries the ADDs that failed.
	for i := range n {
		if _, err := cni.Add(c, testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil)); err != nil {
			t.Fatalf("ADD %d after the restart: %v", i, err)
		}
	}
	checkInvariant(t, agent, podIPs, n)

	for i := range n {
		if err := cni.Del(c, testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil)); err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
	}
	waitFor(t, 60*time.Second, "every pod address to leave the VM port", func() bool { return len(podIPs()) == 0 })
	checkInvariant(t, agent, podIPs, 0)
}

// checkInvariant: the addresses vpcni holds on the VM port are exactly the
// agent's free ∪ cooling ∪ allocated, and no address serves two pods.
func checkInvariant(t *testing.T, a *testbed.Agent, onPort func() []netip.Addr, wantAllocated int) {
	t.Helper()
	var st *api.State
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err = a.State()
		port := onPort()
		if err == nil && st.Ready && len(st.Pool.Addresses["allocated"]) == wantAllocated && len(port) == st.Pool.Free+st.Pool.Cooling+st.Pool.Allocated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not settle: state err %v, ready %v (%s), pool %+v, VM port %v", err, st.Ready, st.Reason, st.Pool, port)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var pool []netip.Addr
	for _, list := range st.Pool.Addresses {
		for _, s := range list {
			pool = append(pool, netip.MustParseAddr(s))
		}
	}
	slices.SortFunc(pool, netip.Addr.Compare)
	port := onPort()
	slices.SortFunc(port, netip.Addr.Compare)
	if !slices.Equal(pool, port) {
		t.Fatalf("VM port holds %v; agent's pool %v", port, st.Pool.Addresses)
	}
	seen := map[string]string{}
	for _, al := range st.Allocations {
		if other, dup := seen[al.Address.String()]; dup {
			t.Fatalf("%s is given to %s and %s", al.Address, other, al.ContainerID)
		}
		seen[al.Address.String()] = al.ContainerID
	}
	if len(st.Allocations) != wantAllocated {
		t.Fatalf("%d allocations, want %d", len(st.Allocations), wantAllocated)
	}
}

func ipOf(t *testing.T, res types.Result) netip.Addr {
	r, err := types100.GetResult(res)
	if err != nil || len(r.IPs) != 1 {
		t.Fatalf("result %v: %v", res, err)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	return ip
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAgentWithoutNeutron: an agent whose Neutron cannot be reached stays
// up, says why in STATUS (50) and answers ADD with "try again later" (11);
// once Neutron answers it becomes ready by itself and serves pods.
func TestAgentWithoutNeutron(t *testing.T) {
	binDir := bin(t)
	sn := realNeutron{}.NewSubnet(t, "10.78.0.0/24", 150)
	realNeutron{}.NewNode(t, sn, netip.MustParseAddr("10.78.0.10"))
	tb := testbed.New(fmt.Sprintf("vpcniu%d", os.Getpid()%100000), netip.MustParsePrefix("10.78.0.0/24"))
	if err := tb.Up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Down() })
	dir := t.TempDir()
	cfg := tb.AgentConfig(dir, "10.78.0.0/24")
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: "http://127.0.0.1:19696/", SubnetID: sn.ID, Timeout: config.Duration{Duration: 2 * time.Second}, Retries: 2}}
	// No forwarder yet: inside the node, nothing listens on 19696.
	agent, err := tb.StartAgent(binDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cni, err := tb.NewCNI([]string{binDir}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.1.0", "vpcni-os", cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err = cni.Status(c)
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != 50 || !strings.Contains(err.Error(), "provider openstack") {
		t.Fatalf("STATUS with Neutron unreachable: %v, want code 50 naming the provider", err)
	}
	p0, _ := tb.AddPod(0)
	_, err = cni.Add(c, testbed.Runtime("early", p0, "eth0", nil))
	if !errors.As(err, &cniErr) || cniErr.Code != 11 {
		t.Fatalf("ADD with Neutron unreachable: %v, want code 11", err)
	}
	t.Logf("vpcni-test: while Neutron is unreachable STATUS says: %v", cniErr.Msg)

	forward(t, tb.NodeNS())
	waitFor(t, 60*time.Second, "the agent to become ready once Neutron answers", func() bool { return cni.Status(c) == nil })
	if _, err := cni.Add(c, testbed.Runtime("early", p0, "eth0", nil)); err != nil {
		t.Fatalf("ADD after Neutron came back: %v", err)
	}
	if st, err := agent.State(); err != nil || len(st.Allocations) != 1 {
		t.Fatalf("state after recovery: %+v, %v", st, err)
	}
}

func podPortID(t *testing.T, nodeIP, subnetID string) string {
	pages, err := ports.List(nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: nodeIP, SubnetID: subnetID}}}).AllPages(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	all, _ := ports.ExtractPorts(pages)
	if len(all) != 1 {
		t.Fatalf("%d ports with %s", len(all), nodeIP)
	}
	return all[0].ID
}

// removeByHand takes an address off a port as a person would (If-Match).
func removeByHand(t *testing.T, portID string, ip netip.Addr) {
	for range 30 {
		p, err := ports.Get(ctx(t), nc, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		fixed := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.IPAddress == ip.String() })
		rev := p.RevisionNumber
		_, err = ports.Update(ctx(t), nc, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("could not remove %s by hand", ip)
}

// TestDegradedMode: with every Neutron call failing (503 through the fault
// proxy) the agent serves ADDs from its pool, gives nothing back, says
// "degraded" in its state and metrics, and recovers by itself.
func TestDegradedMode(t *testing.T) {
	binDir := bin(t)
	sn := realNeutron{}.NewSubnet(t, "10.78.0.0/24", 150)
	node := realNeutron{}.NewNode(t, sn, netip.MustParseAddr("10.78.0.10"))
	proxy, err := faultproxy.New("http://127.0.0.1:19696", 1)
	if err != nil {
		t.Fatal(err)
	}
	paddr, err := proxy.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	tb := testbed.New(fmt.Sprintf("vpcnid%d", os.Getpid()%100000), netip.MustParsePrefix("10.78.0.0/24"))
	if err := tb.Up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Down() })
	fwd, err := testbed.Forward(tb.NodeNS(), "127.0.0.1:19696", paddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	dir := t.TempDir()
	cfg := tb.AgentConfig(dir, "10.78.0.0/24")
	cfg.Cooldown.Duration = 0
	cfg.Pool = config.Pool{WarmTarget: 4, BatchSize: 4, MaxFree: 4}
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: "http://127.0.0.1:19696/", SubnetID: sn.ID,
		Timeout: config.Duration{Duration: 2 * time.Second}, Retries: 2}}
	agent, err := tb.StartAgent(binDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cni, err := tb.NewCNI([]string{binDir}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.1.0", "vpcni-deg", cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitFor(t, 30*time.Second, "a warm pool", func() bool { st, err := agent.State(); return err == nil && st.Pool.Free >= 4 })

	// Two pods while Neutron is healthy; the pool refills behind them
	// (4 free + 2 allocated held).
	var ips []netip.Addr
	for i := range 2 {
		p, _ := tb.AddPod(i)
		res, err := cni.Add(c, testbed.Runtime(fmt.Sprintf("deg-%d", i), p, "eth0", nil))
		if err != nil {
			t.Fatal(err)
		}
		ips = append(ips, ipOf(t, res))
	}
	waitFor(t, 30*time.Second, "the refill", func() bool { st, err := agent.State(); return err == nil && st.Pool.Free >= 4 })

	// Neutron fails. A third pod comes from the pool; its refill fails.
	proxy.SetFaults(faultproxy.Faults{ServerError: 1})
	p2, _ := tb.AddPod(2)
	if _, err := cni.Add(c, testbed.Runtime("deg-2", p2, "eth0", nil)); err != nil {
		t.Fatalf("ADD from the pool while Neutron fails: %v", err)
	}
	waitFor(t, 30*time.Second, "the agent to say it is degraded", func() bool {
		st, err := agent.State()
		return err == nil && st.Degraded && st.Ready && strings.Contains(st.Reason, "degraded")
	})
	if err := cni.Status(c); err != nil {
		t.Errorf("STATUS while degraded with free addresses: %v, want ready", err)
	}
	// DELs while degraded: free rises above maxFree, yet nothing goes back.
	for i := range 3 {
		if err := cni.Del(c, testbed.Runtime(fmt.Sprintf("deg-%d", i), tb.PodNS(i), "eth0", nil)); err != nil {
			t.Fatalf("DEL while degraded: %v", err)
		}
	}
	st, err := agent.State()
	if err != nil || st.Pool.Free <= cfg.Pool.MaxFree {
		t.Fatalf("test setup: free %d should exceed maxFree %d (%v)", st.Pool.Free, cfg.Pool.MaxFree, err)
	}
	held := len(podOnly(node.PortIPs(t)))
	time.Sleep(2 * time.Second) // several Run loops: none may release
	if now := len(podOnly(node.PortIPs(t))); now != held {
		t.Fatalf("the VM port went from %d to %d pod addresses while degraded: releases must stop", held, now)
	}
	for _, ip := range ips {
		if !slices.Contains(node.PortIPs(t), ip) {
			t.Fatalf("%s left the VM port while degraded", ip)
		}
	}
	if counts := proxy.Counts(); counts["server_error"] == 0 {
		t.Fatalf("no fault was injected: %v", counts)
	}

	// Neutron is back: the agent recovers by itself and the surplus goes.
	proxy.SetFaults(faultproxy.Faults{})
	waitFor(t, 60*time.Second, "recovery", func() bool { st, err := agent.State(); return err == nil && !st.Degraded && st.Ready })
	waitFor(t, 60*time.Second, "the surplus to go back", func() bool { return len(podOnly(node.PortIPs(t))) <= cfg.Pool.MaxFree })
}

// podOnly drops the node's own address.
func podOnly(ips []netip.Addr) []netip.Addr {
	return slices.DeleteFunc(ips, func(a netip.Addr) bool { return a.String() == "10.78.0.10" })
}
