// Command kubectl-vpcni is vpcnictl from an operator's workstation, as a
// kubectl plugin: on the PATH, `kubectl vpcni --node NODE status` runs
// vpcnictl status in that node's agent pod. See internal/kubectlplugin.
package main

import (
	"os"

	"github.com/vpcni/vpcni/internal/kubectlplugin"
)

var version = "dev"

func main() {
	os.Exit(kubectlplugin.Main(version, os.Args[1:], os.Stdout, os.Stderr))
}
