package release

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// TestDeployArchiveInstallsTheVersion: the release's deploy/ tarball, as
// `kubectl apply -k` reads it, renders every vpcni container with this
// release's image tag (not the checkout's dev tag), and the CLI tarball of
// this machine's architecture holds the three binaries an operator uses,
// each saying this version.
func TestDeployArchiveInstallsTheVersion(t *testing.T) {
	archive, version := releaseImage(t)
	dir := filepath.Dir(archive)

	deploy := filepath.Join(dir, "vpcni-deploy-"+version+".tar.gz")
	out := t.TempDir()
	untar(t, deploy, out)
	kubectl := filepath.Join(apiserver.K8sCache, apiserver.K8sVersion, "bin", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl: %v (build it: bash scripts/k8s-node.sh build)", err)
	}
	rendered := run(t, nil, kubectl, "kustomize", filepath.Join(out, "vpcni-deploy-"+version))
	var images []string
	for _, line := range strings.Split(rendered, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "image: ") {
			images = append(images, strings.TrimPrefix(l, "image: "))
		}
	}
	if len(images) < 3 {
		t.Fatalf("kubectl kustomize of %s renders %d images (%v), want the agent's, its init step's and the controller's", deploy, len(images), images)
	}
	for _, im := range images {
		if im != "vpcni/vpcni:"+version {
			t.Errorf("%s renders image %s, want vpcni/vpcni:%s", filepath.Base(deploy), im, version)
		}
	}
	t.Logf("vpcni-test: %s renders %d containers, each vpcni/vpcni:%s", filepath.Base(deploy), len(images), version)

	cli := filepath.Join(dir, "vpcni-"+version+"-linux-"+runtime.GOARCH+".tar.gz")
	bin := t.TempDir()
	names := untar(t, cli, bin)
	want := []string{"kubectl-vpcni", "vpcni", "vpcnictl"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("%s holds %v, want %v", filepath.Base(cli), names, want)
	}
	d := filepath.Join(bin, "vpcni-"+version+"-linux-"+runtime.GOARCH)
	for _, c := range [][]string{{"vpcni", "-version"}, {"vpcnictl", "version"}, {"kubectl-vpcni", "version"}} {
		got, err := exec.Command(filepath.Join(d, c[0]), c[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(got), version) {
			t.Errorf("%s: %q (%v), want the version %s", strings.Join(c, " "), got, err, version)
		}
	}
}

// untar unpacks a .tar.gz into dir and returns the base names of its
// regular files, sorted.
func untar(t *testing.T, file, dir string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, tr); err != nil {
				t.Fatal(err)
			}
			w.Close()
			names = append(names, filepath.Base(h.Name))
		}
	}
	sort.Strings(names)
	return names
}
