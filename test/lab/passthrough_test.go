package lab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestPassthroughLab: two nodes in datapath mode passthrough, provider
// openstack mode passthrough: every pod address is a Neutron port of its
// own, attached through the lab's os-interface stand-in (a veth with the
// port's MAC hot-plugged into the node, under the VPC bridge's port
// security) and moved into the pod as eth0. Pods reach each other across
// nodes, their own node through the service veth, a Service DNATed in
// n1, and the legacy VM reaches them; CNI 0.4.0, 1.0.0 and 1.1.0 ADD,
// CHECK and DEL; a restarted agent keeps the pod reachable; DEL gives the
// NIC back to the node down and bare; bad input is refused with code 4.
func TestPassthroughLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l := labUp(t, c, "pt", 2, "10.93.0.0/24")
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint:        fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort),
			ComputeEndpoint: fmt.Sprintf("http://127.0.0.1:%d%s", lab.EndpointPort, lab.ComputePath),
			SubnetID:        l.SubnetID, Mode: "passthrough"}}
		cfg.Datapath = config.Datapath{Mode: "passthrough"}
	})
	a := addPod(t, c, l, nodes[0], "a")
	pc := addPod(t, c, l, nodes[1], "c")
	nicA := ptNIC(t, nodes[0], a)
	if mac, _ := netnsutil.Output(a.name, "cat", "/sys/class/net/eth0/address"); strings.TrimSpace(mac) != strings.ToLower(nicA.MAC) {
		t.Fatalf("pod a's eth0 has MAC %q, want its port's %s", mac, nicA.MAC)
	}
	if ptOnNode(t, nodes[0], nicA.MAC) != "" {
		t.Fatalf("pod a's NIC %s is still on the node", nicA.MAC)
	}
	legacy, n1 := netnsutil.Path(l.Legacy.NS), netnsutil.Path(l.Nodes[0].NS)
	serveEcho(t, legacy, l.Legacy.IP)
	serveEcho(t, n1, l.Nodes[0].IP)
	expectReach(t, c, []reachable{
		{"pod a (n1) -> pod c (n2)", a.ns, pc.ip},
		{"pod c (n2) -> pod a (n1)", pc.ns, a.ip},
		{"pod a -> its node n1 (service veth)", a.ns, l.Nodes[0].IP},
		{"node n1 -> pod a", n1, a.ip},
		{"legacy VM -> pod a", legacy, a.ip},
		{"pod a -> legacy VM", a.ns, l.Legacy.IP},
	})
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
	if t.Failed() {
		t.FailNow()
	}

	// Every CNI version, on n1: ADD, CHECK, DEL; DEL gives the NIC back.
	for i, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		cni, err := testbed.NewCNIIn(l.Nodes[0].NS, []string{binDir}, t.TempDir(), testbed.VpcniConfList(v, "vpcni-lab", nodes[0].cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s-podv%d", l.Prefix, i)
		if err := netnsutil.Add(name); err != nil {
			t.Fatal(err)
		}
		rt := testbed.Runtime(fmt.Sprintf("lab-v%d", i), netnsutil.Path(name), "eth0", nil)
		if _, err := cni.Add(c, rt); err != nil {
			t.Fatalf("CNI %s ADD: %v", v, err)
		}
		nic := ptNIC(t, nodes[0], labPod{id: rt.ContainerID})
		if err := cni.Check(c, rt); err != nil {
			t.Errorf("CNI %s CHECK: %v", v, err)
		}
		if err := cni.Del(c, rt); err != nil {
			t.Fatalf("CNI %s DEL: %v", v, err)
		}
		if out := bedtest.Sh(t, name, "ip", "-o", "link"); strings.Contains(out, "eth0") || strings.Contains(out, "vpcni-svc") {
			t.Errorf("CNI %s DEL left links in the pod:\n%s", v, out)
		}
		back := ptOnNode(t, nodes[0], nic.MAC)
		if back == "" {
			t.Errorf("CNI %s DEL: the NIC %s is not back on the node", v, nic.MAC)
		} else if out := bedtest.Sh(t, l.Nodes[0].NS, "ip", "-o", "-4", "addr", "show", "dev", back); strings.TrimSpace(out) != "" {
			t.Errorf("CNI %s DEL: the NIC came back as %s with addresses: %s", v, back, out)
		}
	}

	// Bad input: the service veth's name as the pod's interface.
	bad := l.Prefix + "-podbad"
	if err := netnsutil.Add(bad); err != nil {
		t.Fatal(err)
	}
	_, err := nodes[0].cni.Add(c, testbed.Runtime("lab-bad", netnsutil.Path(bad), "vpcni-svc", nil))
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != 4 {
		t.Errorf("ADD with ifname vpcni-svc: %v, want CNI error 4", err)
	}

	// A restarted agent keeps pod a wired and reachable.
	nodes[0].restart(t)
	expectReach(t, c, []reachable{{"legacy VM -> pod a after the agent's restart", legacy, a.ip}})
	if err := nodes[0].cni.Check(c, testbed.Runtime(a.id, a.ns, "eth0", nil)); err != nil {
		t.Errorf("CHECK pod a after the restart: %v", err)
	}
}

// ptNIC is the NIC of a pod's allocation, as its agent reports it.
func ptNIC(t *testing.T, n *labNode, p labPod) alloc.NIC {
	t.Helper()
	st, err := n.agent.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Allocations {
		if a.ContainerID == p.id {
			if a.NIC == nil {
				t.Fatalf("%s's lease names no NIC: %+v", p.id, a.Lease)
			}
			return *a.NIC
		}
	}
	t.Fatalf("no allocation of %s on %s", p.id, n.host.Name)
	return alloc.NIC{}
}

// ptOnNode names the node's interface with mac ("" if none).
func ptOnNode(t *testing.T, n *labNode, mac string) string {
	t.Helper()
	out, err := netnsutil.Output(n.host.NS, "ip", "-o", "link")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "link/ether "+strings.ToLower(mac)) {
			f := strings.Fields(line)
			if len(f) > 1 {
				return strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			}
		}
	}
	return ""
}
