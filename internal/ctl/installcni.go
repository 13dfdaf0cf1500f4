package ctl

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	_ "github.com/vpcni/vpcni/internal/builtin" // the modes and providers a config may name
	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
)

// installCNI puts the plugin (and, unless --conflist is empty, the network
// configuration) where the runtime reads them; see internal/cniinstall.
// In the DaemonSet vpcnid writes the conflist itself once it serves, so
// the node turns Ready only then.
func installCNI(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("install-cni", flag.ContinueOnError)
	plugin := fs.String("plugin", "/usr/local/bin/vpcni", "the plugin binary to install")
	binDir := fs.String("bin-dir", "/host/opt/cni/bin", "the runtime's CNI bin dir")
	confDir := fs.String("conf-dir", "/host/etc/cni/net.d", "the runtime's CNI conf dir")
	conflist := fs.String("conflist", "/etc/vpcni/10-vpcni.conflist", "the network configuration list to install (empty: none)")
	name := fs.String("name", cniinstall.DefaultName, "its file name in the conf dir (the runtime uses the first by name)")
	chained := fs.String("chained-plugins", "/opt/cni-plugins", "the image's builds of the plugins the conflist chains after vpcni (portmap, bandwidth): each one the node lacks is installed into --bin-dir; a node's own is kept")
	chainConflist := fs.String("chain-conflist", "", "read the chained plugins and CNI version from this conflist without installing it (default: --conflist; vpcnid installs the conflist itself in the DaemonSet)")
	agentConfig := fs.String("agent-config", "", "also set the node's sysctls for the uplink of this vpcnid config (needs a writable /proc/sys)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *agentConfig != "" {
		cfg, err := config.Load(*agentConfig)
		if err != nil {
			return err
		}
		mode, err := datapath.Lookup(cfg.Datapath.Mode)
		if err != nil {
			return err
		}
		if mode.Prepare != nil {
			if err := mode.Prepare(datapath.Node{Uplink: cfg.Uplink, MTU: cfg.MTU, Families: cfg.Families()}, cfg.Datapath.Settings); err != nil {
				return fmt.Errorf("prepare the node for datapath %s: %w", cfg.Datapath.Mode, err)
			}
			fmt.Fprintf(out, "node prepared for datapath %s (sysctls set)\n", cfg.Datapath.Mode)
		}
	}
	bin, err := os.ReadFile(*plugin)
	if err != nil {
		return err
	}
	if err := cniinstall.WriteAtomic(*binDir, "vpcni", bin, 0o755); err != nil {
		return fmt.Errorf("install the plugin: %w", err)
	}
	fmt.Fprintf(out, "installed %s\n", filepath.Join(*binDir, "vpcni"))
	// The chained plugins go in before the conflist that names them: a
	// runtime that reads the conflist at once finds them there.
	if *chainConflist == "" {
		*chainConflist = *conflist
	}
	if *chainConflist != "" {
		list, err := cniinstall.ReadConflist(*chainConflist)
		if err != nil {
			return err
		}
		done, err := cniinstall.Plugins(list, *chained, *binDir)
		for _, c := range done {
			fmt.Fprintln(out, c)
		}
		if err != nil {
			return fmt.Errorf("the plugins %s chains after vpcni: %w", *chainConflist, err)
		}
	}
	if *conflist == "" {
		return nil
	}
	list, err := cniinstall.Conflist(*conflist, *confDir, *name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "installed %s (network %q, cniVersion %s)\n", filepath.Join(*confDir, *name), list.Name, list.CNIVersion)
	return nil
}
