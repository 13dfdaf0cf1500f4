// Package bedtest is the testing side of internal/testbed: one node
// testbed with vpcnid in it, gone when the test ends, and the CNI calls,
// probes and waits that the root-only datapath suites (test/integration,
// test/macvlan, test/bridge) share. It is a package of its own because it
// imports testing: internal/testbed stays free of it, as every package
// but a *test one must (internal/deptest).
package bedtest

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
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// Env is one node testbed (segment, gateway .1, node .10, neighbour .20)
// and the vpcnid that runs in its node namespace.
type Env struct {
	T     *testing.T
	TB    *testbed.Topology
	Dir   string // the test's directory: agent state, CNI caches
	Agent *testbed.Agent
	Cfg   config.Config
	// PluginDirs is where CNI plugins are looked up: the built binaries,
	// and whatever a suite chains after vpcni.
	PluginDirs []string
	binDir     string
}

// New builds a testbed named prefix and a random tag (tests of one package
// run side by side) on subnet, and prepares Cfg: a static pool of subnet
// without exclude, no cooldown. The caller changes Cfg and then calls
// StartAgent. When the test ends the testbed goes, a namespace left
// behind fails the test, and a failed test shows the agent's log.
func New(t *testing.T, binDir, prefix, subnet, exclude string) *Env {
	t.Helper()
	return build(t, binDir, prefix, subnet, exclude, netip.Prefix{})
}

// NewDualStack is New with the segment on IPv6 subnet6 as well (the
// gateway, node and neighbour at ::1, ::10 and ::20 of it); Cfg is still
// IPv4's alone, for the caller to add its families and IPv6 range to.
func NewDualStack(t *testing.T, binDir, prefix, subnet, exclude, subnet6 string) *Env {
	t.Helper()
	return build(t, binDir, prefix, subnet, exclude, netip.MustParsePrefix(subnet6))
}

