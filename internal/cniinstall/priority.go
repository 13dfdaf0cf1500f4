package cniinstall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// DefaultName is the file name vpcni's network configuration list takes
// in the runtime's conf dir. containerd and CRI-O use the first file there
// by name, so "00-" puts it before what other CNIs install
// (05-cilium.conflist, 10-calico.conflist, 10-flannel.conflist, 10-kindnet.conflist,
// containerd's 10-containerd-net.conflist): on a node that had
// another CNI, new pods get vpcni once it is written. Multus'
// 00-multus.conf still sorts first, as it must (it delegates to the first
// other file).
const DefaultName = "00-vpcni.conflist"

// ConfExts are the files a runtime reads from its CNI conf dir (libcni,
// as containerd and CRI-O use it).
var ConfExts = []string{".conf", ".conflist", ".json"}

// ConfDir is what else is in the runtime's conf dir beside vpcni's list,
// by file name, in the order the runtime looks at them.
type ConfDir struct {
	// Removed are vpcni's own lists under another name, which Tidy
	// deleted (an earlier release's 10-vpcni.conflist).
	Removed []string
	// Before are other networks' files that sort before vpcni's: the
	// runtime uses the first of them, not vpcni.
	Before []string
	// After are other networks' files that sort after vpcni's: unused
	// while vpcni's is there (another CNI's, left for its pods' DEL).
	After []string
}

// Tidy runs once vpcni's list is installed as confDir/name: it deletes
// vpcni's own lists under other names (so exactly one is left after an
// upgrade that changed the name, and none of them can shadow the current
// one) and reports the other networks' files around it. A file is
// vpcni's when its first plugin is of type vpcni.
func Tidy(confDir, name string) (ConfDir, error) {
	var d ConfDir
	files, err := libcni.ConfFiles(confDir, ConfExts)
	if err != nil {
		return d, fmt.Errorf("read the CNI conf dir %s: %w", confDir, err)
	}
	slices.Sort(files)
	// Without the current list there, vpcni's others stay: they are all
	// the node has.
	if !slices.Contains(files, filepath.Join(confDir, name)) {
		return d, fmt.Errorf("vpcni's %s is not in %s", name, confDir)
	}
	var errs []error
	seen := false
	for _, f := range files {
		base := filepath.Base(f)
		if base == name {
			seen = true
			continue
		}
		if strings.HasPrefix(base, ".") {
			continue // a write in progress (ours: WriteAtomic's temporary file)
		}
		if IsVpcni(f) {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("remove vpcni's earlier %s: %w", f, err))
				continue
			}
			d.Removed = append(d.Removed, base)
			continue
		}
		if seen {
			d.After = append(d.After, base)
		} else {
			d.Before = append(d.Before, base)
		}
	}
	return d, errors.Join(errs...)
}

// IsVpcni says whether the network configuration at path (a .conflist, or
// a single .conf/.json) has vpcni as its first plugin. A file that does
// not parse is not vpcni's.
func IsVpcni(path string) bool {
	var list *libcni.NetworkConfigList
	var err error
	if strings.HasSuffix(path, ".conflist") {
		list, err = libcni.ConfListFromFile(path)
	} else {
		var c *libcni.NetworkConfig
		if c, err = libcni.ConfFromFile(path); err == nil {
			list, err = libcni.ConfListFromConf(c)
		}
	}
	return err == nil && len(list.Plugins) > 0 && list.Plugins[0].Network.Type == "vpcni"
}
