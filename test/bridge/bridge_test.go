package bridge

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestBridgeTakesUplink: vpcnid's start moves the node's address, routes
// (every table) and permanent neighbours onto the bridge while the
// neighbour keeps reaching the node.
func TestBridgeTakesUplink(t *testing.T) {
	e := newEnv(t)
	t.Logf("bridge-move: %s", e.move)
	fmt.Printf("bridge-move: %s (testbed)\n", e.move)
	if e.move.Gap > time.Second {
		t.Errorf("the node was cut off for %s while the bridge took the uplink", e.move.Gap)
	}
	node := e.TB.NodeNS()
	for what, want := range map[string]string{
		"address":         "inet 10.79.0.10/24 scope global vpcbr0",
		"default route":   "default via 10.79.0.1 dev vpcbr0",
		"static route":    "10.79.9.0/24 via 10.79.0.30 dev vpcbr0 proto static src 10.79.0.10 metric 5",
		"table 100 route": "default via 10.79.0.1 dev vpcbr0 table 100",
		"neighbour":       "10.79.0.99 dev vpcbr0 lladdr 02:00:00:00:00:99",
	} {
		if state := e.plainState(); !strings.Contains(state, want) {
			t.Errorf("%s not on the bridge: want %q in\n%s", what, want, state)
		}
	}
	if out := e.sh(node, "ip", "-4", "addr", "show", "dev", "eth0"); strings.Contains(out, "inet ") {
		t.Errorf("eth0 kept an IPv4 address:\n%s", out)
	}
	eth0, br := e.sh(node, "ip", "-o", "link", "show", "eth0"), e.sh(node, "ip", "-o", "-d", "link", "show", "vpcbr0")
	if !strings.Contains(eth0, "master vpcbr0") {
		t.Errorf("eth0 is not a port of vpcbr0: %s", eth0)
	}
	mac := strings.Fields(eth0[strings.Index(eth0, "link/ether"):])[1]
	if !strings.Contains(br, "link/ether "+mac) || !strings.Contains(br, "nf_call_iptables 1") {
		t.Errorf("vpcbr0 should carry eth0's MAC %s and nf_call_iptables 1: %s", mac, br)
	}
	st, err := e.Agent.State()
	if err != nil {
		t.Fatal(err)
	}
	if st.Datapath != "bridge" || st.Uplink != "vpcbr0 (port eth0)" {
		t.Errorf("agent reports datapath %q via %q", st.Datapath, st.Uplink)
	}
}

// TestBridgeVerbs runs ADD, CHECK, GC and DEL through libcni for every CNI
// version vpcni speaks, checking the kernel after each, and that a version
// it does not speak is refused.
func TestBridgeVerbs(t *testing.T) {
	e := newEnv(t, withoutSelfHeal)
	nbr := netnsutil.Path(e.TB.NbrNS())
	node := netnsutil.Path(e.TB.NodeNS())
	bedtest.Echo(t, nbr, e.TB.NbrIP)
	bedtest.Echo(t, node, e.TB.NodeIP)
	for i, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			c := e.cni(v)
			ns := e.Pod(i)
			id := "verbs-" + v
			r := e.Add(c, id, ns)
			ip := bedtest.ResultIP(t, r)
			if got := r.IPs[0].Address.String(); got != ip.String()+"/24" || r.IPs[0].Gateway.String() != "10.79.0.1" {
				t.Errorf("result IP %s gateway %s, want %s/24 via 10.79.0.1", got, r.IPs[0].Gateway, ip)
			}
			pod := e.sh(e.TB.PodNS(i), "ip", "-d", "addr", "show", "eth0") + e.sh(e.TB.PodNS(i), "ip", "route")
			for _, want := range []string{"link/ether " + alloc.AddressMAC(ip), "inet " + ip.String() + "/24", "default via 10.79.0.1 dev eth0"} {
				if !strings.Contains(pod, want) {
					t.Errorf("pod lacks %q:\n%s", want, pod)
				}
			}
			links := e.podLinks()
			if len(links) != 1 || !strings.Contains(e.sh(e.TB.NodeNS(), "ip", "-o", "link", "show", links[0]), "master vpcbr0") {
				t.Errorf("want one pod link on vpcbr0, have %v", links)
			}
			bedtest.Echo(t, ns, ip)
			reach(t, ns, testbed.HostPort(e.TB.NbrIP, 7777))
			reach(t, nbr, testbed.HostPort(ip, 7777))
			reach(t, ns, testbed.HostPort(e.TB.NodeIP, 7777))
			reach(t, node, testbed.HostPort(ip, 7777))
			rt := testbed.Runtime(id, ns, "eth0", nil)
			if err := c.Check(bedtest.Ctx(t), rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			// CHECK sees a pod link taken off the bridge.
			e.sh(e.TB.NodeNS(), "ip", "link", "set", links[0], "nomaster")
			if err := c.Check(bedtest.Ctx(t), rt); err == nil || !strings.Contains(err.Error(), "not a port of vpcbr0") {
				t.Errorf("CHECK of a pod link off the bridge: %v", err)
			}
			e.sh(e.TB.NodeNS(), "ip", "link", "set", links[0], "master", "vpcbr0")
			if v == "1.1.0" {
				if err := c.GC(bedtest.Ctx(t), []types.GCAttachment{{ContainerID: id, IfName: "eth0"}}); err != nil {
					t.Errorf("GC keeping the pod: %v", err)
				}
				if len(e.podLinks()) != 1 {
					t.Errorf("GC removed a valid attachment: %v", e.podLinks())
				}
				if err := c.GC(bedtest.Ctx(t), nil); err != nil {
					t.Errorf("GC: %v", err)
				}
				e.waitNoPodLinks()
			}
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Errorf("second DEL: %v", err)
			}
			e.waitNoPodLinks()
			if out := e.sh(e.TB.PodNS(i), "ip", "-o", "link"); strings.Contains(out, "eth0") {
				t.Errorf("pod end left in the pod: %s", out)
			}
			if st, _ := e.Agent.State(); st == nil || len(st.Allocations) != 0 {
				t.Errorf("allocations left after DEL: %+v", st)
			}
		})
	}
	t.Run("0.3.1 refused", func(t *testing.T) {
		_, err := e.cni("0.3.1").Add(bedtest.Ctx(t), testbed.Runtime("old", e.Pod(9), "eth0", nil))
		if err == nil || !strings.Contains(err.Error(), "0.3.1") {
			t.Fatalf("ADD with CNI 0.3.1: %v, want a refusal naming the version", err)
		}
		if l := e.podLinks(); len(l) != 0 {
			t.Errorf("refused ADD left links: %v", l)
		}
	})
}

