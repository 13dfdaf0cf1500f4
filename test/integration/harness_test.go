// Package integration drives the built vpcni plugin through libcni, as a
// container runtime does, against a vpcnid running in a node namespace of
// its own, and checks the end state in the kernel. Root only.
package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
)

// binDir holds vpcni, vpcnid and vpcnictl, built once for the package.
var binDir string

// versions are the CNI spec versions every lifecycle test runs with.
var versions = []string{"0.4.0", "1.0.0", "1.1.0"}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		msg := "vpcni-test: integration tests need root (network namespaces); NOT RUN"
		if os.Getenv("VPCNI_REQUIRE_ROOT") != "" {
			fmt.Println(msg)
			os.Exit(1)
		}
		fmt.Println(msg + " — run `make test` as root")
		os.Exit(0)
	}
	code, err := run(m)
	if err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	binDir = os.Getenv("VPCNI_BIN")
	if binDir == "" {
		dir, err := os.MkdirTemp("", "vpcni-bin-")
		if err != nil {
			return 1, err
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/vpcni", "../../cmd/vpcnid", "../../cmd/vpcnictl")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build binaries: %v\n%s", err, out)
		}
		binDir = dir
	}
	for _, p := range []string{"ptp", "host-local", "portmap", "bandwidth"} {
		if _, err := os.Stat(filepath.Join(testbed.DebianCNIDir, p)); err != nil {
			return 1, fmt.Errorf("Debian's %s plugin is missing (apt install containernetworking-plugins, or make deps)", p)
		}
	}
	return m.Run(), nil
}

// env is one node testbed with its agent.
type env struct {
	t     *testing.T
	tb    *testbed.Topology
	dir   string
	agent *testbed.Agent
	cfg   config.Config
}

type envOpt func(*config.Config)

func withCooldown(d time.Duration) envOpt { return func(c *config.Config) { c.Cooldown.Duration = d } }

func withRange(cidr string, exclude ...string) envOpt {
	return func(c *config.Config) {
		c.Provider.Settings = &static.Config{Ranges: []static.Range{{CIDR: cidr, Exclude: exclude}}}
	}
}

func withPool(warm, batch int) envOpt {
	return func(c *config.Config) { c.Pool.WarmTarget, c.Pool.BatchSize = warm, batch }
}

// newEnv builds a testbed (segment 10.78.0.0/24, node .10, neighbour .20)
// and starts vpcnid with a static pool of 10.78.0.64-254, no cooldown
// unless asked.
func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	tb := testbed.New("vpcnit"+hex.EncodeToString(b[:]), netip.MustParsePrefix("10.78.0.0/24"))
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
	e.cfg = tb.AgentConfig(e.dir, "10.78.0.0/24", "10.78.0.0/26")
	e.cfg.Cooldown.Duration = 0
	for _, o := range opts {
		o(&e.cfg)
	}
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

