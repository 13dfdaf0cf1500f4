package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/cniinstall"
)

// CNI judges the runtime's CNI dirs: whether the network configuration
// the runtime uses (the first file in confDir by name) is vpcni's, and
// whether every plugin it chains is an executable in binDir. It returns
// the conf check, then the plugins check when vpcni's conflist was found.
func CNI(confDir, binDir string) []Result {
	conf := Result{Name: "cni conf"}
	files, err := libcni.ConfFiles(confDir, cniinstall.ConfExts)
	if st, serr := os.Stat(confDir); serr != nil || !st.IsDir() {
		err = fmt.Errorf("not a directory")
	}
	if err != nil {
		conf.Status, conf.Detail = Fail, fmt.Sprintf("cannot read the CNI conf dir %s: %v", confDir, err)
		conf.Fix = "pass --cni-conf-dir with the runtime's conf dir (containerd: /etc/cni/net.d)"
		return []Result{conf}
	}
	slices.Sort(files)
	var ours string
	var list *libcni.NetworkConfigList
	for _, f := range files {
		if l, err := load(f); err == nil && l.Plugins[0].Network.Type == "vpcni" {
			ours, list = f, l
			break
		}
	}
	fix := "vpcnid installs it once it serves (-install-conflist), or vpcnictl install-cni --conf-dir " + confDir
	switch {
	case ours == "":
		conf.Status, conf.Detail, conf.Fix = Fail, fmt.Sprintf("no network configuration in %s has vpcni as its first plugin (%d files)", confDir, len(files)), fix
		return []Result{conf}
	case files[0] != ours:
		first := filepath.Base(files[0])
		conf.Status = Fail
		conf.Detail = fmt.Sprintf("vpcni's %s is shadowed by %s, which sorts first in %s: the runtime uses %s", filepath.Base(ours), first, confDir, first)
		conf.Fix = fmt.Sprintf("remove %s (another CNI's leftover? its pods keep running: docs/install-bare-metal.md, Replacing another CNI) or give vpcni's a name that sorts first (vpcnid -conflist-name; the default 00-vpcni.conflist sorts before other CNIs' files)", files[0])
	default:
		conf.Status = OK
		conf.Detail = fmt.Sprintf("the runtime uses vpcni's %s (network %q, CNI %s)", filepath.Base(ours), list.Name, list.CNIVersion)
	}
	return []Result{conf, plugins(list, filepath.Base(ours), binDir)}
}

// load reads a .conflist, or a single .conf/.json as a list of one.
func load(path string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(path, ".conflist") {
		return libcni.ConfListFromFile(path)
	}
	c, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(c)
}

// Chained are the plugins vpcni's conflist (deploy/10-vpcni.conflist)
// chains after vpcni, and what a pod loses without each.
var Chained = []struct{ Type, Without string }{
	{"portmap", "pods' hostPorts are not served"},
	{"bandwidth", "pods' bandwidth annotations are not applied"},
}

// plugins checks that the list chains what vpcni's does and that every
// plugin it names is in binDir.
func plugins(list *libcni.NetworkConfigList, file, binDir string) Result {
	r := Result{Name: "cni plugins"}
	var unchained []string
	for _, c := range Chained {
		if !slices.ContainsFunc(list.Plugins, func(p *libcni.PluginConfig) bool { return p.Network.Type == c.Type }) {
			unchained = append(unchained, fmt.Sprintf("no %s (%s)", c.Type, c.Without))
		}
	}
	if len(unchained) > 0 {
		r.Status, r.Detail = Fail, fmt.Sprintf("%s chains %s", file, strings.Join(unchained, " and "))
		r.Fix = "chain them after vpcni as deploy/10-vpcni.conflist does, and let vpcnid install it (-install-conflist)"
		return r
	}
	var have, missing []string
	for _, p := range list.Plugins {
		typ := p.Network.Type
		if slices.Contains(have, typ) || slices.Contains(missing, typ) {
			continue
		}
		st, err := os.Stat(filepath.Join(binDir, typ))
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, typ)
			continue
		}
		have = append(have, typ)
	}
	if len(missing) > 0 {
		r.Status = Fail
		r.Detail = fmt.Sprintf("%s chains %s, which %s not an executable in %s: every pod ADD fails", file, strings.Join(missing, ", "), isAre(len(missing)), binDir)
		r.Fix = "vpcnictl install-cni --bin-dir " + binDir + " installs the image's copies (the DaemonSet's init step), or pass --cni-bin-dir if the runtime uses another dir"
		return r
	}
	r.Status, r.Detail = OK, fmt.Sprintf("%s in %s", strings.Join(have, ", "), binDir)
	return r
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
