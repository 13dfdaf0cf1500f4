// Package conformance names the selections of Kubernetes' own e2e specs
// that test/k8se2e runs against vpcni, and how many specs each must select
// at the Kubernetes version the fixture builds. e2e.test reports A/B of
// whatever its focus matched: a focus that silently matched fewer specs (a
// test renamed or retagged upstream, a typo in a regexp) would still print
// N/N, so a run checks the count before it proves anything.
package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

const (
	// Focus is make conformance's: every [sig-network] test of the
	// conformance suite (the Granular Checks, HostPort, Services, DNS,
	// EndpointSlice, Proxy, …).
	Focus = `\[sig-network\] .*\[Conformance\]`
	// Subset is the Granular Checks and HostPort, which TestTwoNodes runs
	// in make test and make conformance-subset runs alone (the Makefile's
	// CONFORMANCE_SUBSET says the same).
	Subset = `\[sig-network\] Networking Granular Checks: Pods|` +
		`\[sig-network\] HostPort .*\[Conformance\]`
	// Skip leaves out feature-gated tests (SCTP and the like need what
	// the fixture does not turn on) and disruptive ones (they restart the
	// node's components).
	Skip = `\[Feature:|\[Disruptive\]|\[Flaky\]`
	// DualStack is make dualstack's: Kubernetes' dual-stack specs (pods
	// with both families, Services of either and both, the secondary
	// family's Granular Checks), run with DualStackSkip — SCTP and the
	// like need what the fixture does not turn on.
	DualStack     = `\[Feature:IPv6DualStack\]`
	DualStackSkip = `\[Feature:SCTPConnectivity\]|\[Disruptive\]|\[Flaky\]`
)

// selection names a focus with its skip.
type selection struct{ focus, skip string }

// specCounts is how many specs Focus and Subset select, with Skip, by
// Kubernetes version: read from e2e.test's dry run ("N upstream specs
// selected") and from the names a full run listed. A version missing here
// fails the run, so moving the fixture to another Kubernetes means
// counting again, on purpose.
var specCounts = map[string]map[selection]int{
	"1.36.3": {{Focus, Skip}: 47, {Subset, Skip}: 5, {DualStack, DualStackSkip}: 22},
}

// Want is how many specs focus and skip must select at Kubernetes
// version. pinned is false for a selection of the caller's own
// (VPCNI_CONFORMANCE_FOCUS or _SKIP), which only has to select some.
func Want(version, focus, skip string) (n int, pinned bool, err error) {
	sel := selection{focus, skip}
	switch sel {
	case selection{Focus, Skip}, selection{Subset, Skip}, selection{DualStack, DualStackSkip}:
	default:
		return 0, false, nil
	}
	counts, ok := specCounts[version]
	if !ok {
		return 0, true, fmt.Errorf("no spec count is pinned for Kubernetes %s: count what the focus selects there (e2e.test's dry run) and add it to internal/testbed/conformance", version)
	}
	return counts[sel], true, nil
}

// CheckSelected is nil when got, the number of specs focus and skip
// selected, is what they must select at Kubernetes version.
func CheckSelected(version, focus, skip string, got int) error {
	if got == 0 {
		return fmt.Errorf("focus %q (skip %q) selects no upstream spec: the run would prove nothing", focus, skip)
	}
	want, pinned, err := Want(version, focus, skip)
	switch {
	case err != nil:
		return fmt.Errorf("%w (this run selected %d)", err, got)
	case !pinned || got == want:
		return nil
	case got < want:
		return fmt.Errorf("focus %q selects %d upstream specs at Kubernetes %s, %d fewer than the %d pinned: a spec was renamed, retagged or lost, and N/N would hide it", focus, got, version, want-got, want)
	default:
		return fmt.Errorf("focus %q selects %d upstream specs at Kubernetes %s, %d more than the %d pinned: check the new ones and update the count in internal/testbed/conformance", focus, got, version, got-want, want)
	}
}

// fixtureDefault is the line of scripts/k8s-node.sh that sets the
// Kubernetes version the fixture builds unless K8S_VERSION says another.
var fixtureDefault = regexp.MustCompile(`(?m)^K8S_VERSION=\$\{K8S_VERSION:-([0-9]+\.[0-9]+\.[0-9]+)\}$`)

// FixtureVersion is the Kubernetes version the fixture (scripts/k8s-node.sh
// in the repository at repo) builds: $K8S_VERSION, else the script's
// default.
func FixtureVersion(repo string) (string, error) {
	if v := os.Getenv("K8S_VERSION"); v != "" {
		return v, nil
	}
	script := filepath.Join(repo, "scripts", "k8s-node.sh")
	data, err := os.ReadFile(script)
	if err != nil {
		return "", fmt.Errorf("the fixture's Kubernetes version: %w", err)
	}
	m := fixtureDefault.FindSubmatch(data)
	if m == nil {
		return "", errors.New("the fixture's Kubernetes version: no line K8S_VERSION=${K8S_VERSION:-x.y.z} in " + script)
	}
	return string(m[1]), nil
}