// cni loads a conflist with vpcni first and the given plugins after it.
func (e *env) cni(version string, extra ...map[string]any) *testbed.CNI {
	e.t.Helper()
	c, err := e.tb.NewCNI([]string{binDir, testbed.DebianCNIDir}, filepath.Join(e.dir, "cni-cache"),
		testbed.VpcniConfList(version, "vpcni-test", e.cfg.SocketPath, extra...))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// pod creates a pod namespace and returns its path.
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

// add runs ADD and returns the pod's address.
func (e *env) add(c *testbed.CNI, id, netnsPath string) netip.Addr {
	e.t.Helper()
	res, err := c.Add(ctx(e.t), testbed.Runtime(id, netnsPath, "eth0", nil))
	if err != nil {
		e.t.Fatalf("ADD %s: %v", id, err)
	}
	return resultIP(e.t, res)
}

func resultIP(t *testing.T, res types.Result) netip.Addr {
	t.Helper()
	r, err := types100.GetResult(res)
	if err != nil {
		t.Fatalf("result: %v", err)
	}
	if len(r.IPs) != 1 {
		t.Fatalf("result has %d IPs, want 1: %+v", len(r.IPs), r)
	}
	ip, ok := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if !ok {
		t.Fatalf("result IP %v is not IPv4", r.IPs[0].Address)
	}
	return ip
}

func (e *env) state() *api.State {
	e.t.Helper()
	st, err := e.agent.State()
	if err != nil {
		e.t.Fatalf("agent state: %v", err)
	}
	return st
}

// node opens a netlink handle in the node namespace.
func (e *env) node() *netlink.Handle {
	e.t.Helper()
	return handleIn(e.t, netnsutil.Path(e.tb.NodeNS()))
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

// kernelState is what vpcni owns in the node namespace.
type kernelState struct {
	Links   []string     // links with a vpcni alias
	Routes  []netip.Addr // /32 routes with vpcni's protocol
	Proxies []netip.Addr // proxy ARP entries on the uplink
}

func (e *env) kernel() kernelState {
	e.t.Helper()
	for range 10 {
		ks, err := e.kernelOnce()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		return ks
	}
	e.t.Fatal("netlink dumps of the node kept being interrupted")
	return kernelState{}
}

func (e *env) kernelOnce() (kernelState, error) {
	h := e.node()
	var ks kernelState
	links, err := h.LinkList()
	if err != nil {
		return ks, err
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, veth.AliasPrefix) || strings.HasPrefix(l.Attrs().Name, "vpc") {
			ks.Links = append(ks.Links, l.Attrs().Name)
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: veth.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return ks, err
	}
	for _, r := range routes {
		ip, _ := netip.AddrFromSlice(r.Dst.IP.To4())
		ks.Routes = append(ks.Routes, ip)
	}
	uplink, err := h.LinkByName("eth0")
	if err != nil {
		return ks, err
	}
	neighs, err := h.NeighProxyList(uplink.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return ks, err
	}
	for _, n := range neighs {
		ip, _ := netip.AddrFromSlice(n.IP.To4())
		ks.Proxies = append(ks.Proxies, ip)
	}
	return ks, nil
}

func (k kernelState) empty() bool { return len(k.Links)+len(k.Routes)+len(k.Proxies) == 0 }

// waitFor polls cond until it holds or d passes.
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

// waitClean waits until vpcni owns nothing in the node's kernel (links are
// deleted in the background after DEL).
func (e *env) waitClean() {
	e.t.Helper()
	var ks kernelState
	deadline := time.Now().Add(10 * time.Second)
	for {
		ks = e.kernel()
		if ks.empty() {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("vpcni left state in the node's kernel: %+v", ks)
		}
		time.Sleep(10 * time.Millisecond)
	}
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

// reach asserts a TCP round trip from a namespace to addr.
func reach(t *testing.T, from, addr string) {
	t.Helper()
	if err := probe(from, addr); err != nil {
		t.Fatalf("%s cannot reach %s: %v", filepath.Base(from), addr, err)
	}
}

func probe(from, addr string) error { return probeWithin(from, addr, 3*time.Second) }

func probeWithin(from, addr string, d time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return netnsutil.Probe(c, from, addr)
}

// execPlugin runs the plugin binary directly with the given environment
// and stdin, and returns its CNI error (nil on success) and stdout.
func execPlugin(t *testing.T, env map[string]string, stdin []byte) (*api.Error, []byte) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "vpcni"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return nil, stdout.Bytes()
	}
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("run plugin: %v", err)
	}
	e := &api.Error{}
	if jerr := json.Unmarshal(stdout.Bytes(), e); jerr != nil || e.Code == 0 {
		t.Fatalf("plugin failed without a CNI error on stdout: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	return e, stdout.Bytes()
}

// isCode says whether err is a CNI error with the given code.
func isCode(err error, code uint) bool {
	var e *types.Error
	return errors.As(err, &e) && e.Code == code
}
