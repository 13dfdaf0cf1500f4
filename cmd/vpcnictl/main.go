// Command vpcnictl is vpcni's operator CLI. See internal/ctl.
package main

import (
	"os"

	"github.com/vpcni/vpcni/internal/ctl"
)

func main() {
	os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr))
}
