// Package macvlan drives the built vpcni plugin through libcni against a
// vpcnid in datapath mode macvlan (and ipvlan, where the kernel has it),
// in a testbed of namespaces (segment, node, neighbour host), and checks
// the end state in the kernel: links, routes, nftables, reachability.
// Root only.
package macvlan

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

var binDir string

// versions are the CNI spec versions every lifecycle test runs with (the
// plugin refuses 0.3.1: TestMacvlanLifecycle/0.3.1 proves it).
var versions = []string{"0.4.0", "1.0.0", "1.1.0"}

// serviceCIDR is the Service range the agent routes through the node.
const serviceCIDR = "10.96.0.0/12"

func TestMain(m *testing.M) {
	testbed.RequireRoot("macvlan/ipvlan datapath tests (network namespaces)")
	dir, err := testbed.Binaries()
	if err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	binDir = dir
	os.Exit(m.Run())
}

// env is one node testbed (segment 10.79.0.0/24: gateway .1, node .10,
// neighbour .20) with vpcnid in an L2 mode over a static pool of .64-.254.
type env struct {
	t     *testing.T
	tb    *testbed.Topology
	dir   string
	agent *testbed.Agent
	cfg   config.Config
}

func newEnv(t *testing.T, mode macvlan.Kind) *env {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	tb := testbed.New("vpcnim"+hex.EncodeToString(b[:]), netip.MustParsePrefix("10.79.0.0/24"))
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
	e.cfg = tb.AgentConfig(e.dir, "10.79.0.0/24", "10.79.0.0/26")
	e.cfg.Cooldown.Duration = 0
	e.cfg.Datapath = config.Datapath{Mode: string(mode), Settings: &macvlan.Settings{ServiceCIDRs: []string{serviceCIDR}}}
	e.startAgent()
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

func (e *env) cni(version string) *testbed.CNI {
	e.t.Helper()
	c, err := e.tb.NewCNI([]string{binDir}, filepath.Join(e.dir, "cni-cache-"+version),
		testbed.VpcniConfList(version, "vpcni-test", e.cfg.SocketPath))
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
	return r
}

func resultIP(t *testing.T, r *types100.Result) netip.Addr {
	t.Helper()
	if len(r.IPs) != 1 {
		t.Fatalf("result has %d IPs, want 1: %+v", len(r.IPs), r)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	return ip
}

func handleIn(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// nodeState is what vpcni owns in the node namespace, per pod: service
// veths (by name or alias) and vpcni's routes. The NAT table is the
// node's, not a pod's: it stays.
type nodeState struct {
	Links  []string
	Routes []string
}

func (s nodeState) empty() bool { return len(s.Links)+len(s.Routes) == 0 }

func (e *env) node() nodeState {
	e.t.Helper()
	h := handleIn(e.t, netnsutil.Path(e.tb.NodeNS()))
	for range 10 {
		var s nodeState
		links, err := h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		} else if err != nil {
			e.t.Fatal(err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) || strings.HasPrefix(l.Attrs().Name, svcpath.HostPrefix) {
				s.Links = append(s.Links, l.Attrs().Name)
			}
		}
		routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: svcpath.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		} else if err != nil {
			e.t.Fatal(err)
		}
		for _, r := range routes {
			s.Routes = append(s.Routes, r.Dst.String())
		}
		return s
	}
	e.t.Fatal("netlink dumps of the node kept being interrupted")
	return nodeState{}
}

// podLinks names the pod's links other than lo.
func podLinks(t *testing.T, path string) []string {
	t.Helper()
	links, err := handleIn(t, path).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// echo serves TCP echo on addr in a namespace for the test's life.
func echo(t *testing.T, nsPath, addr string) {
	t.Helper()
	srv, err := netnsutil.ServeEcho(nsPath, addr)
	if err != nil {
		t.Fatalf("echo server on %s: %v", addr, err)
	}
	t.Cleanup(func() { srv.Close() })
}

func probe(from, addr string) error {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return netnsutil.Probe(c, from, addr)
}

func reach(t *testing.T, from, addr string) {
	t.Helper()
	if err := probe(from, addr); err != nil {
		t.Fatalf("%s cannot reach %s: %v", filepath.Base(from), addr, err)
	}
}

// isCode says whether err is a CNI error with the given code.
func isCode(err error, code uint) bool {
	var e *types.Error
	return errors.As(err, &e) && e.Code == code
}

// run runs a command in a namespace and fails the test on error.
func run(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	out, err := netnsutil.Output(ns, argv...)
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return out
}

// ipvlanMissing says why this kernel cannot make an ipvlan link ("" when it
// can), found by trying in a scratch namespace of the test's own.
func ipvlanMissing(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("vpcni-ipvt%d", os.Getpid())
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	defer netnsutil.Delete(ns)
	if err := netnsutil.Exec(ns, "ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"); err != nil {
		t.Fatal(err)
	}
	if out, err := netnsutil.Output(ns, "ip", "link", "add", "link", "p0", "name", "iv0", "type", "ipvlan", "mode", "l2"); err != nil {
		return fmt.Sprintf("%v: %s", err, strings.TrimSpace(out))
	}
	return ""
}
