// Package doctor runs vpcnictl doctor on a lab node (internal/lab: the
// lab's Neutron endpoint, vpcnid running there with the openstack
// provider) and plants one fault at a time: each must fail the check that
// names it, and only that one, with an exit code of 1. Root only.
package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/doctor"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

var binDir string

func TestMain(m *testing.M) {
	testbed.RequireRoot("the doctor tests")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// node is the lab node doctor examines and the dirs it is pointed at.
type node struct {
	ns                  string
	agent               *testbed.Agent
	configPath          string
	confDir, binDir     string
	socket, portmapPath string
}

// conflist is vpcni's as deploy/10-vpcni.conflist has it, chaining
// plugins after vpcni.
func conflist(socket string, chained ...string) []byte {
	var extra []map[string]any
	for _, c := range chained {
		extra = append(extra, map[string]any{"type": c, "capabilities": map[string]any{c: true}})
	}
	return testbed.VpcniConfList("1.0.0", "vpcni", socket, extra...)
}

// run runs vpcnictl doctor in the node's namespace and returns its report
// and exit code; after it, no probe namespace is left.
func (n *node) run(t *testing.T, configPath string) (doctor.Report, int) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.ns, filepath.Join(binDir, "vpcnictl"), "doctor",
		"--agent-config", configPath, "--cni-conf-dir", n.confDir, "--cni-bin-dir", n.binDir, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("vpcnictl doctor: %v: %s", err, stderr.String())
	}
	var rep doctor.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("doctor's JSON: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("doctor ran in %s, exit %d", time.Since(start).Round(time.Millisecond), code)
	if left := netnsutil.List(doctor.ProbeNSPrefix); len(left) > 0 {
		t.Errorf("doctor left its probe namespaces: %v", left)
	}
	return rep, code
}

// failing lists the checks that failed.
func failing(rep doctor.Report) []string {
	var out []string
	for _, r := range rep.Results {
		if r.Status == doctor.Fail {
			out = append(out, r.Name)
		}
	}
	return out
}

// expectFault says the fault fails exactly the check named check, with a
// detail that names it (every substring of want), and exit code 1.
func expectFault(t *testing.T, fault string, rep doctor.Report, code int, check string, want ...string) {
	t.Helper()
	expectFaultAlso(t, fault, rep, code, check, nil, want...)
}

// expectFaultAlso is expectFault for a fault that fails the checks also
// too (they follow from it: all.disable_ipv6=1 turns every link's off).
func expectFaultAlso(t *testing.T, fault string, rep doctor.Report, code int, check string, also []string, want ...string) {
	t.Helper()
	if got, all := failing(rep), append([]string{check}, also...); !slices.Equal(got, all) {
		t.Errorf("%s: failing checks %v, want only %q\n%s", fault, got, all, dump(rep))
	}
	r, ok := rep.Find(check)
	if !ok {
		t.Errorf("%s: no check %q ran", fault, check)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.Detail, w) {
			t.Errorf("%s: %s says %q, which does not name %q", fault, check, r.Detail, w)
		}
	}
	if r.Fix == "" {
		t.Errorf("%s: %s says nothing to do", fault, check)
	}
	if code != 1 {
		t.Errorf("%s: exit code %d, want 1", fault, code)
	}
	t.Logf("%s -> %s %s: %s (fix: %s)", fault, r.Name, r.Status, r.Detail, r.Fix)
}

func dump(rep doctor.Report) string {
	var b strings.Builder
	for _, r := range rep.Results {
		fmt.Fprintf(&b, "  %-40s %-4s %s\n", r.Name, r.Status, r.Detail)
	}
	return b.String()
}

