package ctl

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
)

// installCNI puts the plugin and the network configuration where the
// runtime reads them. Both land atomically: a temporary file inside the
// target directory, then a rename there. (containerd 1.6 watches its conf
// dir for writes and creations in it; a file renamed in from another
// directory is not noticed. A plugin binary overwritten in place may also
// be running: "text file busy".)
func installCNI(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("install-cni", flag.ContinueOnError)
	plugin := fs.String("plugin", "/usr/local/bin/vpcni", "the plugin binary to install")
	binDir := fs.String("bin-dir", "/host/opt/cni/bin", "the runtime's CNI bin dir")
	confDir := fs.String("conf-dir", "/host/etc/cni/net.d", "the runtime's CNI conf dir")
	conflist := fs.String("conflist", "/etc/vpcni/10-vpcni.conflist", "the network configuration list to install")
	name := fs.String("name", "10-vpcni.conflist", "its file name in the conf dir")
	agentConfig := fs.String("agent-config", "", "also set the node's sysctls for the uplink of this vpcnid config (needs a writable /proc/sys)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *agentConfig != "" {
		cfg, err := config.Load(*agentConfig)
		if err != nil {
			return err
		}
		if err := datapath.PrepareNode(cfg.Uplink); err != nil {
			return fmt.Errorf("prepare the node: %w", err)
		}
		fmt.Fprintln(out, "node sysctls set: net.ipv4.ip_forward=1, proxy_delay=0 on the uplink")
	}
	conf, err := os.ReadFile(*conflist)
	if err != nil {
		return err
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return fmt.Errorf("%s is not a valid CNI network configuration list: %w", *conflist, err)
	}
	if len(list.Plugins) == 0 || list.Plugins[0].Network.Type != "vpcni" {
		return fmt.Errorf("%s: the first plugin must be of type vpcni", *conflist)
	}
	if filepath.Base(*name) != *name || filepath.Ext(*name) != ".conflist" {
		return fmt.Errorf("--name %q must be a file name ending in .conflist", *name)
	}
	bin, err := os.ReadFile(*plugin)
	if err != nil {
		return err
	}
	if err := writeAtomic(*binDir, "vpcni", bin, 0o755); err != nil {
		return fmt.Errorf("install the plugin: %w", err)
	}
	if err := writeAtomic(*confDir, *name, conf, 0o644); err != nil {
		return fmt.Errorf("install the network configuration: %w", err)
	}
	fmt.Fprintf(out, "installed %s and %s (network %q, cniVersion %s)\n",
		filepath.Join(*binDir, "vpcni"), filepath.Join(*confDir, *name), list.Name, list.CNIVersion)
	return nil
}

// writeAtomic writes dir/name through a temporary file in dir.
func writeAtomic(dir, name string, data []byte, mode os.FileMode) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("%s is not a directory (is the host path mounted?)", dir)
	}
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	errs := []error{werr, f.Chmod(mode), f.Sync(), f.Close()}
	if err := errors.Join(errs...); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
