package testbed

import (
	"fmt"
	"os"
	"os/exec"
)

// RequireRoot ends a root-only test binary unless it runs as root: "NOT
// RUN" (exit 0) normally, a failure (exit 1) when VPCNI_REQUIRE_ROOT is
// set, as `make test` does, so a suite never passes by not running.
func RequireRoot(what string) {
	if os.Geteuid() == 0 {
		return
	}
	fmt.Printf("vpcni-test: %s need root; NOT RUN\n", what)
	if os.Getenv("VPCNI_REQUIRE_ROOT") != "" {
		os.Exit(1)
	}
	os.Exit(0)
}

// Binaries is where the built commands are: $VPCNI_BIN (make passes
// bin/), else a fresh build of all of them into a temporary directory.
func Binaries() (string, error) {
	if dir := os.Getenv("VPCNI_BIN"); dir != "" {
		return dir, nil
	}
	dir, err := os.MkdirTemp("", "vpcni-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/vpcni/vpcni/cmd/vpcni", "github.com/vpcni/vpcni/cmd/vpcnid",
		"github.com/vpcni/vpcni/cmd/vpcnictl", "github.com/vpcni/vpcni/cmd/vpcni-controller", "github.com/vpcni/vpcni/cmd/kubectl-vpcni")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return dir, nil
}

// WithNeutron runs run (a test package's m.Run) with scripts/neutron.sh's
// neutron-server up: started if it is not running — the script is found
// from the package's directory, two levels below the repository — and
// stopped afterwards if it was started here. It returns run's exit code,
// or 1 if neutron-server could not start.
func WithNeutron(run func() int) int {
	script := "../../scripts/neutron.sh"
	started := false
	if exec.Command("bash", script, "status").Run() != nil {
		cmd := exec.Command("bash", script, "up")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("vpcni-test: could not start neutron-server:", err)
			_ = exec.Command("bash", script, "down").Run()
			return 1
		}
		started = true
	}
	code := run()
	if started {
		cmd := exec.Command("bash", script, "down")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		_ = cmd.Run()
	}
	return code
}
