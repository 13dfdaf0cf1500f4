// Package release proves make release's image travels the way a cluster
// gets it: pushed to a real registry (distribution's, scripts/registry.sh,
// on 127.0.0.1:5100) with the standard clients (crane, and skopeo from
// oci-archive: directly), read back as one image index for linux/amd64 and
// linux/arm64 whose digest is the archive's, and pulled by digest by a real
// containerd (Debian's, a private instance of this test's own) that runs
// the agent it holds; the same archive imported with `ctr images import`.
// Root only (containerd, runc).
package release

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/ocilayout"
	"github.com/vpcni/vpcni/internal/testbed"
)

const registryAddr = "127.0.0.1:5100"

func TestMain(m *testing.M) {
	testbed.RequireRoot("the release registry test")
	os.Exit(m.Run())
}

var repo, _ = filepath.Abs("../..")

func run(t *testing.T, stdin io.Reader, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// releaseImage returns make release's multi-architecture image archive and
// the version it is tagged with.
func releaseImage(t *testing.T) (archive, version string) {
	dir := os.Getenv("VPCNI_RELEASE_DIR")
	if dir == "" {
		dir = filepath.Join(repo, "bin/release")
	}
	all, _ := filepath.Glob(filepath.Join(dir, "vpcni-image-*.oci.tar"))
	for _, f := range all {
		if !strings.Contains(filepath.Base(f), "-linux-") {
			archive = f
		}
	}
	if archive == "" {
		t.Fatalf("no multi-architecture image archive in %s (found %v): run make release first", dir, all)
	}
	version = strings.TrimSuffix(strings.TrimPrefix(filepath.Base(archive), "vpcni-image-"), ".oci.tar")
	return archive, version
}

func TestPushPullRelease(t *testing.T) {
	archive, version := releaseImage(t)
	registry := filepath.Join(repo, "scripts/registry.sh")
	crane := strings.TrimSpace(run(t, nil, "bash", registry, "crane"))
	run(t, nil, "bash", registry, "up")
	t.Cleanup(func() { _ = exec.Command("bash", registry, "down").Run() })

	ref := registryAddr + "/vpcni/vpcni:" + version
	start := time.Now()
	run(t, nil, "bash", registry, "push", archive, ref)
	t.Logf("crane push %s: %s", ref, time.Since(start).Round(time.Millisecond))

	// The registry holds one index naming a manifest per platform; its
	// digest is the archive's own (nothing was rewritten on the way).
	var idx ocilayout.Index
	if err := json.Unmarshal([]byte(run(t, nil, crane, "manifest", "--insecure", ref)), &idx); err != nil {
		t.Fatal(err)
	}
	platforms := map[string]string{}
	var summary []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			t.Fatalf("index entry %s names no platform", d.Digest)
		}
		p := d.Platform.OS + "/" + d.Platform.Architecture
		platforms[p] = d.Digest
		summary = append(summary, p+"="+d.Digest[:19])
	}
	sort.Strings(summary)
	top := strings.TrimSpace(run(t, nil, crane, "digest", "--insecure", ref))
	fmt.Printf("release-registry: %s %s %s %s\n", ref, idx.MediaType, top, strings.Join(summary, " "))
	if idx.MediaType != ocilayout.MediaTypeIndex || len(idx.Manifests) != 2 || platforms["linux/amd64"] == "" || platforms["linux/arm64"] == "" {
		t.Fatalf("the registry's %s is a %s listing %v, want an image index of linux/amd64 and linux/arm64", ref, idx.MediaType, platforms)
	}
	if want := archiveDigest(t, archive); top != want {
		t.Errorf("registry digest %s, the archive's index is %s", top, want)
	}

	// skopeo, the other standard client, copies the archive as it is (every
	// platform) and reads back the same index.
	if _, err := exec.LookPath("skopeo"); err != nil {
		t.Fatalf("skopeo is not installed (scripts/install-deps.sh installs it): %v", err)
	}
	skopeoRef := "docker://" + registryAddr + "/vpcni/vpcni-skopeo:" + version
	run(t, nil, "skopeo", "copy", "--all", "--dest-tls-verify=false", "oci-archive:"+archive, skopeoRef)
	raw := run(t, nil, "skopeo", "inspect", "--raw", "--tls-verify=false", skopeoRef)
	var sidx ocilayout.Index
	if err := json.Unmarshal([]byte(raw), &sidx); err != nil {
		t.Fatal(err)
	}
	var splat []string
	for _, d := range sidx.Manifests {
		if d.Platform != nil {
			splat = append(splat, d.Platform.OS+"/"+d.Platform.Architecture)
		}
	}
	sort.Strings(splat)
	sum := sha256.Sum256([]byte(raw))
	sdigest := "sha256:" + hex.EncodeToString(sum[:])
	fmt.Printf("release-registry: skopeo inspect --raw %s: %s %s %s\n", skopeoRef, sidx.MediaType, sdigest, strings.Join(splat, " "))
	if strings.Join(splat, " ") != "linux/amd64 linux/arm64" || sdigest != top {
		t.Errorf("skopeo copy --all: the registry holds %s listing %v, want the archive's index %s of linux/amd64 and linux/arm64", sdigest, splat, top)
	}

	// Each platform's config says what it is, and what it holds runs there:
	// the agent and nft are ELF files for that machine.
	for _, pm := range []struct {
		arch    string
		machine elf.Machine
	}{{"amd64", elf.EM_X86_64}, {"arm64", elf.EM_AARCH64}} {
		arch, machine := pm.arch, pm.machine
		var cfg struct {
			Architecture string
			Config       struct{ Labels map[string]string }
		}
		if err := json.Unmarshal([]byte(run(t, nil, crane, "config", "--insecure", "--platform", "linux/"+arch, ref)), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != arch || cfg.Config.Labels["org.opencontainers.image.version"] != version || cfg.Config.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
			t.Errorf("linux/%s config: architecture %s labels %v", arch, cfg.Architecture, cfg.Config.Labels)
		}
		files := exportFiles(t, crane, "linux/"+arch, ref, "usr/local/bin/vpcnid", "usr/sbin/nft", "opt/cni-plugins/portmap")
		for name, b := range files {
			f, err := elf.NewFile(bytes.NewReader(b))
			if err != nil || f.Machine != machine {
				t.Errorf("linux/%s image: %s is not an ELF file for %s (%v)", arch, name, machine, err)
				continue
			}
		}
		fmt.Printf("release-registry: linux/%s %s: vpcnid, nft, portmap are %s\n", arch, platforms["linux/"+arch][:19], machine)
	}

	// A real containerd pulls the amd64 image by digest and runs its agent,
	// which names the version; then imports the archive the way a node
	// without a registry would.
	c := startContainerd(t)
	byDigest := registryAddr + "/vpcni/vpcni@" + platforms["linux/amd64"]
	start = time.Now()
	c.ctr(t, "images", "pull", "--plain-http", "--platform", "linux/amd64", byDigest)
	t.Logf("ctr pull by digest: %s", time.Since(start).Round(time.Millisecond))
	got := strings.TrimSpace(c.ctr(t, "run", "--rm", byDigest, "vpcni-release-test", "/usr/local/bin/vpcnid", "-version"))
	fmt.Printf("release-registry: ctr run %s: %q\n", byDigest[:len(registryAddr)+33], got)
	if got != "vpcnid "+version {
		t.Errorf("the pulled agent says %q, want %q", got, "vpcnid "+version)
	}
	// --base-name: ctr keeps only names under it (without one it renames
	// every image import-DATE).
	c.ctr(t, "images", "import", "--platform", "linux/amd64", "--base-name", "docker.io/vpcni/vpcni", archive)
	if ls := c.ctr(t, "images", "ls", "-q"); !strings.Contains(ls, "docker.io/vpcni/vpcni:"+version) {
		t.Errorf("ctr images import of %s: images are %q, want docker.io/vpcni/vpcni:%s", archive, ls, version)
	}
}

