package cniinstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
)

// Chained is what Plugins did with one plugin the conflist chains after
// vpcni.
type Chained struct {
	Type string
	Path string // in the node's CNI bin dir
	// Installed: the node had none and the image's copy was put there.
	// Otherwise the node's own copy was kept.
	Installed bool
	// About is what the plugin says of itself ("CNI portmap plugin
	// v1.9.1"), or why it could not be asked.
	About string
	// Versions are the CNI versions the plugin speaks (empty: it could not
	// be run here, see About).
	Versions []string
}

func (c Chained) String() string {
	if c.Installed {
		return fmt.Sprintf("installed %s (%s; the node had none)", c.Path, c.About)
	}
	return fmt.Sprintf("kept the node's %s (%s)", c.Path, c.About)
}

// askTimeout bounds one VERSION call to a plugin.
const askTimeout = 10 * time.Second

// Plugins makes sure every plugin list chains after vpcni is in binDir.
// A plugin the node lacks is copied from srcDir (the image's upstream
// builds), atomically. A plugin the node already has is never replaced:
// it may be newer than ours, or another CNI on the node may rely on its
// exact build. It is kept if it speaks the conflist's CNI version, and
// refused otherwise (the operator updates or removes it). A node's plugin
// that cannot be run from here (Debian's are dynamically linked; the
// image has no C library) is kept and said so: the runtime, which runs
// it on the node, is then the judge.
func Plugins(list *libcni.NetworkConfigList, srcDir, binDir string) ([]Chained, error) {
	var out []Chained
	var errs []error
	seen := map[string]bool{}
	for _, p := range list.Plugins[1:] {
		typ := p.Network.Type
		if seen[typ] {
			continue
		}
		seen[typ] = true
		if typ == "" || filepath.Base(typ) != typ || strings.HasPrefix(typ, ".") {
			errs = append(errs, fmt.Errorf("chained plugin type %q is not a file name", typ))
			continue
		}
		c, err := provide(typ, list.CNIVersion, srcDir, binDir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

func provide(typ, cniVersion, srcDir, binDir string) (Chained, error) {
	c := Chained{Type: typ, Path: filepath.Join(binDir, typ)}
	st, err := os.Stat(c.Path)
	switch {
	case err == nil && (!st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0):
		return c, fmt.Errorf("%s is on the node but is not an executable file: fix or remove it", c.Path)
	case err == nil:
		c.About, c.Versions, err = ask(c.Path)
		if err != nil {
			c.About = "could not ask which CNI versions it speaks: " + err.Error() + "; it must speak " + cniVersion
			return c, nil
		}
		if !slices.Contains(c.Versions, cniVersion) {
			return c, fmt.Errorf("the node's %s speaks CNI %s, not %s that the conflist needs: update it, or remove it and install-cni puts the image's in its place",
				c.Path, strings.Join(c.Versions, ", "), cniVersion)
		}
		c.About += ", speaks CNI " + cniVersion
		return c, nil
	case !errors.Is(err, fs.ErrNotExist):
		return c, err
	}
	src := filepath.Join(srcDir, typ)
	if srcDir == "" {
		return c, fmt.Errorf("the conflist chains %q: the node has no %s and no --chained-plugins dir was given", typ, c.Path)
	}
	bin, err := os.ReadFile(src)
	if err != nil {
		return c, fmt.Errorf("the conflist chains %q: the node has no %s and the image has none to install: %w", typ, c.Path, err)
	}
	// Ours must speak the version too, before it lands where the runtime
	// will run it.
	c.About, c.Versions, err = ask(src)
	if err != nil {
		return c, fmt.Errorf("the image's %s cannot be run: %w", src, err)
	}
	if !slices.Contains(c.Versions, cniVersion) {
		return c, fmt.Errorf("the image's %s speaks CNI %s, not %s that the conflist needs", src, strings.Join(c.Versions, ", "), cniVersion)
	}
	if err := WriteAtomic(binDir, typ, bin, 0o755); err != nil {
		return c, fmt.Errorf("install %s: %w", typ, err)
	}
	c.Installed = true
	return c, nil
}

// ask runs the plugin's VERSION verb, and the plugin with no verb for
// its "about" line (which names its release).
func ask(path string) (about string, versions []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	info, err := invoke.GetVersionInfo(ctx, path, nil)
	if err != nil {
		return "", nil, err
	}
	versions = info.SupportedVersions()
	// skel prints the about line ("CNI <name> plugin <release>") when
	// CNI_COMMAND is unset; a plugin built without one prints an error.
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{}
	outb, _ := cmd.CombinedOutput()
	about, _, _ = strings.Cut(strings.TrimSpace(string(outb)), "\n")
	if !strings.HasPrefix(about, "CNI ") {
		about = filepath.Base(path) + ", release unknown"
	}
	return about, versions, nil
}