// TestBridgePodsAndServices: two pods on the node switch to each other, reach
// the node and the neighbour; a kube-proxy-style DNAT rule in the node
// sends a Service IP to a pod on the node and to the neighbour, with the
// node-wide bridge-nf-call-iptables sysctl off: the bridge's own option is
// what makes it work, and turning that off breaks it.
func TestBridgePodsAndServices(t *testing.T) {
	e := newEnv(t)
	nodeNS := e.TB.NodeNS()
	e.sh(nodeNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
	c := e.cni("1.0.0")
	var ns [2]string
	var ip [2]netip.Addr
	for i := range ns {
		ns[i] = e.Pod(i)
		ip[i] = e.AddIP(c, fmt.Sprintf("svc-%d", i), ns[i])
		bedtest.Echo(t, ns[i], ip[i])
	}
	bedtest.Echo(t, netnsutil.Path(e.TB.NbrNS()), e.TB.NbrIP)
	bedtest.Echo(t, netnsutil.Path(nodeNS), e.TB.NodeIP)
	reach(t, ns[0], testbed.HostPort(ip[1], 7777))
	reach(t, ns[1], testbed.HostPort(ip[0], 7777))
	reach(t, ns[0], testbed.HostPort(e.TB.NodeIP, 7777))
	reach(t, ns[0], testbed.HostPort(e.TB.NbrIP, 7777))
	reach(t, netnsutil.Path(e.TB.NbrNS()), testbed.HostPort(ip[1], 7777))

	services := map[string]string{
		"10.96.0.10": testbed.HostPort(ip[1], 7777),      // a pod on this node
		"10.96.0.11": testbed.HostPort(e.TB.NbrIP, 7777), // a host elsewhere on the segment
	}
	for svc, backend := range services {
		e.sh(nodeNS, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", backend)
	}
	for svc, backend := range services {
		reach(t, ns[0], svc+":80")
		t.Logf("pod %s -> Service %s:80 -> %s", ip[0], svc, backend)
	}
	// The echo reply must come from the Service address (un-DNAT'ed by
	// conntrack): Probe's TCP handshake would fail otherwise. Proof the
	// rule, not something else, carried it: the DNAT rule counted packets.
	if out := e.sh(nodeNS, "iptables", "-t", "nat", "-L", "PREROUTING", "-v", "-n", "-x"); strings.Count(out, "DNAT") != 2 || strings.Contains(out, "    0     0 DNAT") {
		t.Errorf("the DNAT rules did not see the pod's traffic:\n%s", out)
	}
	// Off on the bridge (and off node-wide): Service traffic bypasses
	// iptables and goes nowhere.
	e.sh(nodeNS, "ip", "link", "set", "vpcbr0", "type", "bridge", "nf_call_iptables", "0")
	e.sh(nodeNS, "conntrack", "-F")
	if err := bedtest.Probe(ns[0], "10.96.0.11:80"); err == nil {
		t.Errorf("a Service answered with nf_call_iptables off on the bridge: the test proves nothing")
	}
	e.sh(nodeNS, "ip", "link", "set", "vpcbr0", "type", "bridge", "nf_call_iptables", "1")
	reach(t, ns[0], "10.96.0.11:80")
}

// TestBridgeBadInput: bad requests get a CNI error, and leave no link and
// no allocation behind.
func TestBridgeBadInput(t *testing.T) {
	e := newEnv(t)
	c := e.cni("1.0.0")
	// No such namespace.
	_, err := c.Add(bedtest.Ctx(t), testbed.Runtime("bad-ns", "/run/netns/vpcni-no-such-ns", "eth0", nil))
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("ADD into a missing netns: %v", err)
	}
	// The pod has an eth0 already.
	ns := e.Pod(1)
	e.sh(e.TB.PodNS(1), "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	_, err = c.Add(bedtest.Ctx(t), testbed.Runtime("busy", ns, "eth0", nil))
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("ADD over an existing eth0: %v", err)
	}
	if l := e.podLinks(); len(l) != 0 {
		t.Errorf("failed ADDs left links: %v", l)
	}
	if st, _ := e.Agent.State(); st == nil || len(st.Allocations) != 0 {
		t.Errorf("failed ADDs left allocations: %+v", st)
	}
}

// TestBridgeRestartAndUninstall: an agent restart (graceful and killed)
// keeps pods and the node reachable and moves nothing again; a pod link
// deleted while the agent is down is re-wired at start; after DEL and
// `vpcnictl uninstall-cni` the node is exactly as before vpcni.
func TestBridgeRestartAndUninstall(t *testing.T) {
	e := newEnv(t)
	c := e.cni("1.0.0")
	nodeNS := e.TB.NodeNS()
	nbr := netnsutil.Path(e.TB.NbrNS())
	var ns [2]string
	var ip [2]netip.Addr
	for i := range ns {
		ns[i] = e.Pod(i)
		ip[i] = e.AddIP(c, fmt.Sprintf("rs-%d", i), ns[i])
		bedtest.Echo(t, ns[i], ip[i])
	}
	moved := e.nodeState()
	brIndex := e.sh(nodeNS, "cat", "/sys/class/net/vpcbr0/ifindex")
	for _, kill := range []bool{false, true} {
		pn, err := lab.StartPinger(nbr, e.TB.NodeIP, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		pp, err := lab.StartPinger(nbr, ip[0], 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if kill {
			_ = e.Agent.Kill()
		} else {
			_ = e.Agent.Stop()
		}
		e.StartAgent()
		sn, sp := pn.Stop(), pp.Stop()
		t.Logf("restart (kill=%v): node %s; pod %s", kill, sn, sp)
		if sn.Lost > 0 || sp.Lost > 0 {
			t.Errorf("restart (kill=%v) lost probes: node %s, pod %s", kill, sn, sp)
		}
		if got := e.sh(nodeNS, "cat", "/sys/class/net/vpcbr0/ifindex"); got != brIndex {
			t.Errorf("the bridge was made again (ifindex %s, was %s)", got, brIndex)
		}
		if got := e.nodeState(); got != moved {
			t.Errorf("a restart changed the node:\n--- before\n%s--- after\n%s", moved, got)
		}
		reach(t, ns[1], testbed.HostPort(ip[0], 7777))
	}
	// A pod link lost while the agent is down: the start re-wires the pod.
	_ = e.Agent.Stop()
	lost := ""
	for _, l := range e.podLinks() {
		if strings.Contains(e.sh(nodeNS, "ip", "-o", "-d", "link", "show", l), "rs-1/eth0") {
			lost = l
		}
	}
	e.sh(nodeNS, "ip", "link", "del", lost)
	e.StartAgent()
	deadline := time.Now().Add(15 * time.Second)
	for bedtest.Probe(ns[0], testbed.HostPort(ip[1], 7777)) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not re-wired after its link was deleted", ip[1])
		}
		time.Sleep(100 * time.Millisecond)
	}

	for i := range ns {
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime(fmt.Sprintf("rs-%d", i), ns[i], "eth0", nil)); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	e.waitNoPodLinks()
	// While the agent runs, uninstall refuses.
	cniDir := t.TempDir()
	args := []string{filepath.Join(binDir, "vpcnictl"), "uninstall-cni", "--bin-dir", cniDir, "--conf-dir", cniDir, "--agent-config", e.Agent.ConfigPath}
	if out, err := netnsutil.Output(nodeNS, args...); err == nil || !strings.Contains(out, "stop it") {
		t.Errorf("uninstall with the agent running: %v\n%s", err, out)
	}
	_ = e.Agent.Stop()
	out := e.sh(nodeNS, args...)
	if !strings.Contains(out, "node given back by datapath bridge") {
		t.Errorf("uninstall said: %s", out)
	}
	if after := e.nodeState(); after != e.before {
		t.Errorf("uninstall did not restore the node exactly:\n--- before vpcni\n%s--- after uninstall\n%s", e.before, after)
	}
	// The node works as before: the neighbour reaches it on eth0.
	bedtest.Echo(t, netnsutil.Path(nodeNS), e.TB.NodeIP)
	reach(t, nbr, testbed.HostPort(e.TB.NodeIP, 7777))
}
