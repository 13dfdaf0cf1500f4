// Command vpcni is the CNI plugin the container runtime executes. It forwards
// every verb to the vpcnid agent on this node; see internal/cniplugin.
package main

import "github.com/vpcni/vpcni/internal/cniplugin"

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	cniplugin.Main("vpcni CNI plugin " + version)
}
