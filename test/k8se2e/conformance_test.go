package k8se2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/testbed/conformance"
)

// The focus of `make conformance`: every [sig-network] test of Kubernetes'
// conformance suite (47 at v1.36.3). `make conformance-subset` narrows it
// (VPCNI_CONFORMANCE_FOCUS) to conformanceSubset, the Granular Checks and
// HostPort, which TestTwoNodes runs in `make test`. How many specs each
// must select is pinned by Kubernetes version in
// internal/testbed/conformance.
const (
	conformanceFocus  = conformance.Focus
	conformanceSubset = conformance.Subset
	conformanceSkip   = conformance.Skip
)

// TestConformance runs e2e.test — built from k8s.io/kubernetes at the
// fixture's version by scripts/conformance.sh, upstream tests as they are —
// against two real nodes (the control plane and a kubelet in lab node 1,
// a second kubelet joined from lab node 2) with vpcni installed from
// deploy/, inside the first node's network namespace (the API server
// listens only there). It writes the figures `make conformance` prints
// (VPCNI_CONFORMANCE_RESULTS) and fails when any selected upstream test
// fails.
func TestConformance(t *testing.T) {
	if os.Getenv("VPCNI_CONFORMANCE") == "" {
		t.Skip("vpcni-test: Kubernetes' conformance tests run from make conformance (VPCNI_CONFORMANCE=1); NOT RUN here")
	}
	focus := envOr("VPCNI_CONFORMANCE_FOCUS", conformanceFocus)
	skip := envOr("VPCNI_CONFORMANCE_SKIP", conformanceSkip)
	conformanceBuild(t, "build")
	// The kubelets point pods at the cluster DNS Service, which CoreDNS
	// (built by conformance.sh) serves once vpcni wires its pod: the DNS
	// tests need it, and so do others (the Services tests resolve Service
	// names). Only the subset's tests are known to do without.
	subset := regexp.MustCompile(conformanceSubset)
	withDNS := slices.ContainsFunc(selectedSpecs(t, focus, skip), func(name string) bool { return !subset.MatchString(name) })
	if withDNS {
		conformanceBuild(t, "build-coredns")
		t.Setenv("CLUSTER_DNS", clusterDNS)
	}
	n := upNodes(t, 2)
	n.overlay = n.writeOverlay("30s", 128, false)
	// The image's portmap serves the HostPort tests, as on nodes without
	// their own.
	n.dropNodeChainedPlugins()
	n.installAll()
	n.runUpstreamE2E(focus, skip, envOr("VPCNI_CONFORMANCE_RESULTS", "/var/tmp/vpcni-conformance"), withDNS)
}

// selectedSpecs are the names of the upstream specs focus and skip select,
// from a dry run of e2e.test (which asks no cluster). None is a fault (the
// run would prove nothing), and so is a count other than the one pinned
// for the fixture's Kubernetes (conformance.CheckSelected): it fails here,
// before the long run.
func selectedSpecs(t *testing.T, focus, skip string) []string {
	report := filepath.Join(t.TempDir(), "dry-run.json")
	mustRun(t, nil, filepath.Join(conformanceCache(t), "bin", "e2e.test"), "--provider=local", "--ginkgo.dry-run",
		"--ginkgo.focus="+focus, "--ginkgo.skip="+skip, "--ginkgo.json-report="+report, "--ginkgo.no-color")
	specs, _, err := readGinkgoReport(report)
	if err != nil {
		t.Fatalf("e2e.test's dry run: %v", err)
	}
	var names []string
	for _, s := range specs {
		names = append(names, s.name)
	}
	t.Logf("vpcni-test: %d upstream specs selected (focus %q, skip %q)", len(names), focus, skip)
	if err := conformance.CheckSelected(k8sVersion(t), focus, skip, len(names)); err != nil {
		t.Fatalf("vpcni-test: %v", err)
	}
	return names
}

