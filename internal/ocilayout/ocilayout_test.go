package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/ociimage"
)

// dockerSave writes a small image for arch with ociimage, as make image does.
func dockerSave(t *testing.T, arch string) *Image {
	t.Helper()
	im := ociimage.New("vpcni/vpcni:dev")
	im.Arch = arch
	im.Entrypoint = []string{"/usr/local/bin/vpcnid"}
	if err := im.AddFile("/usr/local/bin/vpcnid", []byte("agent for "+arch), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := im.Save(&buf); err != nil {
		t.Fatal(err)
	}
	out, err := ReadDockerSave(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var testOpts = Options{
	Ref:     "docker.io/vpcni/vpcni:v0.3.0",
	Labels:  map[string]string{"org.opencontainers.image.version": "v0.3.0", "org.opencontainers.image.licenses": "Apache-2.0"},
	Created: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC),
}

// layout is an archive read back, every blob checked against its name.
type layout struct {
	index Index
	blobs map[string][]byte
}

func readLayout(t *testing.T, data []byte) layout {
	t.Helper()
	l := layout{blobs: map[string][]byte{}}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
		if hex, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && h.Typeflag == tar.TypeReg {
			if got := digest(b); got != "sha256:"+hex {
				t.Errorf("blob %s holds content of digest %s", h.Name, got)
			}
			l.blobs["sha256:"+hex] = b
		}
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
	if err := json.Unmarshal(files["index.json"], &l.index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	return l
}

// blob returns the blob d names, checking its size and media type.
func (l layout) blob(t *testing.T, d Descriptor, mediaType string) []byte {
	t.Helper()
	b, ok := l.blobs[d.Digest]
	if !ok {
		t.Fatalf("descriptor %s: no such blob", d.Digest)
	}
	if int64(len(b)) != d.Size || d.MediaType != mediaType {
		t.Fatalf("descriptor %s: size %d type %s, blob is %d bytes, want type %s", d.Digest, d.Size, d.MediaType, len(b), mediaType)
	}
	return b
}

// checkManifest checks one platform's manifest, config and layer.
func (l layout) checkManifest(t *testing.T, d Descriptor, arch string) {
	t.Helper()
	var m Manifest
	if err := json.Unmarshal(l.blob(t, d, MediaTypeManifest), &m); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Architecture, OS, Created string
		Config                    struct{ Labels map[string]string }
		RootFS                    struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(l.blob(t, m.Config, MediaTypeConfig), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != arch || cfg.OS != "linux" || cfg.Created != "2026-11-27T12:00:00Z" {
		t.Errorf("%s config: arch %s os %s created %s", arch, cfg.Architecture, cfg.OS, cfg.Created)
	}
	if cfg.Config.Labels["org.opencontainers.image.version"] != "v0.3.0" || cfg.Config.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
		t.Errorf("%s config labels %v", arch, cfg.Config.Labels)
	}
	if len(m.Layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 {
		t.Fatalf("%s: %d layers, %d diff_ids, want 1", arch, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	zr, err := gzip.NewReader(bytes.NewReader(l.blob(t, m.Layers[0], MediaTypeLayerGz)))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if want := "sha256:" + hex.EncodeToString(sum[:]); cfg.RootFS.DiffIDs[0] != want {
		t.Errorf("%s: diff_id %s, the layer uncompressed is %s", arch, cfg.RootFS.DiffIDs[0], want)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: layer has no usr/local/bin/vpcnid: %v", arch, err)
		}
		if h.Name == "usr/local/bin/vpcnid" {
			b, _ := io.ReadAll(tr)
			if string(b) != "agent for "+arch {
				t.Errorf("%s: vpcnid holds %q", arch, b)
			}
			break
		}
	}
}

func TestMultiPlatformIndexListsBothArchitectures(t *testing.T) {
	var out bytes.Buffer
	top, err := Write(&out, testOpts, dockerSave(t, "arm64"), dockerSave(t, "amd64"))
	if err != nil {
		t.Fatal(err)
	}
	l := readLayout(t, out.Bytes())
	if len(l.index.Manifests) != 1 || l.index.Manifests[0].Digest != top.Digest {
		t.Fatalf("index.json lists %+v, want the one index %s", l.index.Manifests, top.Digest)
	}
	if a := l.index.Manifests[0].Annotations; a[AnnotationRefName] != "v0.3.0" || a[AnnotationImageName] != testOpts.Ref {
		t.Errorf("index.json annotations %v", a)
	}
	var idx Index
	if err := json.Unmarshal(l.blob(t, top, MediaTypeIndex), &idx); err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			t.Fatalf("index entry %s has no platform", d.Digest)
		}
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
		l.checkManifest(t, d, d.Platform.Architecture)
	}
	if got := strings.Join(platforms, " "); got != "linux/amd64 linux/arm64" {
		t.Fatalf("index lists %q, want linux/amd64 linux/arm64", got)
	}
	// manifests, configs, layers and the index: nothing more, nothing less.
	if len(l.blobs) != 7 {
		t.Errorf("%d blobs, want 7 (index, 2 manifests, 2 configs, 2 layers)", len(l.blobs))
	}
}

func TestSinglePlatformIndexNamesTheManifest(t *testing.T) {
	var out bytes.Buffer
	top, err := Write(&out, testOpts, dockerSave(t, "amd64"))
	if err != nil {
		t.Fatal(err)
	}
	l := readLayout(t, out.Bytes())
	if len(l.index.Manifests) != 1 || l.index.Manifests[0].Digest != top.Digest || top.MediaType != MediaTypeManifest {
		t.Fatalf("index.json lists %+v, want the manifest %s", l.index.Manifests, top.Digest)
	}
	if p := l.index.Manifests[0].Platform; p == nil || p.Architecture != "amd64" || p.OS != "linux" {
		t.Errorf("platform %+v", p)
	}
	l.checkManifest(t, top, "amd64")
	if len(l.blobs) != 3 {
		t.Errorf("%d blobs, want 3", len(l.blobs))
	}
}

func TestWriteIsReproducible(t *testing.T) {
	var a, b bytes.Buffer
	da, errA := Write(&a, testOpts, dockerSave(t, "amd64"), dockerSave(t, "arm64"))
	db, errB := Write(&b, testOpts, dockerSave(t, "arm64"), dockerSave(t, "amd64"))
	if errA != nil || errB != nil || da.Digest != db.Digest || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes of the same images differ (%s %s, %v %v)", da.Digest, db.Digest, errA, errB)
	}
}

func TestWriteRefuses(t *testing.T) {
	for name, f := range map[string]func() error{
		"no images": func() error { _, err := Write(io.Discard, testOpts); return err },
		"two images of one platform": func() error {
			_, err := Write(io.Discard, testOpts, dockerSave(t, "amd64"), dockerSave(t, "amd64"))
			return err
		},
		"a reference without a tag": func() error {
			_, err := Write(io.Discard, Options{Ref: "127.0.0.1:5100/vpcni/vpcni"}, dockerSave(t, "amd64"))
			return err
		},
	} {
		if f() == nil {
			t.Errorf("%s: written", name)
		}
	}
}
