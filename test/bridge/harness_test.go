// Package bridge drives the built vpcni plugin through libcni, as a
// container runtime does, against a vpcnid in bridge mode in a node
// namespace of its own (internal/testbed: segment, node .10, neighbour
// .20), and checks the end state in the kernel. Root only.
package bridge

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/bridge"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
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
	*bedtest.Env
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
func newEnv(t *testing.T, opts ...func(*config.Config)) *env {
	t.Helper()
	e := &env{Env: bedtest.New(t, binDir, "vpcnib", "10.79.0.0/24", "10.79.0.0/26")}
	tb := e.TB
	for _, c := range nodeExtras {
		e.sh(tb.NodeNS(), c...)
	}
	e.before = e.nodeState()
	e.Cfg.MetricsAddr = ""
	e.Cfg.Datapath = config.Datapath{Mode: "bridge"}
	for _, o := range opts {
		o(&e.Cfg)
	}
	p, err := lab.StartPinger(netnsutil.Path(tb.NbrNS()), tb.NodeIP, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitAnswered(3 * time.Second); err != nil {
		p.Stop()
		t.Fatal(err)
	}
	e.StartAgent()
	e.move = p.Stop()
	return e
}

// sh runs a command in a namespace and returns its output.
func (e *env) sh(ns string, argv ...string) string {
	e.T.Helper()
	return bedtest.Sh(e.T, ns, argv...)
}

// nodeState is the node's network configuration as `ip -d` prints it:
// links with their addresses, routes of every table, rules, permanent
// neighbours — without what changes by itself (a bridge's running
// timers), once IPv6 duplicate address detection is over (it adds a local
// route when it ends).
func (e *env) nodeState() string {
	ns := e.TB.NodeNS()
	for deadline := time.Now().Add(5 * time.Second); strings.Contains(e.sh(ns, "ip", "addr"), "tentative"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.T.Fatal("IPv6 link-local addresses in the node stay tentative")
		}
	}
	read := func() string {
		return e.sh(ns, "ip", "-d", "addr") + e.sh(ns, "ip", "-d", "route", "show", "table", "all") +
			e.sh(ns, "ip", "rule") + e.sh(ns, "ip", "-d", "neigh", "show", "nud", "permanent")
	}
	// `ip -d` now and then prints "Error: Peer netns reference is
	// invalid." amid a link's details while namespaces come and go on the
	// machine: a failed read, not the node's state, so it is read again.
	s := read()
	for i := 0; i < 5 && strings.Contains(s, "Error: "); i++ {
		time.Sleep(50 * time.Millisecond)
		s = read()
	}
	return volatile.ReplaceAllString(s, "")
}

var volatile = regexp.MustCompile(`\w+_timer\s+[0-9.]+ `)

// plainState is the node's addresses, routes and permanent neighbours as
// `ip` prints them without details.
func (e *env) plainState() string {
	ns := e.TB.NodeNS()
	return e.sh(ns, "ip", "addr") + e.sh(ns, "ip", "route", "show", "table", "all") + e.sh(ns, "ip", "neigh", "show", "nud", "permanent")
}

// cni loads a conflist with vpcni alone.
func (e *env) cni(version string) *testbed.CNI {
	e.T.Helper()
	return e.CNI("vpcni-bridge", "cni-cache", version)
}

// reach checks a TCP round trip from a namespace to addr and lets the
// test go on, so that one run names every path that fails.
func reach(t *testing.T, from, addr string) {
	t.Helper()
	if err := bedtest.Probe(from, addr); err != nil {
		t.Errorf("%s cannot reach %s: %v", filepath.Base(from), addr, err)
	}
}

// podLinks lists the node's pod links (alias vpcni:<container>/<if>).
func (e *env) podLinks() []string {
	e.T.Helper()
	var out []string
	for _, line := range strings.Split(e.sh(e.TB.NodeNS(), "ip", "-o", "-d", "link"), "\n") {
		if strings.Contains(line, "alias "+bridge.AliasPrefix) && !strings.Contains(line, "alias "+bridge.BridgeAlias) {
			name, _, _ := strings.Cut(strings.TrimSuffix(strings.Fields(line)[1], ":"), "@")
			out = append(out, name)
		}
	}
	return out
}

// waitNoPodLinks waits until no pod link is left on the node.
func (e *env) waitNoPodLinks() {
	e.T.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(e.podLinks()) > 0 {
		if time.Now().After(deadline) {
			e.T.Fatalf("pod links left on the node: %v", e.podLinks())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// withoutSelfHeal turns the agent's kernel watch off and its periodic
// reconcile down to once a day, for a test of what CHECK finds: the watch
// would put a piece taken by hand back within milliseconds, before CHECK
// looks (the self-healing itself: test/integration's TestSelfHeal).
func withoutSelfHeal(c *config.Config) {
	off := false
	c.SelfHeal.Watch, c.SelfHeal.Period.Duration = &off, 24*time.Hour
}
