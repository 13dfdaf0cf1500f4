// Package cniinstall puts vpcni's plugin and network configuration where a
// container runtime reads them, atomically: a temporary file inside the
// target directory, then a rename there. (containerd 1.6 watches its conf
// dir for files written or created in it; a file renamed in from another
// directory is not noticed. A plugin binary overwritten in place may be
// running: "text file busy".)
package cniinstall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
)

// Conflist checks the network configuration list at src (vpcni first) and
// writes it as confDir/name.
func Conflist(src, confDir, name string) (*libcni.NetworkConfigList, error) {
	list, err := ReadConflist(src)
	if err != nil {
		return nil, err
	}
	if filepath.Base(name) != name || filepath.Ext(name) != ".conflist" {
		return nil, fmt.Errorf("conflist name %q must be a file name ending in .conflist", name)
	}
	if err := WriteAtomic(confDir, name, list.Bytes, 0o644); err != nil {
		return nil, fmt.Errorf("install the network configuration: %w", err)
	}
	return list, nil
}

// ReadConflist reads and checks the network configuration list at src:
// valid, vpcni first.
func ReadConflist(src string) (*libcni.NetworkConfigList, error) {
	conf, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid CNI network configuration list: %w", src, err)
	}
	if len(list.Plugins) == 0 || list.Plugins[0].Network.Type != "vpcni" {
		return nil, fmt.Errorf("%s: the first plugin must be of type vpcni", src)
	}
	return list, nil
}

// WriteAtomic writes dir/name through a temporary file in dir.
func WriteAtomic(dir, name string, data []byte, mode os.FileMode) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("%s is not a directory (is the host path mounted?)", dir)
	}
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Chmod(mode), f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
