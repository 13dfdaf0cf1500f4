package ctl

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	st, _ := os.Stat(filepath.Join(conf, "10-vpcni.conflist"))
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
	os.WriteFile(filepath.Join(conf, "10-vpcni.conflist"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(conf, "20-other.conflist"), []byte("{}"), 0o644)
	args := []string{"uninstall-cni", "--bin-dir", bin, "--conf-dir", conf}
	var stdout, stderr bytes.Buffer
	if code := Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, gone := range []string{filepath.Join(bin, "vpcni"), filepath.Join(conf, "10-vpcni.conflist")} {
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
