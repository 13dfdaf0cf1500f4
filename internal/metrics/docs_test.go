package metrics_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const repoRoot = "../.."

var (
	docMetric = regexp.MustCompile(`\bvpcni_[a-z0-9_]*[a-z0-9]\b`)
	eventLit  = regexp.MustCompile(`"(Vpcni[A-Z][A-Za-z]+)"`)
	docEvent  = regexp.MustCompile(`\bVpcni[A-Z][A-Za-z]+\b`)
	// notMetrics are vpcni_ names the documents use for something else;
	// each must still be in the code.
	notMetrics = map[string]bool{
		"vpcni_snat":             true, // the SNAT nftables table
		"vpcni_svcpath":          true, // the service path's nftables table
		"vpcni_ready_s":          true, // a figure the node e2e's benchmark prints
		"vpcni_p99_s":            true, // figures of the pod-startup benchmark (test/k8se2e)
		"vpcni_total_s":          true,
		"vpcni_p99_iqr_s":        true,
		"vpcni_total_iqr_s":      true,
		"vpcni_over_floor_p99_s": true,
		"vpcni_add_p99_ms":       true,
		"vpcni_address_p99_ms":   true,
		"vpcni_wire_p99_ms":      true,
		"vpcni_addresses":        true, // a key of bench cni's summary line
		"vpcni_uplink":           true, // datapath ebpf's tc program on the uplink
		"vpcni_pod":              true, // datapath ebpf's tc program on a host veth
	}
)

// docs is every operator document: the READMEs and docs/.
func docs(t *testing.T) map[string]string {
	t.Helper()
	paths := []string{"README.md", "deploy/README.md"}
	more, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		rel, _ := filepath.Rel(repoRoot, p)
		paths = append(paths, rel)
	}
	out := map[string]string{}
	for _, p := range paths {
		data, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			t.Fatal(err)
		}
		out[p] = string(data)
	}
	return out
}

// goSource is the text of the Go code, by path: the shipped code, and
// with tests also the tests (test/ included).
func goSource(t *testing.T, tests bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	dirs := []string{"cmd", "internal"}
	if tests {
		dirs = append(dirs, "test")
	}
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || !tests && strings.HasSuffix(p, "_test.go") {
				return err
			}
			data, err := os.ReadFile(p)
			out[p] = string(data)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestDocsNameRealMetricsAndEvents: every vpcni_ metric and Vpcni Event
// reason a document names is one the code has, and every Event reason the
// code emits is explained in docs/troubleshooting.md and listed in
// docs/observability.md.
func TestDocsNameRealMetricsAndEvents(t *testing.T) {
	byName := served(t)
	src := goSource(t, false)
	all := goSource(t, true)
	inCode := func(s string) bool {
		for _, text := range all {
			if strings.Contains(text, s) {
				return true
			}
		}
		return false
	}
	reasons := map[string]bool{}
	for _, text := range src {
		for _, m := range eventLit.FindAllStringSubmatch(text, -1) {
			reasons[m[1]] = true
		}
	}
	// Alert names (deploy/prometheus) read like Event reasons; they are
	// checked against the rule file instead (alerts_test.go), and must not
	// reuse a reason's name.
	alerts := map[string]bool{}
	for _, r := range readAlerts(t) {
		if reasons[r.Alert] {
			t.Errorf("alert %s has the name of an Event reason", r.Alert)
		}
		alerts[r.Alert] = true
	}
	documents := docs(t)
	for path, text := range documents {
		for _, name := range docMetric.FindAllString(text, -1) {
			if _, ok := resolve(byName, name); ok {
				continue
			}
			if notMetrics[name] && inCode(name) {
				continue
			}
			t.Errorf("%s names %s: no binary serves that metric", path, name)
		}
		for _, r := range docEvent.FindAllString(text, -1) {
			if !reasons[r] && !alerts[r] {
				t.Errorf("%s names the Event reason %s: the code has no such reason", path, r)
			}
		}
	}
	if len(reasons) < 10 {
		t.Fatalf("found %d Event reasons in the code: the scan is broken", len(reasons))
	}
	for r := range reasons {
		for _, doc := range []string{"docs/troubleshooting.md", "docs/observability.md"} {
			if !strings.Contains(documents[doc], r) {
				t.Errorf("the code emits Event reason %s, which %s does not mention", r, doc)
			}
		}
	}
}