// archiveDigest returns the digest index.json of an OCI archive names.
func archiveDigest(t *testing.T, archive string) string {
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no index.json: %v", archive, err)
		}
		if h.Name == "index.json" {
			var idx ocilayout.Index
			if err := json.NewDecoder(tr).Decode(&idx); err != nil || len(idx.Manifests) != 1 {
				t.Fatalf("%s: index.json: %v (%d entries)", archive, err, len(idx.Manifests))
			}
			return idx.Manifests[0].Digest
		}
	}
}

// exportFiles returns the named files of the platform's image filesystem,
// as crane export reads it from the registry.
func exportFiles(t *testing.T, crane, platform, ref string, names ...string) map[string][]byte {
	t.Helper()
	out := run(t, nil, crane, "export", "--insecure", "--platform", platform, ref, "-")
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	files := map[string][]byte{}
	tr := tar.NewReader(strings.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if want[strings.TrimPrefix(h.Name, "/")] {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(h.Name, "/")] = b
		}
	}
	for _, n := range names {
		if files[n] == nil {
			t.Errorf("%s of %s has no %s", platform, ref, n)
		}
	}
	return files
}

type containerd struct{ sock string }

// startContainerd runs Debian's containerd with a root, state and socket of
// this test's own (no CRI plugin), stopped by its PID at the end.
func startContainerd(t *testing.T) *containerd {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Fatalf("containerd is not installed (apt-get install containerd; scripts/install-deps.sh does): %v", err)
	}
	dir := t.TempDir()
	c := &containerd{sock: filepath.Join(dir, "containerd.sock")}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	for i := 0; ; i++ {
		if exec.Command("ctr", "--address", c.sock, "version").Run() == nil {
			return c
		}
		if i == 100 {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("containerd did not answer on %s in 10 s:\n%s", c.sock, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *containerd) ctr(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, nil, "ctr", append([]string{"--address", c.sock}, args...)...)
}
