package lab

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// labUp builds a lab for one test and tears it down after it.
func labUp(t *testing.T, c context.Context, tag string, nodes int, subnet string) *lab.Lab {
	t.Helper()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcni%s%d", tag, os.Getpid()%100000), Nodes: nodes, Subnet: netip.MustParsePrefix(subnet)})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// labNode is vpcnid on one lab node and a CNI runtime there.
type labNode struct {
	host   lab.Host
	agent  *testbed.Agent
	cni    *testbed.CNI
	cfg    config.Config
	runDir string
}

// startAgents runs vpcnid on every node of l with the lab endpoint's
// openstack provider, configured further by configure; its log is shown
// when the test fails.
func startAgents(t *testing.T, l *lab.Lab, cniVersion string, configure func(*config.Config)) []*labNode {
	t.Helper()
	nodes := configureNodes(t, l, cniVersion, configure)
	for _, n := range nodes {
		n.start(t)
	}
	return nodes
}

// configureNodes is startAgents without the start, for a test that
// watches each agent's start (the bridge test's pinger).
func configureNodes(t *testing.T, l *lab.Lab, cniVersion string, configure func(*config.Config)) []*labNode {
	t.Helper()
	runDir := t.TempDir()
	var out []*labNode
	for _, h := range l.Nodes {
		cfg := config.Defaults()
		cfg.NodeName = h.Name
		cfg.SocketPath = filepath.Join(runDir, h.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(runDir, h.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Pool = config.Pool{WarmTarget: 2, BatchSize: 2, MaxFree: 4}
		configure(&cfg)
		cni, err := testbed.NewCNIIn(h.NS, []string{binDir}, filepath.Join(runDir, h.Name, "cache"), testbed.VpcniConfList(cniVersion, "vpcni-lab", cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &labNode{host: h, cni: cni, cfg: cfg, runDir: runDir})
	}
	return out
}

// start runs vpcnid on n until the test ends.
func (n *labNode) start(t *testing.T) {
	t.Helper()
	if err := n.launch(t); err != nil {
		t.Fatal(err)
	}
}

// launch is start handing a failed start back, for a caller that has
// something to stop before it fails the test.
func (n *labNode) launch(t *testing.T) error {
	agent, err := testbed.StartAgentIn(n.runDir, n.host.NS, binDir, n.cfg)
	if err != nil {
		return fmt.Errorf("vpcnid on %s: %w", n.host.Name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(agent.LogPath); err == nil {
				t.Logf("vpcnid %s log:\n%s", n.host.Name, log)
			}
		}
		_ = agent.Stop()
	})
	n.agent = agent
	return nil
}

// restart stops vpcnid and starts it again with the same config.
func (n *labNode) restart(t *testing.T) {
	t.Helper()
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	n.start(t)
}

// labPod is a pod namespace wired by vpcni, serving an echo on :7777.
type labPod struct {
	id, ns string // container ID, netns path
	name   string // netns name, for netnsutil.Exec and Output
	ip     netip.Addr
	ip6    netip.Addr // its IPv6 address, on a node whose pods get one
}

// addPod creates a pod namespace, runs ADD on node n and serves an echo
// in the pod.
func addPod(t *testing.T, c context.Context, l *lab.Lab, n *labNode, name string) labPod {
	t.Helper()
	ns := l.Prefix + "-pod" + name
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	id := "lab-" + name
	res, err := n.cni.Add(c, testbed.Runtime(id, netnsutil.Path(ns), "eth0", nil))
	if err != nil {
		t.Fatalf("ADD pod %s on %s: %v", name, n.host.Name, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	p := labPod{id: id, ns: netnsutil.Path(ns), name: ns}
	for _, c := range r.IPs {
		a, _ := netip.AddrFromSlice(c.Address.IP)
		if a = a.Unmap(); a.Is4() && !p.ip.IsValid() {
			p.ip = a
		} else if a.Is6() && !p.ip6.IsValid() {
			p.ip6 = a
		}
	}
	for _, a := range []netip.Addr{p.ip, p.ip6} {
		if a.IsValid() {
			serveEcho(t, p.ns, a)
		}
	}
	return p
}

// serveEcho serves an echo on ip:7777 in a namespace until the test ends.
func serveEcho(t *testing.T, ns string, ip netip.Addr) {
	t.Helper()
	srv, err := netnsutil.ServeEcho(ns, testbed.HostPort(ip, 7777))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
}

// reachable is one expected path.
type reachable struct {
	what string
	from string
	to   netip.Addr
}

// expectReach probes every path.
func expectReach(t *testing.T, c context.Context, paths []reachable) {
	t.Helper()
	for _, p := range paths {
		if err := probe(c, p.from, testbed.HostPort(p.to, 7777)); err != nil {
			t.Errorf("%s: %v", p.what, err)
		}
	}
}

// probe is one TCP round trip from the namespace at path to addr, given
// 3 s: a lab path answers in milliseconds, and a path the test expects to
// be cut (port security) costs the whole wait.
func probe(c context.Context, from, addr string) error {
	pc, cancel := context.WithTimeout(c, 3*time.Second)
	defer cancel()
	return netnsutil.Probe(pc, from, addr)
}

// updatePort changes a port through the lab's Neutron API as a person
// would: change makes the update from the port as it is now, and a
// revision conflict (an agent's update in between) starts over.
func updatePort(t *testing.T, l *lab.Lab, portID string, change func(*ports.Port) ports.UpdateOpts) {
	t.Helper()
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 10 {
		p, err := ports.Get(c, nc, portID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		opts := change(p)
		rev := p.RevisionNumber
		opts.RevisionNumber = &rev
		_, err = ports.Update(c, nc, portID, opts).Extract()
		if err == nil {
			return
		}
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Fatal(err)
		}
	}
	t.Fatal("could not update the port")
}
