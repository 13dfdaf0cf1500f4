// Package critest runs cri-tools' own networking tests (critest, the CRI
// validation suite, unpatched) against a real containerd whose CNI is
// vpcni: the real-node fixture's containerd (scripts/k8s-node.sh,
// CRI_ONLY=1) inside a lab node's network namespace, vpcnid running in
// that namespace with deploy/'s configuration pointed at the lab's
// Neutron-compatible endpoint, and deploy/10-vpcni.conflist (vpcni,
// portmap, bandwidth) in containerd's CNI conf dir, so the port-mapping
// tests go through vpcni and the portmap it chains.
//
// Not part of `make test`: `make critest` runs it and writes
// critest_passed=C/D to $VPCNI_CONFORMANCE_DIR/critest.result (default
// /var/tmp/vpcni-conformance) for `make conformance`.
package critest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

const (
	labPrefix = "vpcni-critest"
	nodeNS    = labPrefix + "-n1"
	// runDir holds vpcnid's PID record, socket, config and log; stateDir
	// its store. Both are removed at the start (a crashed run's) and end.
	runDir   = "/run/vpcni-critest"
	stateDir = "/var/tmp/vpcni-critest/state"
	// focus selects critest's networking describe,
	// framework.KubeDescribe("Networking") in pkg/validate/networking.go.
	focus = `\[k8s.io\] Networking`
	// wantSpecs is how many specs that describe has in cri-tools v1.36:
	// fewer run means the focus or the suite changed, and the result
	// would not say what it claims.
	wantSpecs = 4
)

var (
	repo   string
	binDir string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("critest against containerd with vpcni")
	wd, _ := os.Getwd()
	repo = filepath.Clean(filepath.Join(wd, "../.."))
	binDir = os.Getenv("VPCNI_BIN")
	if binDir == "" {
		binDir = filepath.Join(repo, "bin")
	}
	os.Exit(m.Run())
}

