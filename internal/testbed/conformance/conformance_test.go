package conformance

import (
	"strings"
	"testing"
)

func TestCheckSelected(t *testing.T) {
	const own = `\[sig-network\] Services .*\[Conformance\]`
	for _, c := range []struct {
		version, focus, skip string
		got                  int
		want                 string // "" for nil, else a part of the error
	}{
		{"1.36.3", Focus, Skip, 47, ""},
		{"1.36.3", Focus, Skip, 46, "1 fewer than the 47 pinned"},
		{"1.36.3", Focus, Skip, 12, "35 fewer"},
		{"1.36.3", Focus, Skip, 48, "1 more than the 47 pinned"},
		{"1.36.3", Focus, Skip, 0, "selects no upstream spec"},
		{"1.36.3", Subset, Skip, 5, ""},
		{"1.36.3", Subset, Skip, 4, "1 fewer than the 5 pinned"},
		{"1.36.3", DualStack, DualStackSkip, 22, ""},
		{"1.36.3", DualStack, DualStackSkip, 21, "1 fewer than the 22 pinned"},
		// The dual-stack focus with another skip is the operator's own.
		{"1.36.3", DualStack, Skip, 0, "selects no upstream spec"},
		{"1.36.3", DualStack, `\[Disruptive\]`, 23, ""},
		// A selection of the operator's own: any, but not none.
		{"1.36.3", own, Skip, 3, ""},
		{"1.36.3", own, Skip, 0, "selects no upstream spec"},
		{"1.36.3", Focus, `\[Flaky\]`, 50, ""},
		// Another Kubernetes: count again before the run counts.
		{"1.37.0", Focus, Skip, 47, "no spec count is pinned for Kubernetes 1.37.0"},
		{"1.37.0", Subset, Skip, 5, "this run selected 5"},
		{"1.37.0", own, Skip, 3, ""},
	} {
		err := CheckSelected(c.version, c.focus, c.skip, c.got)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckSelected(%s, %q, %q, %d) = %v, want %q", c.version, c.focus, c.skip, c.got, err, c.want)
		}
	}
}

// TestFixtureVersionIsPinned: the Kubernetes version scripts/k8s-node.sh
// builds by default has its counts, so a bump of the fixture fails here
// (make unit) before a conformance run would.
func TestFixtureVersionIsPinned(t *testing.T) {
	t.Setenv("K8S_VERSION", "")
	v, err := FixtureVersion("../../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, sel := range []selection{{Focus, Skip}, {Subset, Skip}, {DualStack, DualStackSkip}} {
		if n, pinned, err := Want(v, sel.focus, sel.skip); err != nil || !pinned || n == 0 {
			t.Errorf("Want(%s, %q, %q) = %d, %v, %v; want a pinned count", v, sel.focus, sel.skip, n, pinned, err)
		}
	}
	t.Setenv("K8S_VERSION", "1.99.1")
	if v, err := FixtureVersion("../../.."); v != "1.99.1" || err != nil {
		t.Errorf("with K8S_VERSION=1.99.1: %q, %v", v, err)
	}
	t.Setenv("K8S_VERSION", "")
	if _, err := FixtureVersion(t.TempDir()); err == nil {
		t.Error("a repository without scripts/k8s-node.sh gave a version")
	}
}
