package ctl

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/cniinstall"
)

func TestInstallCNIWritesInPlace(t *testing.T) {
	dir := t.TempDir()
	bin, conf, src := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "src")
	for _, d := range []string{bin, conf, src} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugin := filepath.Join(src, "vpcni")
	list := filepath.Join(src, "10-vpcni.conflist")
	os.WriteFile(plugin, []byte("#!/bin/true\n"), 0o755)
	os.WriteFile(list, []byte(`{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"}]}`), 0o644)
	// An old plugin in place is replaced, not written through.
	os.WriteFile(filepath.Join(bin, "vpcni"), []byte("old"), 0o755)
	var out bytes.Buffer
	err := installCNI([]string{"--plugin", plugin, "--conflist", list, "--bin-dir", bin, "--conf-dir", conf}, &out)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(bin, "vpcni"))
	if string(got) != "#!/bin/true\n" {
		t.Fatalf("plugin not installed: %q", got)
	}
	st, _ := os.Stat(filepath.Join(conf, cniinstall.DefaultName))
	if st == nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("conflist missing or wrong mode: %v", st)
	}
	entries, _ := os.ReadDir(conf)
	if len(entries) != 1 {
		t.Fatalf("conf dir holds %d files, want only the conflist (no temporary left)", len(entries))
	}
	if !strings.Contains(out.String(), `network "vpcni", cniVersion 1.0.0`) {
		t.Fatalf("output: %s", out.String())
	}
}

func TestInstallCNIRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	plugin := filepath.Join(dir, "vpcni")
	os.WriteFile(plugin, []byte("x"), 0o755)
	for name, c := range map[string]struct{ list, want string }{
		"not JSON":     {`{`, "not a valid CNI network configuration list"},
		"other plugin": {`{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}`, "must be of type vpcni"},
		"missing dirs": {`{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"vpcni"}]}`, "is not a directory"},
		"no plugins":   {`{"cniVersion":"1.0.0","name":"n"}`, "must be of type vpcni"},
	} {
		list := filepath.Join(dir, "l.conflist")
		os.WriteFile(list, []byte(c.list), 0o644)
		err := installCNI([]string{"--plugin", plugin, "--conflist", list, "--bin-dir", dir, "--conf-dir", filepath.Join(dir, "nope2")}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, c.want)
		}
	}
}

func TestUninstallCNI(t *testing.T) {
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	os.Mkdir(bin, 0o755)
	os.Mkdir(conf, 0o755)
	os.WriteFile(filepath.Join(bin, "vpcni"), []byte("x"), 0o755)
	os.WriteFile(filepath.Join(bin, "other"), []byte("x"), 0o755)
	os.WriteFile(filepath.Join(conf, cniinstall.DefaultName), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(conf, "20-other.conflist"), []byte("{}"), 0o644)
	args := []string{"uninstall-cni", "--bin-dir", bin, "--conf-dir", conf}
	var stdout, stderr bytes.Buffer
	if code := Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, gone := range []string{filepath.Join(bin, "vpcni"), filepath.Join(conf, cniinstall.DefaultName)} {
		if _, err := os.Stat(gone); err == nil || !strings.Contains(stdout.String(), "removed "+gone) {
			t.Errorf("%s not removed (or not said): %v\n%s", gone, err, stdout.String())
		}
	}
	for _, kept := range []string{filepath.Join(bin, "other"), filepath.Join(conf, "20-other.conflist")} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s is not vpcni's and must stay: %v", kept, err)
		}
	}
	// Again: nothing left to remove is no failure.
	stdout.Reset()
	if code := Main(args, &stdout, &stderr); code != 0 || stdout.Len() != 0 {
		t.Fatalf("second run: exit %d, output %q, stderr %s", code, stdout.String(), stderr.String())
	}
	// A mode without an undo says so.
	cfg := filepath.Join(dir, "vpcnid.yaml")
	os.WriteFile(cfg, []byte("nodeName: n\ndatapath: veth\nsocketPath: "+filepath.Join(dir, "none.sock")+"\nprovider: {type: static, static: {ranges: [{cidr: 10.1.0.0/24}]}}\n"), 0o644)
	stdout.Reset()
	if code := Main(append(args, "--agent-config", cfg), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "datapath veth changed nothing") {
		t.Fatalf("veth: exit %d, output %q, stderr %s", code, stdout.String(), stderr.String())
	}
	// A bad config is a failure (1), a bad flag a usage error (2).
	stderr.Reset()
	if code := Main(append(args, "--agent-config", filepath.Join(dir, "missing.yaml")), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "read config") {
		t.Fatalf("missing config: exit %d, stderr %s", code, stderr.String())
	}
	stderr.Reset()
	if code := Main([]string{"uninstall-cni", "--nope"}, &stdout, &stderr); code != 2 {
		t.Fatalf("bad flag: exit %d, stderr %s", code, stderr.String())
	}
}

