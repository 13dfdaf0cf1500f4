package cniplugin_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The plugin binary runs once per pod on the critical path: it must not
// link a Kubernetes client, gRPC, a cloud SDK, netlink or net/http (it
// talks to vpcnid with the hand-written HTTP/1.1 client in internal/api).
func TestPluginDependenciesStaySmall(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatal("no go command to list the plugin's dependencies with")
		}
	}
	cmd := exec.Command(goBin, "list", "-deps", "github.com/vpcni/vpcni/cmd/vpcni")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	// Guard against a vacuous pass: the list must be the real one.
	if len(deps) == 0 {
		t.Fatal("go list -deps printed nothing")
	}
	for _, want := range []string{"github.com/containernetworking/cni/pkg/skel", "github.com/vpcni/vpcni/internal/api", "github.com/vpcni/vpcni/cmd/vpcni"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps lacks %s; got %d packages:\n%s", want, len(deps), out)
		}
	}
	forbidden := []string{
		"k8s.io/client-go",
		"google.golang.org/grpc",
		"gophercloud",
		"github.com/vishvananda/netlink",
		"net/http",
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.Contains(d, f) {
				t.Errorf("the plugin depends on %s (forbidden: %q)", d, f)
			}
		}
	}
}