// k8sVersion is the Kubernetes version the fixture builds.
func k8sVersion(t *testing.T) string {
	v, err := conformance.FixtureVersion(repo)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// conformanceCache is where scripts/conformance.sh keeps e2e.test and the
// images (beside the fixture's build).
func conformanceCache(t *testing.T) string {
	return filepath.Join(envOr("VPCNI_K8S_CACHE", "/var/cache/vpcni-k8s"), k8sVersion(t))
}

// conformanceBuild runs scripts/conformance.sh's build step what (build:
// e2e.test, agnhost and the images; build-coredns: CoreDNS), each a no-op
// while its cache is current.
func conformanceBuild(t *testing.T, what string) {
	start := time.Now()
	mustRun(t, nil, "bash", filepath.Join(repo, "scripts/conformance.sh"), what)
	t.Logf("conformance.sh %s: %s", what, time.Since(start).Round(time.Millisecond))
}

// runUpstreamE2E runs Kubernetes' e2e.test with focus and skip against the
// cluster, where vpcni already serves every node: the framework's images
// go into every node's containerd first (every pod it makes uses
// IfNotPresent, so nothing is pulled), and CoreDNS behind clusterDNS
// with the DNS tests. Every selected spec is logged by name with its
// outcome (`k8s-e2e PASS|SKIP|FAIL …`); results gets e2e.log, ginkgo's
// JSON report, JUnit and k8s.result (k8s_passed=A/B). The test fails
// unless every selected spec passed and the focus selected as many as are
// pinned for the fixture's Kubernetes (conformance.CheckSelected).
func (n *node) runUpstreamE2E(focus, skip, results string, withDNS bool) {
	t := n.t
	cache := conformanceCache(t)
	// No result of an earlier run may stand for this one.
	if err := os.MkdirAll(results, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"k8s.result", "e2e-report.json", "e2e.log"} {
		_ = os.Remove(filepath.Join(results, f))
	}
	images := []string{"agnhost.tar", "e2e-busybox.tar", "e2e-pause.tar", "e2e-nginx.tar"}
	if withDNS {
		images = append(images, "glibc-dns-testing.tar", "coredns.tar")
	}
	for _, f := range images {
		n.importAll(filepath.Join(cache, "images", f))
	}
	if withDNS {
		coredns, err := os.ReadFile(filepath.Join(cache, "images", "coredns.name"))
		if err != nil {
			t.Fatal(err)
		}
		n.apply(fmt.Sprintf(corednsManifest, strings.TrimSpace(string(coredns)), clusterDNS))
		n.waitReady("kube-system", "k8s-app=kube-dns", 1, 2*time.Minute)
		t.Logf("vpcni-test: CoreDNS Ready behind %s", clusterDNS)
	}

	// e2e.test must end, and report, while this test still has time to
	// take the cluster down: go test's own timeout kills the binary
	// without running the cleanups, leaving both nodes running.
	timeout := 75 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = min(timeout, time.Until(d)-3*time.Minute)
		if timeout < time.Minute {
			t.Fatalf("%s left before go test's timeout: too little for the upstream tests and the teardown", time.Until(d).Round(time.Second))
		}
	}
	report := filepath.Join(results, "e2e-report.json")
	logf, err := os.Create(filepath.Join(results, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := []string{"--net=/run/netns/" + nodeNS, "--", filepath.Join(cache, "bin", "e2e.test"),
		"--provider=local", "--kubeconfig=" + n.env["VPCNI_K8S_KUBECONFIG"],
		"--ginkgo.focus=" + focus, "--ginkgo.skip=" + skip,
		"--ginkgo.json-report=" + report, "--ginkgo.no-color", "--ginkgo.v", "--ginkgo.timeout=" + timeout.String(),
		// No cluster/log-dump.sh here; the fixture keeps its own logs.
		"--dump-logs-on-failure=false",
		"--report-dir=" + results,
	}
	// Past ginkgo's own timeout (it reports what ran), the process is
	// killed.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = results
	start := time.Now()
	runErr := cmd.Run()
	took := time.Since(start).Round(time.Second)

	specs, willRun, err := readGinkgoReport(report)
	if err != nil {
		t.Fatalf("e2e.test (%v, log %s): no report: %v", runErr, logf.Name(), err)
	}
	var passed, failed, skipped []string
	for _, s := range specs {
		switch s.state {
		case "passed":
			passed = append(passed, s.name)
		case "skipped":
			skipped = append(skipped, s.name+" — "+s.message)
		default:
			failed = append(failed, s.name+" — "+s.state+": "+s.message)
		}
	}
	for _, s := range passed {
		t.Logf("k8s-e2e PASS %s", s)
	}
	for _, s := range skipped {
		t.Logf("k8s-e2e SKIP %s", s)
	}
	for _, s := range failed {
		t.Logf("k8s-e2e FAIL %s", s)
	}
	total := len(passed) + len(failed) + len(skipped)
	// An interrupted run never attempted some selected specs: they count
	// as not passed.
	total = max(total, willRun)
	line := fmt.Sprintf("k8s_passed=%d/%d", len(passed), total)
	if err := os.WriteFile(filepath.Join(results, "k8s.result"), []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("k8s-e2e: %s failed=%d skipped=%d on %d nodes in %s (focus %q, skip %q; log %s)", line, len(failed), len(skipped), len(n.envs()), took, focus, skip, logf.Name())
	if total == 0 {
		t.Fatalf("the focus selected no upstream test: nothing was proved (e2e.test: %v)", runErr)
	}
	if err := conformance.CheckSelected(k8sVersion(t), focus, skip, total); err != nil {
		t.Errorf("k8s-e2e: %v", err)
	}
	if len(failed) > 0 || len(skipped) > 0 {
		n.dumpOnFailure()
		t.Errorf("%d upstream tests failed and %d skipped at run time (each is a vpcni bug or a known limit: docs/development.md)", len(failed), len(skipped))
	} else if runErr != nil {
		t.Errorf("e2e.test exited with %v though every spec passed (log %s)", runErr, logf.Name())
	}
}

// clusterDNS is the kube-dns Service's address in the fixture's Service
// CIDR (10.96.0.0/16), the tenth as kubeadm picks it.
const clusterDNS = "10.96.0.10"

// corednsManifest is CoreDNS as a cluster runs it for Kubernetes' DNS
// tests: the kubernetes plugin only, no forwarding (nothing outside the
// lab is ever asked), on the pod network (vpcni wires it).
const corednsManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
        - name: coredns
          image: %s
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
            periodSeconds: 2
          volumeMounts: [{name: config, mountPath: /etc/coredns}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: %s
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
`

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type specResult struct{ name, state, message string }

// readGinkgoReport reads ginkgo's JSON report: the specs that ran or were
// skipped at run time, and how many the focus selected. Specs the focus left out are reported as skipped
// too, but never attempted (NumAttempts 0); they are not counted.
func readGinkgoReport(path string) ([]specResult, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var suites []struct {
		PreRunStats struct{ SpecsThatWillRun int }
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			NumAttempts             int
			Failure                 *struct{ Message string }
		}
	}
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, 0, err
	}
	var out []specResult
	willRun := 0
	for _, s := range suites {
		willRun += s.PreRunStats.SpecsThatWillRun
		for _, r := range s.SpecReports {
			if r.LeafNodeType != "It" {
				continue // suite setup and report nodes
			}
			msg := ""
			if r.Failure != nil {
				msg = strings.Join(strings.Fields(r.Failure.Message), " ")
			}
			if r.State == "skipped" && r.NumAttempts == 0 {
				continue // left out by the focus
			}
			if len(msg) > 300 {
				msg = msg[:300] + "…"
			}
			name := strings.Join(append(append([]string{}, r.ContainerHierarchyTexts...), r.LeafNodeText), " ")
			out = append(out, specResult{name: name, state: r.State, message: msg})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, willRun, nil
}

// TestDualStackConformance runs e2e.test's dual-stack specs
// (conformance.DualStack, SCTP left out) and then the [sig-network]
// conformance set, unpatched, on the two-node dual-stack cluster with vpcni
// giving every pod an address of each family (make dualstack). The results
// go to dualstack/ and dualstack-conformance/ under
// VPCNI_CONFORMANCE_RESULTS, whose k8s.result lines `make dualstack`
// joins into its closing line.
func TestDualStackConformance(t *testing.T) {
	if os.Getenv("VPCNI_DUALSTACK") == "" {
		t.Skip("vpcni-test: Kubernetes' dual-stack tests run from make dualstack (VPCNI_DUALSTACK=1); NOT RUN here")
	}
	results := envOr("VPCNI_CONFORMANCE_RESULTS", "/var/tmp/vpcni-conformance")
	conformanceBuild(t, "build")
	conformanceBuild(t, "build-coredns")
	for _, sel := range [][2]string{{conformance.DualStack, conformance.DualStackSkip}, {conformanceFocus, conformanceSkip}} {
		selectedSpecs(t, sel[0], sel[1])
	}
	t.Setenv("CLUSTER_DNS", clusterDNS)
	n := upDualStack(t, 2)
	n.overlay = n.writeOverlay("30s", 128, false)
	n.dropNodeChainedPlugins()
	n.installAll()
	n.runUpstreamE2E(conformance.DualStack, conformance.DualStackSkip, filepath.Join(results, "dualstack"), true)
	n.runUpstreamE2E(conformanceFocus, conformanceSkip, filepath.Join(results, "dualstack-conformance"), true)
}