func run(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func mustRun(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// keyValues reads KEY=value lines (the scripts' interface).
func keyValues(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k != "" && !strings.ContainsAny(k, " []") {
			m[k] = v
		}
	}
	return m
}

func TestCritestNetworking(t *testing.T) {
	t0 := time.Now()
	// An earlier run's figures must not outlive a run that ends before
	// critest reports: such a run writes that none of the specs passed.
	written := false
	writeResult(t, []string{fmt.Sprintf("critest_passed=0/%d", wantSpecs), "critest_error=running"})
	t.Cleanup(func() {
		if !written {
			writeResult(t, []string{fmt.Sprintf("critest_passed=0/%d", wantSpecs), "critest_error=the run ended before critest reported (see make critest's output)"})
		}
	})
	k8sNode := filepath.Join(repo, "scripts/k8s-node.sh")
	vpcnictl := filepath.Join(binDir, "vpcnictl")
	for _, b := range []string{"vpcni", "vpcnid", "vpcnictl", "cni-plugins/portmap", "cni-plugins/bandwidth"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			t.Fatalf("%v (make build; scripts/cni-plugins.sh bin/cni-plugins)", err)
		}
	}

	start := time.Now()
	built := keyValues(mustRun(t, nil, "bash", filepath.Join(repo, "scripts/critest.sh"), "build"))
	t.Logf("critest and its images (cached build): %s", time.Since(start).Round(time.Millisecond))
	critest := built["CRITEST"]
	if critest == "" || built["CRITEST_IMAGES"] == "" {
		t.Fatalf("scripts/critest.sh build said %v", built)
	}

	// A crashed run's leftovers: its node first, while its vpcnid (if it
	// still runs) can answer the sandboxes' DEL; then that vpcnid, by its
	// recorded PID, and its store. (A node another test left is taken
	// down by `up` itself.)
	if ns, _ := os.ReadFile(filepath.Join(fixtureState(), "run/netns")); strings.TrimSpace(string(ns)) == nodeNS {
		if _, err := run(nil, "bash", k8sNode, "down"); err != nil {
			t.Logf("a crashed run's node: %v", err)
		}
	}
	if err := testbed.StopRecorded(runDir); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(runDir)
	_ = os.RemoveAll(filepath.Dir(stateDir))

	// Cleanups run last-registered first: the fixture goes down (its
	// sandboxes' CNI DEL needs vpcnid), then vpcnid, then the lab.
	mustRun(t, nil, vpcnictl, "lab", "up", "--prefix", labPrefix, "--nodes", "1", "--agents=false")
	t.Cleanup(func() { _, _ = run(nil, vpcnictl, "lab", "down", "--prefix", labPrefix) })
	var labState struct {
		SubnetID string `json:"subnetID"`
		Nodes    []struct {
			NS string     `json:"namespace"`
			IP netip.Addr `json:"ip"`
		} `json:"nodes"`
	}
	data, err := os.ReadFile(filepath.Join("/run/vpcni-lab", labPrefix, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &labState); err != nil || len(labState.Nodes) != 1 || labState.Nodes[0].NS != nodeNS {
		t.Fatalf("lab state: %v %s", err, data)
	}

	agent := startAgent(t, labState.SubnetID)
	t.Cleanup(func() {
		if err := agent.Stop(); err != nil {
			t.Errorf("vpcnid: %v", err)
		}
		_ = os.RemoveAll(runDir)
		_ = os.RemoveAll(filepath.Dir(stateDir))
	})

	t.Cleanup(func() {
		out, err := run(nil, "bash", k8sNode, "down")
		if err != nil {
			t.Errorf("k8s-node down: %v", err)
		} else {
			t.Logf("k8s-node down: %s", lastLine(out))
		}
	})
	start = time.Now()
	env := keyValues(mustRun(t, []string{"NETNS=" + nodeNS, "CRI_ONLY=1", "IMAGES=" + built["CRITEST_IMAGES"]}, "bash", k8sNode, "up"))
	t.Logf("containerd up in %s (node %s, %s)", time.Since(start).Round(time.Millisecond), nodeNS, env["VPCNI_K8S_NODE_IP"])
	sock := env["VPCNI_K8S_CONTAINERD_SOCK"]
	if sock == "" {
		t.Fatalf("k8s-node.sh up printed no containerd socket: %v", env)
	}
	installCNI(t, env["VPCNI_K8S_CNI_BIN_DIR"], env["VPCNI_K8S_CNI_CONF_DIR"], agent.Config.SocketPath)
	waitNetworkReady(t, k8sNode)

	// Nothing in the node listens on the hostPort: an answer there comes
	// through portmap's DNAT to the pod.
	if out := mustRun(t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", "ss", "-Htln", "sport = :12000"); strings.TrimSpace(out) != "" {
		t.Fatalf("something in %s already listens on the hostPort critest maps (12000):\n%s", nodeNS, out)
	}
	// The addresses vpcnid hands out while critest runs, to check that the
	// pod address critest fetched from was vpcni's.
	seen := map[netip.Addr]bool{}
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if st, err := agent.State(); err == nil {
				for _, a := range st.Allocations {
					seen[a.Address] = true
				}
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	// critest runs in the node's namespace: its port-mapping checks fetch
	// pod-IP:80 and 127.0.0.1:hostPort from where containerd runs.
	report := filepath.Join(runDir, "critest-junit.xml")
	start = time.Now()
	cmd := exec.Command("nsenter", "--net=/run/netns/"+nodeNS, "--", critest,
		"--runtime-endpoint=unix://"+sock, "--image-endpoint=unix://"+sock,
		"--ginkgo.focus="+focus, "--ginkgo.junit-report="+report, "--ginkgo.v", "--ginkgo.no-color")
	cmd.Dir = runDir // critest looks for a crictl.yaml in its working directory
	out, runErr := cmd.CombinedOutput()
	elapsed := time.Since(start).Round(time.Millisecond)
	logPath := filepath.Join(os.TempDir(), "vpcni-critest.log")
	_ = os.WriteFile(logPath, out, 0o644)
	t.Logf("critest ran in %s (exit: %v; output in %s)", elapsed, runErr, logPath)
	close(stopWatch)
	<-watched
	checkThroughVpcni(t, agent, string(out), seen)

	specs, err := readJUnit(report)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	passed := 0
	var names []string
	for _, s := range specs {
		fmt.Printf("critest: %-7s %s\n", strings.ToUpper(s.Status), s.Name)
		names = append(names, s.Status+" "+s.Name)
		if s.Status == "passed" {
			passed++
		} else {
			t.Errorf("critest %s: %s\n%s", s.Status, s.Name, s.Detail)
		}
	}
	summary := fmt.Sprintf("critest_passed=%d/%d", passed, len(specs))
	written = true
	writeResult(t, []string{
		summary,
		"critest_version=" + built["CRITEST_VERSION"],
		"critest_focus=" + focus,
		"critest_seconds=" + fmt.Sprintf("%.1f", time.Since(t0).Seconds()),
		"critest_specs=" + strings.Join(names, "; "),
	})
	if len(specs) != wantSpecs {
		t.Errorf("critest ran %d networking specs, want %d (the focus or cri-tools changed)", len(specs), wantSpecs)
	}
	if runErr != nil && passed == len(specs) {
		t.Errorf("critest exited with %v although every spec passed:\n%s", runErr, out)
	}
	if t.Failed() {
		dumpAgentLog(t, agent)
	}
	fmt.Printf("critest: passed=%d/%d\n", passed, len(specs))
}

// startAgent runs vpcnid in the node's namespace with deploy/vpcnid.yaml,
// changed only where this node differs from a DaemonSet's: its own paths,
// the lab's endpoint without Keystone and the lab's subnet, and no
// Kubernetes API (no kubelet or API server runs: critest talks to
// containerd alone).
func startAgent(t *testing.T, subnetID string) *testbed.Agent {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "deploy/vpcnid.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		t.Fatalf("deploy/vpcnid.yaml: %v", err)
	}
	cfg.NodeName = nodeNS
	cfg.SocketPath = filepath.Join(runDir, "vpcnid.sock")
	cfg.StateDir = stateDir
	cfg.Kubernetes.Mode = "off"
	// The DaemonSet's is the node's address from the kubelet
	// (VPCNI_HOST_IP); no kubelet runs here.
	cfg.MetricsAddr = "127.0.0.1:9695"
	oc, ok := cfg.Provider.Settings.(*openstack.Config)
	if !ok {
		t.Fatalf("deploy/vpcnid.yaml: provider %s (%T), want openstack", cfg.Provider.Type, cfg.Provider.Settings)
	}
	oc.CredentialsFile = ""
	oc.Endpoint = fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort)
	oc.ComputeEndpoint = fmt.Sprintf("http://127.0.0.1:%d%s", lab.EndpointPort, lab.ComputePath)
	oc.SubnetID = subnetID
	a, err := testbed.StartAgentIn(runDir, nodeNS, binDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vpcnid runs in %s (pid %d, socket %s, provider %s mode %s)", nodeNS, a.Pid(), cfg.SocketPath, cfg.Provider.Type, oc.Mode)
	return a
}

// installCNI does what the DaemonSet's install-cni step does on a node:
// the vpcni plugin and the portmap and bandwidth it chains into the bin
// dir, deploy/10-vpcni.conflist (its socket pointed at this agent's) into
// the conf dir. Written inside net.d under a name containerd skips, then
// renamed there: containerd 1.6 misses a file moved in from elsewhere.
func installCNI(t *testing.T, binDst, confDir, socket string) {
	t.Helper()
	if binDst == "" || confDir == "" {
		t.Fatal("k8s-node.sh printed no CNI dirs")
	}
	for src, dst := range map[string]string{"vpcni": "vpcni", "cni-plugins/portmap": "portmap", "cni-plugins/bandwidth": "bandwidth"} {
		data, err := os.ReadFile(filepath.Join(binDir, src))
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(binDst, "."+dst+".tmp")
		if err := os.WriteFile(tmp, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(binDst, dst)); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(repo, "deploy/10-vpcni.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	plugins, _ := conf["plugins"].([]any)
	var types []string
	for _, p := range plugins {
		m, _ := p.(map[string]any)
		if m["type"] == "vpcni" {
			m["socket"] = socket
		}
		types = append(types, fmt.Sprint(m["type"]))
	}
	if strings.Join(types, ",") != "vpcni,portmap,bandwidth" {
		t.Fatalf("deploy/10-vpcni.conflist chains %v; this test expects vpcni, portmap, bandwidth", types)
	}
	out, _ := json.MarshalIndent(conf, "", "  ")
	tmp := filepath.Join(confDir, ".10-vpcni.conflist.tmp")
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(confDir, "10-vpcni.conflist")); err != nil {
		t.Fatal(err)
	}
}

// waitNetworkReady waits until containerd's CRI status says it loaded the
// conflist (NetworkReady), so the first sandbox does not race it.
func waitNetworkReady(t *testing.T, k8sNode string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, _ = run(nil, "bash", k8sNode, "crictl", "info")
		var info struct {
			Status struct {
				Conditions []struct {
					Type   string `json:"type"`
					Status bool   `json:"status"`
				} `json:"conditions"`
			} `json:"status"`
		}
		if json.Unmarshal([]byte(out), &info) != nil {
			continue
		}
		for _, c := range info.Status.Conditions {
			if c.Type == "NetworkReady" && c.Status {
				return
			}
		}
	}
	t.Fatalf("containerd did not load vpcni's conflist within 30s:\n%s", out)
}

// checkThroughVpcni checks that critest's sandboxes had their network from
// vpcni: the pod address critest fetched from (it logs "the IP:port is
// http://…") was one vpcnid handed out, and every sandbox's DEL reached
// vpcnid (critest removes its sandboxes; no allocation is left).
func checkThroughVpcni(t *testing.T, a *testbed.Agent, out string, seen map[netip.Addr]bool) {
	t.Helper()
	var addrs []netip.Addr
	for a := range seen {
		addrs = append(addrs, a)
	}
	t.Logf("vpcnid allocated %v while critest ran", addrs)
	m := regexp.MustCompile(`the IP:port is http://([0-9.]+):80\b`).FindStringSubmatch(out)
	if m == nil {
		t.Errorf("critest did not say which pod address it fetched from (its output changed?)")
	} else if ip, err := netip.ParseAddr(m[1]); err != nil || !seen[ip] {
		t.Errorf("critest fetched from %s, not an address vpcnid handed out (%v)", m[1], addrs)
	}
	st, err := a.State()
	if err != nil {
		t.Errorf("vpcnid state: %v", err)
	} else if len(st.Allocations) != 0 {
		t.Errorf("vpcnid still holds %d allocations after critest removed its sandboxes: %+v", len(st.Allocations), st.Allocations)
	}
}

// spec is one critest spec as its JUnit report has it.
type spec struct {
	Name, Status, Detail string
}

// readJUnit returns the networking specs of critest's JUnit report (the
// suite's setup nodes and the specs the focus filtered out left aside).
func readJUnit(path string) ([]spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("critest wrote no report: %w", err)
	}
	var r struct {
		Suites []struct {
			Cases []struct {
				Name    string `xml:"name,attr"`
				Status  string `xml:"status,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				SystemErr string `xml:"system-err"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("critest report %s: %w", path, err)
	}
	var specs []spec
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if !regexp.MustCompile(focus).MatchString(c.Name) {
				continue
			}
			// ginkgo marks a spec the focus left out "skipped" with the
			// message "skipped"; a networking spec that ran and called
			// Skip has a reason and is counted.
			if c.Status == "skipped" && c.Skipped != nil && c.Skipped.Message == "skipped" {
				continue
			}
			d := ""
			if c.Failure != nil {
				d = c.Failure.Message + "\n" + c.Failure.Text
			} else if c.Skipped != nil {
				d = c.Skipped.Message
			}
			specs = append(specs, spec{Name: strings.TrimPrefix(c.Name, "[It] "), Status: c.Status, Detail: d})
		}
	}
	return specs, nil
}

// writeResult writes the figures `make conformance` reads.
func writeResult(t *testing.T, lines []string) {
	t.Helper()
	dir := os.Getenv("VPCNI_CONFORMANCE_DIR")
	if dir == "" {
		dir = "/var/tmp/vpcni-conformance"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "critest.result")
	if err := os.WriteFile(path+".tmp", []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s", path)
}

func dumpAgentLog(t *testing.T, a *testbed.Agent) {
	if a.LogPath == "" {
		return
	}
	log, _ := os.ReadFile(a.LogPath)
	if len(log) > 8000 {
		log = log[len(log)-8000:]
	}
	t.Logf("vpcnid log (tail):\n%s", log)
}

// fixtureState is scripts/k8s-node.sh's state dir.
func fixtureState() string {
	if d := os.Getenv("VPCNI_K8S_STATE"); d != "" {
		return d
	}
	return "/var/tmp/vpcni-k8s"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
