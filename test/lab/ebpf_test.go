package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bpf "github.com/cilium/ebpf"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/ebpf"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// bpffsDir is the tests' own BPF filesystem (bedtest.BPFFSDir).
const bpffsDir = bedtest.BPFFSDir

func mountBPFFS(t *testing.T) { bedtest.MountBPFFS(t) }

// TestEBPFLab: two nodes in datapath mode ebpf. Pods reach each other on
// one node and across nodes, the nodes and the legacy VM reach them and
// back (the lab's port security passes the pods' frames: they leave with
// the node port's MAC); the fast path carries the pods' TCP past the
// nodes' stacks (a FORWARD rule counting it stays at 0, the programs'
// counters rise); a Service DNATed to a pod on the other node, and a
// hostPort DNATed on a node, still work (their replies are NATed
// connections the programs hand to the stack). The agent's restart drops
// no connection and leaves no program behind; a program taken off comes
// back; a node whose programs cannot load (no BTF) falls back to the plain
// routed path, with nothing of the fast path left attached, and says so.
func TestEBPFLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mountBPFFS(t)
	l := labUp(t, c, "eb", 2, "10.89.0.0/24")
	pins := filepath.Join(bpffsDir, l.Prefix)
	t.Cleanup(func() { _ = os.RemoveAll(pins) })
	const svcCIDR = "10.96.0.0/12"
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		cfg.Datapath = config.Datapath{Mode: ebpf.Mode, Settings: &ebpf.Settings{
			Settings: svcpath.Settings{ServiceCIDRs: []string{svcCIDR}},
			PinPath:  filepath.Join(pins, cfg.NodeName),
			Require:  true,
		}}
		cfg.MetricsAddr = "127.0.0.1:9695" // in each node's namespace
	})
	a := addPod(t, c, l, nodes[0], "a")
	b := addPod(t, c, l, nodes[0], "b")
	pc := addPod(t, c, l, nodes[1], "c")
	legacy := netnsutil.Path(l.Legacy.NS)
	n1 := netnsutil.Path(l.Nodes[0].NS)
	serveEcho(t, legacy, l.Legacy.IP)
	serveEcho(t, n1, l.Nodes[0].IP)

	// The stack's FORWARD chain on both nodes counts pod a <-> pod c TCP:
	// the fast path must leave it at zero. A first exchange before the
	// count: the fast path hands a packet to the stack while the node has
	// no neighbour entry for its next hop (the stack resolves it).
	expectReach(t, c, []reachable{{"pod a (n1) -> pod c (n2), before counting", a.ns, pc.ip}})
	for _, ns := range []string{l.Nodes[0].NS, l.Nodes[1].NS} {
		for _, rule := range [][]string{{"-s", a.ip.String(), "-d", pc.ip.String()}, {"-s", pc.ip.String(), "-d", a.ip.String()}} {
			if err := netnsutil.Exec(ns, append(append([]string{"iptables", "-I", "FORWARD"}, rule...), "-p", "tcp")...); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := [2]map[string]uint64{stats(t, pins, "n1"), stats(t, pins, "n2")}
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
	after := [2]map[string]uint64{stats(t, pins, "n1"), stats(t, pins, "n2")}
	for i, name := range []string{"n1", "n2"} {
		for _, action := range []string{"peer_from_uplink", "neigh_out"} {
			if after[i][action] <= before[i][action] {
				t.Errorf("%s: the fast path's %s counter did not rise (%d -> %d): pod traffic took the stack (counters %v)", name, action, before[i][action], after[i][action], after[i])
			}
		}
	}
	if after[0]["peer_local"] <= before[0]["peer_local"] {
		t.Errorf("n1: pod a <-> pod b did not go pod to pod (peer_local %d -> %d)", before[0]["peer_local"], after[0]["peer_local"])
	}
	for _, ns := range []string{l.Nodes[0].NS, l.Nodes[1].NS} {
		if n := forwardCount(t, ns, a.ip.String()); n != 0 {
			t.Errorf("%s: %d packets of pod a <-> pod c passed the stack's FORWARD chain: the fast path was not taken", ns, n)
		}
	}

	// A Service: kube-proxy-style DNAT in n1 to pod c on n2. Pod a's packet
	// to it passes n1's stack (a Service CIDR); pod c's reply reaches n1's
	// uplink for pod a, belongs to a NATed connection, and must pass the
	// stack too to come back from the Service's address.
	const svc = "10.96.0.10"
	if err := netnsutil.Exec(l.Nodes[0].NS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", testbed.HostPort(pc.ip, 7777)); err != nil {
		t.Fatal(err)
	}
	// A hostPort: n1:8080 DNATed to pod a, as the portmap plugin does; pod
	// a's reply to the legacy VM must be un-DNATed by n1's stack.
	if err := netnsutil.Exec(l.Nodes[0].NS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", l.Nodes[0].IP.String(), "-p", "tcp", "--dport", "8080",
		"-j", "DNAT", "--to-destination", testbed.HostPort(a.ip, 7777)); err != nil {
		t.Fatal(err)
	}
	before[0] = stats(t, pins, "n1")
	if err := probe(c, a.ns, svc+":80"); err != nil {
		t.Errorf("pod a (n1) -> Service %s -> pod c (n2): %v", svc, err)
	}
	if err := probe(c, legacy, l.Nodes[0].IP.String()+":8080"); err != nil {
		t.Errorf("legacy VM -> hostPort n1:8080 -> pod a: %v", err)
	}
	after[0] = stats(t, pins, "n1")
	for _, action := range []string{"pass_service", "pass_nat"} {
		if after[0][action] <= before[0][action] {
			t.Errorf("n1: %s did not rise (%d -> %d)", action, before[0][action], after[0][action])
		}
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
	if st, err := nodes[0].agent.State(); err != nil {
		t.Error(err)
	} else if st.FastPath != "on" {
		t.Errorf("n1's state: fastPath %q, want on", st.FastPath)
	}
	scrape := metricsOf(t, n1)
	if !strings.Contains(scrape, `vpcni_datapath_fastpath_active{mode="ebpf"} 1`) || !regexp.MustCompile(`vpcni_datapath_fastpath_packets_total\{action="neigh_out",mode="ebpf"\} [1-9]`).MatchString(scrape) {
		t.Errorf("n1's metrics lack the fast path:\n%s", grepLines(scrape, "fastpath"))
	}

	// Agents (re)started in a subtest run until the whole test ends.
	outer := t
	// Restart n2's agent under traffic: one TCP connection from the legacy
	// VM to pod c echoes a line every 5 ms throughout. A packet lost on
	// the way would cost at least TCP's minimum retransmission timeout
	// (200 ms) on one echo: the slowest echo stays far below it. The pods
	// map is the pinned one, and the programs that use it are the new
	// agent's two, the old ones gone.
	t.Run("restart", func(t *testing.T) {
		pinnedPods := filepath.Join(pins, "n2", "pods")
		mapBefore := pinnedMapID(t, pinnedPods)
		if got := programsUsing(t, mapBefore); len(got) != 2 {
			t.Fatalf("programs using n2's pods map before the restart: %v, want vpcni_uplink and vpcni_pod", got)
		}
		conn := dialIn(t, legacy, testbed.HostPort(pc.ip, 7777))
		defer conn.Close()
		var slowest time.Duration
		var echoes int
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			r := bufio.NewReader(conn)
			for {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				t0 := time.Now()
				_ = conn.SetDeadline(t0.Add(3 * time.Second))
				if _, err := fmt.Fprintf(conn, "echo %d\n", echoes); err != nil {
					done <- err
					return
				}
				if _, err := r.ReadString('\n'); err != nil {
					done <- err
					return
				}
				slowest = max(slowest, time.Since(t0))
				echoes++
				time.Sleep(5 * time.Millisecond)
			}
		}()
		time.Sleep(200 * time.Millisecond)
		nodes[1].restart(outer)
		if err := nodes[1].agent.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		if err := <-done; err != nil {
			t.Fatalf("the connection to pod c broke across the restart: %v", err)
		}
		t.Logf("vpcni-test: %d echoes to pod c across n2's agent restart, slowest %s", echoes, slowest)
		if echoes < 20 || slowest >= 150*time.Millisecond {
			t.Errorf("%d echoes, slowest %s: a packet was lost or held across the restart (TCP retransmits after >= 200 ms)", echoes, slowest)
		}
		if got := pinnedMapID(t, pinnedPods); got != mapBefore {
			t.Errorf("the restarted agent made a new pods map (id %d, was %d): the pinned one was not reused", got, mapBefore)
		}
		eventually(t, 10*time.Second, "only the new agent's programs using n2's pods map", func() error {
			if got := programsUsing(t, mapBefore); len(got) != 2 {
				return fmt.Errorf("programs using it: %v", got)
			}
			return nil
		})
		expectReach(t, c, []reachable{{"legacy VM -> pod c", legacy, pc.ip}, {"pod a -> pod c", a.ns, pc.ip}})
	})

	// Take the programs off pod c's veth and n2's uplink: the agent's
	// reconcile puts them back.
	t.Run("reattach", func(t *testing.T) {
		hostIf := hostVeth(t, l.Nodes[1].NS, pc.ip.String())
		for _, dev := range []string{hostIf, "eth0"} {
			if err := netnsutil.Exec(l.Nodes[1].NS, "tc", "filter", "del", "dev", dev, "ingress"); err != nil {
				t.Fatal(err)
			}
		}
		for _, dev := range []string{hostIf, "eth0"} {
			// Within seconds: the kernel watch sees the deletion (the
			// timer alone would take selfHeal.period, 30 s).
			eventually(t, 5*time.Second, "the program back on "+dev, func() error {
				out, err := netnsutil.Output(l.Nodes[1].NS, "tc", "filter", "show", "dev", dev, "ingress")
				if err != nil || !strings.Contains(out, "vpcni_") {
					return fmt.Errorf("tc filter show dev %s ingress: %q %v", dev, out, err)
				}
				return nil
			})
		}
	})

	// Deleting a pod takes it out of the pods map.
	t.Run("delete", func(t *testing.T) {
		if err := nodes[0].cni.Del(c, testbed.Runtime(b.id, b.ns, "eth0", nil)); err != nil {
			t.Fatal(err)
		}
		m, err := bpf.LoadPinnedMap(filepath.Join(pins, "n1", "pods"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		var v [16]byte
		if err := m.Lookup(b.ip.As4(), &v); !errors.Is(err, bpf.ErrKeyNotExist) {
			t.Errorf("pod b's address %s is still in n1's pods map after DEL (%v)", b.ip, err)
		}
	})

	// n1 without BTF: the agent falls back, takes every program off, says
	// why, and pods still reach each other through the stack.
	t.Run("fallback", func(t *testing.T) {
		if err := nodes[0].agent.Stop(); err != nil {
			t.Fatal(err)
		}
		s := nodes[0].cfg.Datapath.Settings.(*ebpf.Settings)
		s.Require = false
		s.KernelBTF = "/nonexistent/vmlinux"
		nodes[0].start(outer)
		if err := nodes[0].agent.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		log, _ := os.ReadFile(nodes[0].agent.LogPath)
		if !strings.Contains(string(log), "ebpf fast path unavailable: falling back") {
			t.Errorf("n1's agent did not log its fallback:\n%s", log)
		}
		for _, dev := range []string{"eth0", hostVeth(t, l.Nodes[0].NS, a.ip.String())} {
			out, err := netnsutil.Output(l.Nodes[0].NS, "tc", "filter", "show", "dev", dev, "ingress")
			if err != nil || strings.Contains(out, "vpcni_") {
				t.Errorf("after the fallback %s still runs a vpcni program: %q %v", dev, out, err)
			}
			if out, err := netnsutil.Output(l.Nodes[0].NS, "tc", "qdisc", "show", "dev", dev); err != nil || strings.Contains(out, "clsact") {
				t.Errorf("after the fallback %s keeps a clsact qdisc (it would keep the bandwidth plugin's off): %q %v", dev, out, err)
			}
		}
		if left, _ := os.ReadDir(filepath.Join(pins, "n1")); len(left) != 0 {
			t.Errorf("after the fallback n1's pins are still there: %v", left)
		}
		if st, err := nodes[0].agent.State(); err != nil {
			t.Error(err)
		} else if !strings.HasPrefix(st.FastPath, "off: kernel BTF /nonexistent/vmlinux") {
			t.Errorf("n1's state after the fallback: fastPath %q, want off with the reason", st.FastPath)
		}
		if m := metricsOf(t, n1); !strings.Contains(m, `vpcni_datapath_fastpath_active{mode="ebpf"} 0`) {
			t.Errorf("n1's metrics do not say the fast path is off:\n%s", grepLines(m, "fastpath"))
		}
		expectReach(t, c, []reachable{
			{"pod a (n1, routed) -> pod c (n2, fast)", a.ns, pc.ip},
			{"pod c -> pod a", pc.ns, a.ip},
			{"legacy VM -> pod a", legacy, a.ip},
		})
	})
}

// stats reads a node's fast path counters from its pinned map.
func stats(t *testing.T, pins, node string) map[string]uint64 {
	t.Helper()
	m, err := bpf.LoadPinnedMap(filepath.Join(pins, node, "stats"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out := map[string]uint64{}
	for i, name := range []string{"peer_from_uplink", "peer_local", "neigh_out", "pass_nat", "pass_service", "pass_other"} {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			t.Fatal(err)
		}
		for _, n := range per {
			out[name] += n
		}
	}
	return out
}

// forwardCount is the packets FORWARD rules naming addr counted in ns.
func forwardCount(t *testing.T, ns, addr string) int {
	t.Helper()
	out, err := netnsutil.Output(ns, "iptables", "-L", "FORWARD", "-v", "-x", "-n")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Contains(line, addr) {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("FORWARD rule in %s without a packet count: %q", ns, line)
			}
			total += n
		}
	}
	return total
}

// programsUsing names the programs loaded on the machine that use the map.
func programsUsing(t *testing.T, m bpf.MapID) []string {
	t.Helper()
	var out []string
	for id := bpf.ProgramID(0); ; {
		next, err := bpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		id = next
		p, err := bpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		if info, err := p.Info(); err == nil {
			if ids, ok := info.MapIDs(); ok && slices.Contains(ids, m) {
				out = append(out, fmt.Sprintf("%s#%d", info.Name, id))
			}
		}
		p.Close()
	}
}

// dialIn opens a TCP connection from the namespace at path.
func dialIn(t *testing.T, path, addr string) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := netnsutil.Do(path, func() (err error) {
		conn, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", addr, path, err)
	}
	return conn
}

func pinnedMapID(t *testing.T, path string) bpf.MapID {
	t.Helper()
	m, err := bpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// hostVeth is the host veth a pod's /32 is routed to in ns.
func hostVeth(t *testing.T, ns, ip string) string {
	t.Helper()
	out, err := netnsutil.Output(ns, "ip", "-4", "route", "show", ip+"/32")
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "dev" && i+1 < len(f) {
			return f[i+1]
		}
	}
	t.Fatalf("no route to %s in %s: %q %v", ip, ns, out, err)
	return ""
}

// metricsOf scrapes the agent's metrics inside a node's namespace (the
// connection is dialled there; HTTP runs over it from any thread).
func metricsOf(t *testing.T, ns string) string {
	t.Helper()
	var conn net.Conn
	if err := netnsutil.Do(ns, func() (err error) {
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9695", 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("metrics in %s: %v", ns, err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}}
	resp, err := client.Get("http://127.0.0.1:9695/metrics")
	if err != nil {
		t.Fatalf("metrics in %s: %v", ns, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// eventually retries f until it succeeds, failing the test after d.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("waiting for %s: %v", what, err)
}