// TestPlantedFaults: on a healthy lab node no check fails; then each
// planted fault fails the one check that names it.
func TestPlantedFaults(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcni-dr%d", os.Getpid()%100000), Nodes: 1, Subnet: netip.MustParsePrefix("10.93.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	n := newNode(t, l)

	rep, code := n.run(t, n.configPath)
	if f := failing(rep); len(f) > 0 || code != 0 {
		t.Fatalf("healthy node: failing checks %v, exit %d\n%s", f, code, dump(rep))
	}
	for _, check := range []string{"config", "kernel veth", "sysctl net.ipv4.ip_forward", "sysctl net.ipv4.neigh.eth0.proxy_delay",
		"uplink", "cni conf", "cni plugins", "agent", "cloud login", "cloud subnet", "cloud port", "cloud policy", "cloud limits", "clock neutron"} {
		if r, ok := rep.Find(check); !ok || r.Status != doctor.OK {
			t.Errorf("healthy node: %s is %+v, want ok", check, r)
		}
	}
	// Whatever this kernel lacks is said, with the modes it rules out.
	for _, r := range rep.Results {
		if strings.HasPrefix(r.Name, "kernel ") && r.Status != doctor.OK {
			if !strings.Contains(r.Detail, "rules out datapath") {
				t.Errorf("%s: %q names no mode it rules out", r.Name, r.Detail)
			}
			t.Logf("this kernel: %s %s: %s", r.Name, r.Status, r.Detail)
		}
	}
	// The table: a line per check, each a fix under it when not ok.
	out, err := netnsutil.Output(n.ns, filepath.Join(binDir, "vpcnictl"), "doctor",
		"--agent-config", n.configPath, "--cni-conf-dir", n.confDir, "--cni-bin-dir", n.binDir)
	if err != nil {
		t.Fatalf("vpcnictl doctor (table): %v\n%s", err, out)
	}
	for _, r := range rep.Results {
		if !strings.Contains(out, "\n"+r.Name+" ") {
			t.Errorf("the table has no line for %s:\n%s", r.Name, out)
		}
	}
	t.Logf("healthy node:\n%s", out)

	vpcniConf := filepath.Join(n.confDir, "10-vpcni.conflist")
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The conflist chains no portmap.
	write(vpcniConf, conflist(n.socket, "bandwidth"))
	rep, code = n.run(t, n.configPath)
	expectFault(t, "conflist without portmap", rep, code, "cni plugins", "10-vpcni.conflist", "no portmap")
	write(vpcniConf, conflist(n.socket, "portmap", "bandwidth"))

	// The portmap binary is missing.
	if err := os.Rename(n.portmapPath, n.portmapPath+".away"); err != nil {
		t.Fatal(err)
	}
	rep, code = n.run(t, n.configPath)
	expectFault(t, "portmap binary missing", rep, code, "cni plugins", "portmap", n.binDir)
	if err := os.Rename(n.portmapPath+".away", n.portmapPath); err != nil {
		t.Fatal(err)
	}

	// Another CNI's conflist sorts before vpcni's.
	other := filepath.Join(n.confDir, "05-other.conflist")
	write(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge","bridge":"cni0"}]}`))
	rep, code = n.run(t, n.configPath)
	expectFault(t, "vpcni's conflist shadowed", rep, code, "cni conf", "05-other.conflist", "shadowed")
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}

	// A sysctl the mode needs is off.
	if err := netnsutil.Exec(n.ns, "sysctl", "-qw", "net.ipv4.neigh.eth0.proxy_delay=80"); err != nil {
		t.Fatal(err)
	}
	rep, code = n.run(t, n.configPath)
	expectFault(t, "proxy_delay off", rep, code, "sysctl net.ipv4.neigh.eth0.proxy_delay", "is 80", "needs 0")
	if err := netnsutil.Exec(n.ns, "sysctl", "-qw", "net.ipv4.neigh.eth0.proxy_delay=0"); err != nil {
		t.Fatal(err)
	}

	// A node whose pods get IPv6 too (doctor reads ipFamilies from the
	// config it is given; the agent keeps its own): each IPv6 sysctl
	// routed pods need, off in turn, fails the check that names it.
	dual := n.configDual(t)
	v6 := []string{"net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.eth0.disable_ipv6=0", "net.ipv6.conf.eth0.accept_ra=2",
		"net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.eth0.proxy_ndp=1", "net.ipv6.neigh.eth0.proxy_delay=0"}
	sysctl := func(kv ...string) {
		t.Helper()
		if err := netnsutil.Exec(n.ns, append([]string{"sysctl", "-qw"}, kv...)...); err != nil {
			t.Fatal(err)
		}
	}
	sysctl(v6...)
	rep, code = n.run(t, dual)
	if f := failing(rep); len(f) > 0 || code != 0 {
		t.Errorf("healthy dual-stack node: failing checks %v, exit %d\n%s", f, code, dump(rep))
	}
	for _, fault := range []struct {
		set, check, is string
		also           []string
	}{
		// The kernel writes all/disable_ipv6 to every link too.
		{"net.ipv6.conf.all.disable_ipv6=1", "sysctl net.ipv6.conf.all.disable_ipv6", "is 1", []string{"sysctl net.ipv6.conf.eth0.disable_ipv6"}},
		{"net.ipv6.conf.eth0.disable_ipv6=1", "sysctl net.ipv6.conf.eth0.disable_ipv6", "is 1", nil},
		{"net.ipv6.conf.all.forwarding=0", "sysctl net.ipv6.conf.all.forwarding", "is 0", nil},
		{"net.ipv6.conf.eth0.proxy_ndp=0", "sysctl net.ipv6.conf.eth0.proxy_ndp", "is 0", nil},
		// Taking RAs (1) with forwarding on: the kernel ignores them,
		// and the default route they gave expires.
		{"net.ipv6.conf.eth0.accept_ra=1", "sysctl net.ipv6.conf.eth0.accept_ra", "is 1", nil},
	} {
		sysctl(fault.set)
		rep, code = n.run(t, dual)
		expectFaultAlso(t, fault.set, rep, code, fault.check, fault.also, fault.is, "datapath veth")
		sysctl(v6...)
	}
	sysctl("net.ipv6.conf.all.forwarding=0", "net.ipv6.conf.eth0.proxy_ndp=0")

	// The node's IP has no port: the VM port is not found.
	noPort := netip.MustParsePrefix("10.93.0.0/24").Addr().As4()
	noPort[3] = 99
	rep, code = n.run(t, n.configWith(t, func(o *openstack.Config) { o.NodeIP = netip.AddrFrom4(noPort).String() }))
	expectFault(t, "node IP without port", rep, code, "cloud port", "no Neutron port", "10.93.0.99")

	// The agent is down.
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	rep, code = n.run(t, n.configPath)
	expectFault(t, "agent socket down", rep, code, "agent", "not reachable", n.socket)
}

