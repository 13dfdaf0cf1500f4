package deptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The binaries vpcni ships (make build, the image).
var binaries = []string{
	"github.com/vpcni/vpcni/cmd/vpcni",
	"github.com/vpcni/vpcni/cmd/vpcnid",
	"github.com/vpcni/vpcni/cmd/vpcnictl",
	"github.com/vpcni/vpcni/cmd/vpcni-controller",
	"github.com/vpcni/vpcni/cmd/kubectl-vpcni",
}

// A test helper that imports testing (the provider contract): the walk must
// find testing from it, or the check below could pass without looking.
const knownTestingUser = "github.com/vpcni/vpcni/internal/provider/providertest"

// Shipped binaries never link "testing": a package that does is test code
// (a fake, a contract suite) that has leaked into production, with its
// flags and helpers. The failure names the import chain to cut.
func TestBinariesDoNotLinkTesting(t *testing.T) {
	imports := importGraph(t, append(slices.Clone(binaries), knownTestingUser)...)
	if chain := pathTo(imports, knownTestingUser, "testing"); chain == nil {
		t.Fatalf("the walk does not find testing from %s, which imports it: the check is broken", knownTestingUser)
	}
	for _, bin := range binaries {
		if _, ok := imports[bin]; !ok {
			t.Fatalf("go list did not list %s", bin)
		}
		if chain := pathTo(imports, bin, "testing"); chain != nil {
			t.Errorf("%s links testing: %s", bin, strings.Join(chain, " -> "))
		}
	}
}

// importGraph maps every package the roots depend on (and the roots) to
// its direct imports, from one `go list -deps`.
func importGraph(t *testing.T, roots ...string) map[string][]string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatal("no go command to list the binaries' dependencies with")
		}
	}
	args := append([]string{"list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}, roots...)
	out, err := exec.Command(goBin, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			g[f[0]] = f[1:]
		}
	}
	return g
}

// pathTo is the shortest import chain from one package to another, or nil.
func pathTo(imports map[string][]string, from, to string) []string {
	parent := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for ; p != ""; p = parent[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := parent[q]; !seen {
				parent[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// Every package of the module that imports testing outside its _test.go
// files is a test helper, named for it ("…test", like net/http/httptest):
// testing never creeps into a package a binary might import next.
func TestOnlyTestHelpersImportTesting(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}} {{.Name}}{{range .Imports}} {{.}}{{end}}`, "github.com/vpcni/vpcni/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !slices.Contains(f[2:], "testing") {
			continue
		}
		found = found || f[0] == knownTestingUser
		if !strings.HasSuffix(f[1], "test") && !strings.Contains(f[0], "/test/") {
			t.Errorf("%s (package %s) imports testing but is no test helper: move that code into a _test.go file or a …test package", f[0], f[1])
		}
	}
	if !found {
		t.Fatalf("go list did not show %s importing testing: the check is broken", knownTestingUser)
	}
}

// Each binary links only its own side: vpcnid no controller reconciler
// and no cluster-side cloud door, vpcni-controller no datapath, agent or
// doctor. The failure names the import chain to cut. Each package named
// is linked by some binary: the walk must find it, or the check could
// pass without looking.
func TestEachBinaryLinksOnlyItsSide(t *testing.T) {
	const mod = "github.com/vpcni/vpcni/"
	controllerOnly := []string{"internal/controller", "internal/cloudconfig", "internal/routes", "internal/leaks",
		"internal/floatingip", "internal/provider/openstack/cluster", "internal/provider/aws/cluster", "internal/doctor"}
	agentOnly := []string{"internal/agent", "internal/addresses", "internal/store", "internal/datapath", "internal/k8s/nodeside",
		"internal/config", "internal/doctor"}
	imports := importGraph(t, binaries...)
	for _, p := range append(slices.Clone(controllerOnly), agentOnly...) {
		if !slices.ContainsFunc(binaries, func(bin string) bool { return pathTo(imports, bin, mod+p) != nil }) {
			t.Fatalf("the walk finds %s from no binary, though one links it: the check is broken", p)
		}
	}
	// The kubectl plugin on a workstation talks to the API server only:
	// neither side, and no cloud.
	clouds := []string{"internal/provider", "internal/k8s"}
	for bin, banned := range map[string][]string{"cmd/vpcnid": controllerOnly, "cmd/vpcni-controller": agentOnly,
		"cmd/kubectl-vpcni": slices.Concat(controllerOnly, agentOnly, clouds)} {
		for _, p := range banned {
			if chain := pathTo(imports, mod+bin, mod+p); chain != nil {
				t.Errorf("%s links %s: %s", bin, p, strings.Join(chain, " -> "))
			}
		}
	}
}
