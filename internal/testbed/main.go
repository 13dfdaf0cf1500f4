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

// Binaries is where the built vpcni and vpcnid are: $VPCNI_BIN (make
// passes bin/), else a fresh build into a temporary directory.
func Binaries() (string, error) {
	if dir := os.Getenv("VPCNI_BIN"); dir != "" {
		return dir, nil
	}
	dir, err := os.MkdirTemp("", "vpcni-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/vpcni/vpcni/cmd/vpcni", "github.com/vpcni/vpcni/cmd/vpcnid")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return dir, nil
}
