// Package bridge drives the built vpcni plugin through libcni, as a
// container runtime does, against a vpcnid in bridge mode in a node
// namespace of its own (internal/testbed: segment, node .10, neighbour
// .20), and checks the end state in the kernel. Root only.
package bridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/bridge"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

var binDir string

func TestMain(m *testing.M) {
	testbed.RequireRoot("the bridge mode tests")
	binDir = os.Getenv("VPCNI_BIN")
	if binDir == "" {
		dir, err := os.MkdirTemp("", "vpcni-bin-")
		if err != nil {
			fmt.Println("vpcni-test:", err)
			os.Exit(1)
		}
		cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/vpcni", "../../cmd/vpcnid", "../../cmd/vpcnictl")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Printf("vpcni-test: build: %v\n%s", err, out)
			os.Exit(1)
		}
		binDir = dir
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// env is one node testbed with vpcnid in bridge mode.
type env struct {
	t     *testing.T
	tb    *testbed.Topology
	dir   string
	agent *testbed.Agent
	cfg   config.Config
	// before is the node's network state before vpcnid first started.
	before string
	// move is what the neighbour saw of the node while the bridge took
	// the uplink.
	move lab.PingStats
}

// The node's extra state that must move to the bridge and come back: a
// route in another table, a static route with a source, a permanent
// neighbour.
var nodeExtras = [][]string{
	{"ip", "route", "add", "10.79.9.0/24", "via", "10.79.0.30", "src", "10.79.0.10", "metric", "5", "proto", "static"},
	{"ip", "route", "add", "default", "via", "10.79.0.1", "table", "100"},
	{"ip", "route", "add", "10.79.0.0/24", "dev", "eth0", "scope", "link", "proto", "static", "table", "100"},
	{"ip", "rule", "add", "from", "10.79.0.10", "lookup", "100", "priority", "1000"},
	{"ip", "neigh", "add", "10.79.0.99", "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "permanent"},
}

// newEnv builds a testbed (segment 10.79.0.0/24, gateway .1, node .10,
// neighbour .20) and starts vpcnid in bridge mode with a static pool of
// 10.79.0.64-254, measuring the move from the neighbour.
func newEnv(t *testing.T) *env {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	tb := testbed.New("vpcnib"+hex.EncodeToString(b[:]), netip.MustParsePrefix("10.79.0.0/24"))
	if err := tb.Up(); err != nil {
		t.Fatalf("testbed: %v", err)
	}
	e := &env{t: t, tb: tb, dir: t.TempDir()}
	t.Cleanup(func() {
		if t.Failed() && e.agent != nil {
			if log, err := os.ReadFile(e.agent.LogPath); err == nil {
				t.Logf("vpcnid log:\n%s", log)
			}
		}
		if err := tb.Down(); err != nil {
			t.Errorf("testbed teardown: %v", err)
		}
		if left := netnsutil.List(tb.Prefix); len(left) > 0 {
			t.Errorf("namespaces left behind: %v", left)
		}
	})
	for _, c := range nodeExtras {
		e.sh(tb.NodeNS(), c...)
	}
	e.before = e.nodeState()
	e.cfg = tb.AgentConfig(e.dir, "10.79.0.0/24", "10.79.0.0/26")
	e.cfg.Cooldown.Duration = 0
	e.cfg.MetricsAddr = ""
	e.cfg.Datapath = config.Datapath{Mode: "bridge"}
	p, err := lab.StartPinger(netnsutil.Path(tb.NbrNS()), tb.NodeIP, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitAnswered(3 * time.Second); err != nil {
		p.Stop()
		t.Fatal(err)
	}
	e.startAgent()
	e.move = p.Stop()
	return e
}

func (e *env) startAgent() {
	e.t.Helper()
	a, err := e.tb.StartAgent(binDir, e.cfg)
	if err != nil {
		e.t.Fatalf("start vpcnid: %v", err)
	}
	e.agent = a
}

// sh runs a command in a namespace and returns its output.
func (e *env) sh(ns string, argv ...string) string {
	e.t.Helper()
	out, err := netnsutil.Output(ns, argv...)
	if err != nil {
		e.t.Fatalf("%s in %s: %v\n%s", strings.Join(argv, " "), ns, err, out)
	}
	return out
}

// nodeState is the node's network configuration as `ip -d` prints it:
// links with their addresses, routes of every table, rules, permanent
// neighbours — without what changes by itself (a bridge's running
// timers), once IPv6 duplicate address detection is over (it adds a local
// route when it ends).
func (e *env) nodeState() string {
	ns := e.tb.NodeNS()
	for deadline := time.Now().Add(5 * time.Second); strings.Contains(e.sh(ns, "ip", "addr"), "tentative"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatal("IPv6 link-local addresses in the node stay tentative")
		}
	}
	s := e.sh(ns, "ip", "-d", "addr") + e.sh(ns, "ip", "-d", "route", "show", "table", "all") +
		e.sh(ns, "ip", "rule") + e.sh(ns, "ip", "-d", "neigh", "show", "nud", "permanent")
	return volatile.ReplaceAllString(s, "")
}

var volatile = regexp.MustCompile(`\w+_timer\s+[0-9.]+ `)

// plainState is the node's addresses, routes and permanent neighbours as
// `ip` prints them without details.
func (e *env) plainState() string {
	ns := e.tb.NodeNS()
	return e.sh(ns, "ip", "addr") + e.sh(ns, "ip", "route", "show", "table", "all") + e.sh(ns, "ip", "neigh", "show", "nud", "permanent")
}

// cni loads a conflist with vpcni alone.
func (e *env) cni(version string) *testbed.CNI {
	e.t.Helper()
	c, err := e.tb.NewCNI([]string{binDir}, filepath.Join(e.dir, "cni-cache"),
		testbed.VpcniConfList(version, "vpcni-bridge", e.cfg.SocketPath))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) pod(i int) string {
	e.t.Helper()
	path, err := e.tb.AddPod(i)
	if err != nil {
		e.t.Fatal(err)
	}
	return path
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// add runs ADD and returns the result.
func (e *env) add(c *testbed.CNI, id, netnsPath string) *types100.Result {
	e.t.Helper()
	res, err := c.Add(ctx(e.t), testbed.Runtime(id, netnsPath, "eth0", nil))
	if err != nil {
		e.t.Fatalf("ADD %s: %v", id, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		e.t.Fatalf("result: %v", err)
	}
	if len(r.IPs) != 1 {
		e.t.Fatalf("result has %d IPs, want 1: %+v", len(r.IPs), r)
	}
	return r
}

func resultIP(r *types100.Result) netip.Addr {
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	return ip
}

// echo serves TCP echo on ip:7777 in a namespace for the test's life.
func echo(t *testing.T, nsPath string, ip netip.Addr) {
	t.Helper()
	srv, err := netnsutil.ServeEcho(nsPath, testbed.HostPort(ip, 7777))
	if err != nil {
		t.Fatalf("echo server: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
}

func probe(from, addr string) error {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return netnsutil.Probe(c, from, addr)
}

// reach asserts a TCP round trip from a namespace to addr.
func reach(t *testing.T, from, addr string) {
	t.Helper()
	if err := probe(from, addr); err != nil {
		t.Errorf("%s cannot reach %s: %v", filepath.Base(from), addr, err)
	}
}

// podLinks lists the node's pod links (alias vpcni:<container>/<if>).
func (e *env) podLinks() []string {
	e.t.Helper()
	var out []string
	for _, line := range strings.Split(e.sh(e.tb.NodeNS(), "ip", "-o", "-d", "link"), "\n") {
		if strings.Contains(line, "alias "+bridge.AliasPrefix) && !strings.Contains(line, "alias "+bridge.BridgeAlias) {
			name, _, _ := strings.Cut(strings.TrimSuffix(strings.Fields(line)[1], ":"), "@")
			out = append(out, name)
		}
	}
	return out
}

// waitNoPodLinks waits until no pod link is left on the node.
func (e *env) waitNoPodLinks() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(e.podLinks()) > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("pod links left on the node: %v", e.podLinks())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isCode says whether err is a CNI error with the given code.
func isCode(err error, code uint) bool {
	e, ok := err.(*types.Error)
	return ok && e.Code == code
}
