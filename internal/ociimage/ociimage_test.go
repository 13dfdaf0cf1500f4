package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"strings"
	"testing"
)

// readTar returns a tarball's entries by name.
func readTar(t *testing.T, data []byte) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, bodies := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, bodies
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], bodies[h.Name] = h, b
	}
}

func testImage(t *testing.T) *Image {
	t.Helper()
	im := New("vpcni/vpcni:dev")
	im.Entrypoint = []string{"/usr/local/bin/vpcnid"}
	im.Env = []string{"A=b"}
	for _, err := range []error{
		im.AddFile("/usr/local/bin/vpcnid", []byte("#!agent"), 0o755),
		im.AddFile("/etc/motd", []byte("hi\n"), 0o644),
		im.AddSymlink("/bin/sh", "busybox"),
		im.AddDir("/tmp", 0o777|fs.ModeSticky),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return im
}

func TestSaveIsADockerSaveTarball(t *testing.T) {
	var out bytes.Buffer
	id, err := testImage(t).Save(&out)
	if err != nil {
		t.Fatal(err)
	}
	_, files := readTar(t, out.Bytes())
	var manifest []manifestEntry
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "vpcni/vpcni:dev" || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json = %s", files["manifest.json"])
	}
	cfgBytes, layer := files[manifest[0].Config], files[manifest[0].Layers[0]]
	sum := sha256.Sum256(cfgBytes)
	if want := "sha256:" + hex.EncodeToString(sum[:]); id != want || manifest[0].Config != want[7:]+".json" {
		t.Fatalf("image ID %s, config %s, want %s", id, manifest[0].Config, want)
	}
	var cfg config
	if err := json.Unmarshal(cfgBytes, &cfg); err != nil {
		t.Fatal(err)
	}
	lsum := sha256.Sum256(layer)
	if got, want := cfg.RootFS.DiffIDs, "sha256:"+hex.EncodeToString(lsum[:]); len(got) != 1 || got[0] != want {
		t.Fatalf("diff_ids %v, want [%s]", got, want)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/vpcnid" {
		t.Fatalf("config %+v", cfg)
	}
	if len(cfg.Config.Env) != 2 || !strings.HasPrefix(cfg.Config.Env[0], "PATH=") || cfg.Config.Env[1] != "A=b" {
		t.Fatalf("env %v: want a default PATH, then A=b", cfg.Config.Env)
	}

	hdrs, bodies := readTar(t, layer)
	var names []string
	for n := range hdrs {
		names = append(names, n)
	}
	for _, want := range []struct {
		name string
		typ  byte
		mode int64
	}{
		{"usr/", tar.TypeDir, 0o755}, {"usr/local/", tar.TypeDir, 0o755}, {"usr/local/bin/", tar.TypeDir, 0o755},
		{"usr/local/bin/vpcnid", tar.TypeReg, 0o755}, {"etc/", tar.TypeDir, 0o755}, {"etc/motd", tar.TypeReg, 0o644},
		{"bin/", tar.TypeDir, 0o755}, {"bin/sh", tar.TypeSymlink, 0o777}, {"tmp/", tar.TypeDir, 0o1777},
	} {
		h := hdrs[want.name]
		if h == nil || h.Typeflag != want.typ || h.Mode != want.mode || h.Uid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("layer entry %s = %+v, want type %c mode %o (layer has %v)", want.name, h, want.typ, want.mode, names)
		}
	}
	if len(hdrs) != 9 {
		t.Errorf("layer has %d entries, want 9: %v", len(hdrs), names)
	}
	if string(bodies["usr/local/bin/vpcnid"]) != "#!agent" || hdrs["bin/sh"].Linkname != "busybox" {
		t.Error("file content or symlink target lost")
	}
}

func TestSaveIsReproducible(t *testing.T) {
	var a, b bytes.Buffer
	idA, errA := testImage(t).Save(&a)
	idB, errB := testImage(t).Save(&b)
	if errA != nil || errB != nil || idA != idB || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes of the same image differ (ids %s %s, errors %v %v)", idA, idB, errA, errB)
	}
}

func TestAddRefusesBadPaths(t *testing.T) {
	im := New("x:1")
	if err := im.AddFile("relative", nil, 0o644); err == nil {
		t.Error("relative path accepted")
	}
	if err := im.AddFile("/", nil, 0o644); err == nil {
		t.Error(`"/" accepted`)
	}
	if err := im.AddSymlink("/a", ""); err == nil {
		t.Error("empty symlink target accepted")
	}
	if err := im.AddFile("/f", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := im.AddFile("/f/", nil, 0o644); err == nil {
		t.Error("the same path added twice")
	}
	if err := im.AddFile("/f/g", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Save(io.Discard); err == nil {
		t.Error("a file under a regular file accepted")
	}
	if _, err := New("").Save(io.Discard); err == nil {
		t.Error("an image without a name written")
	}
}
