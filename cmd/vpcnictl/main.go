// Command vpcnictl is vpcni's operator CLI. See internal/ctl.
package main

import (
	"fmt"
	"os"

	"github.com/vpcni/vpcni/internal/ctl"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) == 2 {
		switch os.Args[1] {
		case "version", "-version", "--version":
			fmt.Println("vpcnictl", version)
			return
		}
	}
	os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr))
}
