//go:build vpcni_k8sall

// k8s-all is every Kubernetes binary the test node needs in one executable:
// scripts/k8s-node.sh copies it into a throwaway module under
// /var/cache/vpcni-k8s (it does not build in this repository's module, hence
// the build tag) and links kube-apiserver, kubelet, … to it.
//
// The command is the name it was called by (a symlink) or its first
// argument: `k8s-all kubectl get nodes`.
package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	_ "time/tzdata" // CronJob time zones (kube-apiserver, kube-controller-manager)

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var servers = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kube-proxy":              proxy.NewProxyCommand,
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := servers[name]; !ok && name != "kubectl" && len(os.Args) > 1 {
		name, os.Args = os.Args[1], os.Args[1:]
	}
	if name == "kubectl" {
		// As upstream's kubectl main: verbosity before the command is built.
		_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	newCmd, ok := servers[name]
	if !ok {
		names := append(slices.Sorted(maps.Keys(servers)), "kubectl")
		fmt.Fprintf(os.Stderr, "usage: k8s-all {%s} [args]\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	os.Exit(cli.Run(newCmd()))
}
