// Command vpcni is the CNI plugin the container runtime executes. It forwards
// every verb to the vpcnid agent on this node; see internal/cniplugin.
package main

import (
	"fmt"
	"os"

	"github.com/vpcni/vpcni/internal/cniplugin"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	// A runtime always sets CNI_COMMAND; a person asking which release is
	// installed passes -version (without either, the plugin prints its
	// about line, which names the version too).
	if len(os.Args) == 2 && os.Getenv("CNI_COMMAND") == "" {
		switch os.Args[1] {
		case "-version", "--version", "version":
			fmt.Println("vpcni", version)
			return
		}
	}
	cniplugin.Main("vpcni CNI plugin " + version)
}