// newNode runs vpcnid on the lab's node with the openstack provider and
// gives it CNI dirs as a runtime has them: vpcni's conflist chaining
// portmap and bandwidth, and the three plugins (Debian's portmap and
// bandwidth).
func newNode(t *testing.T, l *lab.Lab) *node {
	t.Helper()
	h := l.Nodes[0]
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.NodeName = h.Name
	cfg.SocketPath = filepath.Join(dir, "run", "vpcnid.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.MetricsAddr = ""
	cfg.Kubernetes.Mode = "off"
	cfg.Pool = config.Pool{WarmTarget: 2, BatchSize: 2, MaxFree: 4}
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
	agent, err := testbed.StartAgentIn(dir, h.NS, binDir, cfg)
	if err != nil {
		t.Fatalf("vpcnid on %s: %v", h.Name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(agent.LogPath); err == nil {
				t.Logf("vpcnid log:\n%s", log)
			}
		}
		_ = agent.Stop()
	})
	n := &node{ns: h.NS, agent: agent, configPath: agent.ConfigPath, socket: cfg.SocketPath,
		confDir: filepath.Join(dir, "net.d"), binDir: filepath.Join(dir, "bin")}
	for _, d := range []string{n.confDir, n.binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, src := range []string{filepath.Join(binDir, "vpcni"), "/usr/lib/cni/portmap", "/usr/lib/cni/bandwidth"} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatalf("the plugins a runtime has (Debian's containernetworking-plugins for portmap and bandwidth): %v", err)
		}
		if err := os.WriteFile(filepath.Join(n.binDir, filepath.Base(src)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.portmapPath = filepath.Join(n.binDir, "portmap")
	if err := os.WriteFile(filepath.Join(n.confDir, "10-vpcni.conflist"), conflist(n.socket, "portmap", "bandwidth"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// configDual writes a copy of the agent's config whose pods get IPv4 and
// IPv6, for doctor only.
func (n *node) configDual(t *testing.T) string {
	t.Helper()
	cfg, err := config.Load(n.configPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.IPFamilies = []family.Family{family.V4, family.V6}
	return writeConfig(t, cfg)
}

// configWith writes a copy of the agent's config with its openstack
// section changed, for doctor only (the agent keeps its own).
func (n *node) configWith(t *testing.T, change func(*openstack.Config)) string {
	t.Helper()
	cfg, err := config.Load(n.configPath)
	if err != nil {
		t.Fatal(err)
	}
	change(cfg.Provider.Settings.(*openstack.Config))
	return writeConfig(t, cfg)
}

func writeConfig(t *testing.T, cfg config.Config) string {
	t.Helper()
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vpcnid.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
