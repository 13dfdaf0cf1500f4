// Package integration drives the built vpcni plugin through libcni, as a
// container runtime does, against a vpcnid running in a node namespace of
// its own, and checks the end state in the kernel. Root only.
package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
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
	*bedtest.Env
}

type envOpt func(*config.Config)

func withCooldown(d time.Duration) envOpt { return func(c *config.Config) { c.Cooldown.Duration = d } }

func withRange(cidr string, exclude ...string) envOpt {
	return func(c *config.Config) {
		c.Provider.Settings = &static.Config{Ranges: []static.Range{{CIDR: cidr, Exclude: exclude}}}
	}
}

// withoutSelfHeal turns the agent's kernel watch off and its periodic
// reconcile down to once a day, for tests of what CHECK, a repeated ADD or
// a restart find and repair: the watch would put a piece taken by hand
// back within milliseconds, before they look (TestSelfHeal covers it).
func withoutSelfHeal() envOpt {
	return func(c *config.Config) {
		off := false
		c.SelfHeal.Watch, c.SelfHeal.Period.Duration = &off, 24*time.Hour
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
	e := &env{bedtest.New(t, binDir, "vpcnit", "10.78.0.0/24", "10.78.0.0/26")}
	// Debian's plugins, for the chains that put portmap or bandwidth
	// after vpcni.
	e.PluginDirs = append(e.PluginDirs, testbed.DebianCNIDir)
	for _, o := range opts {
		o(&e.Cfg)
	}
	e.StartAgent()
	return e
}

// cni loads a conflist with vpcni first and the given plugins after it.
func (e *env) cni(version string, extra ...map[string]any) *testbed.CNI {
	e.T.Helper()
	return e.CNI("vpcni-test", "cni-cache", version, extra...)
}

func (e *env) state() *api.State {
	e.T.Helper()
	st, err := e.Agent.State()
	if err != nil {
		e.T.Fatalf("agent state: %v", err)
	}
	return st
}

// node opens a netlink handle in the node namespace.
func (e *env) node() *netlink.Handle {
	e.T.Helper()
	return bedtest.HandleIn(e.T, netnsutil.Path(e.TB.NodeNS()))
}

// kernelState is what vpcni owns in the node namespace.
type kernelState struct {
	Links   []string     // links with a vpcni alias
	Routes  []netip.Addr // /32 routes with vpcni's protocol
	Proxies []netip.Addr // proxy ARP entries on the uplink
}

func (e *env) kernel() kernelState {
	e.T.Helper()
	return bedtest.Retry(e.T, e.kernelOnce)
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

// waitClean waits until vpcni owns nothing in the node's kernel (links are
// deleted in the background after DEL).
func (e *env) waitClean() {
	e.T.Helper()
	var ks kernelState
	deadline := time.Now().Add(10 * time.Second)
	for {
		ks = e.kernel()
		if ks.empty() {
			return
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("vpcni left state in the node's kernel: %+v", ks)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