// stubPlugin writes an executable that answers the CNI VERSION verb with
// the given versions and, run without a verb, names its release, as skel
// does.
func stubPlugin(t *testing.T, path, release string, versions ...string) {
	t.Helper()
	script := fmt.Sprintf(`#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then
  cat >/dev/null
  echo '{"cniVersion":"1.0.0","supportedVersions":["%s"]}'
  exit 0
fi
echo "CNI $(basename "$0") plugin %s" >&2
`, strings.Join(versions, `","`), release)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestInstallCNIChainedPlugins: the plugins the conflist chains after vpcni
// are installed where the node lacks them and never replace the node's own.
func TestInstallCNIChainedPlugins(t *testing.T) {
	dir := t.TempDir()
	bin, conf, img := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "opt-cni-plugins")
	for _, d := range []string{bin, conf, img} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugin := filepath.Join(dir, "vpcni")
	os.WriteFile(plugin, []byte("x"), 0o755)
	list := filepath.Join(dir, "10-vpcni.conflist")
	os.WriteFile(list, []byte(`{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"},
		{"type":"portmap","capabilities":{"portMappings":true}},{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`), 0o644)
	stubPlugin(t, filepath.Join(img, "portmap"), "v9.9.9", "0.4.0", "1.0.0", "1.1.0")
	stubPlugin(t, filepath.Join(img, "bandwidth"), "v9.9.9", "0.4.0", "1.0.0", "1.1.0")
	install := func(extra ...string) (string, error) {
		var out bytes.Buffer
		err := installCNI(append([]string{"--plugin", plugin, "--bin-dir", bin, "--conf-dir", conf, "--chained-plugins", img}, extra...), &out)
		return out.String(), err
	}

	// The node has neither: both installed, byte for byte, and said so.
	out, err := install("--conflist", list)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, p := range []string{"portmap", "bandwidth"} {
		want, _ := os.ReadFile(filepath.Join(img, p))
		got, _ := os.ReadFile(filepath.Join(bin, p))
		st, _ := os.Stat(filepath.Join(bin, p))
		if !bytes.Equal(got, want) || st == nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s not installed from the image (mode %v)", p, st)
		}
		if line := fmt.Sprintf("installed %s (CNI %s plugin v9.9.9; the node had none)", filepath.Join(bin, p), p); !strings.Contains(out, line) {
			t.Errorf("output does not say %q:\n%s", line, out)
		}
	}
	if entries, _ := os.ReadDir(bin); len(entries) != 3 {
		t.Errorf("bin dir holds %d files, want vpcni, portmap, bandwidth (no temporaries)", len(entries))
	}

	// The node's own portmap, older than ours but speaking 1.0.0, is kept:
	// install-cni never replaces a plugin it finds. The DaemonSet's form:
	// the conflist only read, not installed.
	os.Remove(filepath.Join(bin, "bandwidth"))
	stubPlugin(t, filepath.Join(bin, "portmap"), "v1.1.1", "0.4.0", "1.0.0")
	nodeOwn, _ := os.ReadFile(filepath.Join(bin, "portmap"))
	out, err = install("--conflist=", "--chain-conflist", list)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(bin, "portmap")); !bytes.Equal(got, nodeOwn) {
		t.Error("the node's own portmap was overwritten")
	}
	if !strings.Contains(out, "kept the node's "+filepath.Join(bin, "portmap")+" (CNI portmap plugin v1.1.1, speaks CNI 1.0.0)") ||
		!strings.Contains(out, "installed "+filepath.Join(bin, "bandwidth")) {
		t.Errorf("output:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(conf, cniinstall.DefaultName)); err != nil {
		t.Errorf("the first run's conflist is gone: %v", err)
	}

	// A node's plugin that cannot speak the conflist's version is refused,
	// left as it is, and the error says what to do.
	stubPlugin(t, filepath.Join(bin, "portmap"), "v0.8.7", "0.3.1", "0.4.0")
	old, _ := os.ReadFile(filepath.Join(bin, "portmap"))
	out, err = install("--conflist", list)
	if err == nil || !strings.Contains(err.Error(), "speaks CNI 0.3.1, 0.4.0, not 1.0.0") || !strings.Contains(err.Error(), "update it, or remove it") {
		t.Fatalf("an old node plugin: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(bin, "portmap")); !bytes.Equal(got, old) {
		t.Error("the node's old portmap was overwritten")
	}

	// One that cannot be run from here (its loader is missing, as for
	// Debian's dynamically linked builds in the image) is kept, and said.
	os.WriteFile(filepath.Join(bin, "portmap"), []byte("#!/nonexistent/ld.so\n"), 0o755)
	out, err = install("--conflist", list)
	if err != nil || !strings.Contains(out, "(could not ask which CNI versions it speaks: ") || !strings.Contains(out, "it must speak 1.0.0)") {
		t.Fatalf("an unrunnable node plugin: %v\n%s", err, out)
	}

	// Neither the node nor the image has a chained plugin: a clear error.
	os.WriteFile(list, []byte(`{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"},{"type":"tuning"}]}`), 0o644)
	if _, err := install("--conflist", list); err == nil || !strings.Contains(err.Error(), `the conflist chains "tuning": the node has no `+filepath.Join(bin, "tuning")+" and the image has none to install") {
		t.Errorf("a plugin nobody has: %v", err)
	}
	os.WriteFile(list, []byte(`{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"},{"type":"../portmap"}]}`), 0o644)
	if _, err := install("--conflist", list); err == nil || !strings.Contains(err.Error(), `chained plugin type "../portmap" is not a file name`) {
		t.Errorf("a type that is a path: %v", err)
	}
}