func build(t *testing.T, binDir, prefix, subnet, exclude string, subnet6 netip.Prefix) *Env {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	tb := testbed.New(prefix+hex.EncodeToString(b[:]), netip.MustParsePrefix(subnet))
	if subnet6.IsValid() {
		tb.WithIPv6(subnet6)
	}
	if err := tb.Up(); err != nil {
		t.Fatalf("testbed: %v", err)
	}
	e := &Env{T: t, TB: tb, Dir: t.TempDir(), PluginDirs: []string{binDir}, binDir: binDir}
	t.Cleanup(func() {
		if t.Failed() && e.Agent != nil {
			if log, err := os.ReadFile(e.Agent.LogPath); err == nil {
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
	e.Cfg = tb.AgentConfig(e.Dir, subnet, exclude)
	e.Cfg.Cooldown.Duration = 0
	return e
}

// StartAgent starts vpcnid with Cfg and waits until it serves.
func (e *Env) StartAgent() {
	e.T.Helper()
	a, err := e.TB.StartAgent(e.binDir, e.Cfg)
	if err != nil {
		e.T.Fatalf("start vpcnid: %v", err)
	}
	e.Agent = a
}

// CNI loads a conflist named name with vpcni first and extra plugins
// after it, caching results in the test's directory under cache.
func (e *Env) CNI(name, cache, version string, extra ...map[string]any) *testbed.CNI {
	e.T.Helper()
	c, err := e.TB.NewCNI(e.PluginDirs, filepath.Join(e.Dir, cache), testbed.VpcniConfList(version, name, e.Cfg.SocketPath, extra...))
	if err != nil {
		e.T.Fatal(err)
	}
	return c
}

// Pod creates pod namespace i and returns its path.
func (e *Env) Pod(i int) string {
	e.T.Helper()
	path, err := e.TB.AddPod(i)
	if err != nil {
		e.T.Fatal(err)
	}
	return path
}

// Add runs ADD of eth0 in netnsPath and returns the result.
func (e *Env) Add(c *testbed.CNI, id, netnsPath string) *types100.Result {
	e.T.Helper()
	res, err := c.Add(Ctx(e.T), testbed.Runtime(id, netnsPath, "eth0", nil))
	if err != nil {
		e.T.Fatalf("ADD %s: %v", id, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		e.T.Fatalf("result: %v", err)
	}
	return r
}

// AddIP runs ADD and returns the pod's one address.
func (e *Env) AddIP(c *testbed.CNI, id, netnsPath string) netip.Addr {
	e.T.Helper()
	return ResultIP(e.T, e.Add(c, id, netnsPath))
}

// ResultIP is the one IPv4 address of an ADD result.
func ResultIP(t *testing.T, res types.Result) netip.Addr {
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

// Ctx is a context for one CNI call or a few: a minute, well above any
// call's cost, so a hung plugin fails the test instead of the binary's
// timeout.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// HandleIn opens a netlink handle in the namespace at path until the test
// ends.
func HandleIn(t *testing.T, path string) *netlink.Handle {
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

// WaitFor polls cond until it holds or d passes.
func WaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// NoLink is nil when h's namespace has no link called name, else what is
// wrong: the link is there, or the lookup failed for another reason (which
// proves nothing about the link).
func NoLink(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return fmt.Errorf("link %s is there (index %d)", name, l.Attrs().Index)
	case errors.As(err, &nf):
		return nil
	default:
		return fmt.Errorf("look up link %s: %w", name, err)
	}
}

// Sh runs a command in a named namespace and returns its output; an error
// fails the test.
func Sh(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	out, err := netnsutil.Output(ns, argv...)
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(argv, " "), ns, err, out)
	}
	return out
}

// Echo serves TCP echo on ip:7777 in a namespace for the test's life.
func Echo(t *testing.T, nsPath string, ip netip.Addr) {
	t.Helper()
	addr := testbed.HostPort(ip, 7777)
	srv, err := netnsutil.ServeEcho(nsPath, addr)
	if err != nil {
		t.Fatalf("echo server on %s: %v", addr, err)
	}
	t.Cleanup(func() { srv.Close() })
}

// Reach asserts a TCP round trip from a namespace to addr.
func Reach(t *testing.T, from, addr string) {
	t.Helper()
	if err := Probe(from, addr); err != nil {
		t.Fatalf("%s cannot reach %s: %v", filepath.Base(from), addr, err)
	}
}

// Probe is one TCP round trip from the namespace at path to addr, given
// 3 s: a testbed path answers in milliseconds, and a path a test expects
// to be cut costs the whole wait.
func Probe(from, addr string) error { return ProbeWithin(from, addr, 3*time.Second) }

// ProbeWithin is Probe given d.
func ProbeWithin(from, addr string, d time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return netnsutil.Probe(c, from, addr)
}

// IsCode says whether err is a CNI error with the given code.
func IsCode(err error, code uint) bool {
	var e *types.Error
	return errors.As(err, &e) && e.Code == code
}

// BPFFSDir is a BPF filesystem of the tests' own on the host: an agent
// run under `ip netns exec` gets a /sys of its own, so pins under
// /sys/fs/bpf would go with the agent; here they outlive it, as the host's
// /sys/fs/bpf does on a real node.
const BPFFSDir = "/run/vpcni-test-bpffs"

// MountBPFFS mounts BPFFSDir, or reuses an earlier run's mount.
func MountBPFFS(t *testing.T) {
	t.Helper()
	var st unix.Statfs_t
	if err := os.MkdirAll(BPFFSDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(BPFFSDir, &st); err == nil && uint32(st.Type) == unix.BPF_FS_MAGIC {
		return
	}
	if err := unix.Mount("bpf", BPFFSDir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount a BPF filesystem on %s: %v", BPFFSDir, err)
	}
}

// Retry runs a netlink dump until the kernel lets it finish: a dump that
// races a change ends with ErrDumpInterrupted, and the state a test
// asserts on must be whole.
func Retry[T any](t *testing.T, dump func() (T, error)) T {
	t.Helper()
	for range 10 {
		v, err := dump()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	t.Fatal("netlink dumps kept being interrupted")
	var zero T
	return zero
}
