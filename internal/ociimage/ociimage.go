// Package ociimage writes a one-layer container image from local files as a
// "docker save" tarball (manifest.json, the image config, the layer), the
// format `ctr images import` and `docker load` read. No registry involved:
// the test node imports vpcni's image, a pause image and a busybox image this
// way.
//
// The output is reproducible: entries are sorted, owned by root and dated at
// the Unix epoch, so the same inputs give the same image ID.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Image is one image being assembled. The zero value is not usable: use New.
type Image struct {
	Ref        string   // e.g. "vpcni/vpcni:dev"; containerd normalises it to docker.io/vpcni/vpcni:dev
	Arch       string   // GOARCH naming; "amd64" by default
	Entrypoint []string // may be empty
	Cmd        []string // may be empty
	Env        []string // KEY=VALUE; PATH is set unless given here
	WorkingDir string   // "/" by default

	entries map[string]entry // by clean absolute path
}

type entry struct {
	typ    byte // tar.TypeReg, TypeDir, TypeSymlink
	mode   fs.FileMode
	data   []byte
	target string
}

// New starts an image called ref.
func New(ref string) *Image {
	return &Image{Ref: ref, Arch: "amd64", WorkingDir: "/", entries: map[string]entry{}}
}

// AddFile puts data at dst (an absolute path) with the permission bits of mode.
func (im *Image) AddFile(dst string, data []byte, mode fs.FileMode) error {
	return im.add(dst, entry{typ: tar.TypeReg, mode: mode.Perm(), data: data})
}

// AddDir creates the directory dst; parents of every entry are created anyway.
func (im *Image) AddDir(dst string, mode fs.FileMode) error {
	return im.add(dst, entry{typ: tar.TypeDir, mode: mode & (fs.ModePerm | fs.ModeSticky)})
}

// AddSymlink makes dst a symbolic link to target.
func (im *Image) AddSymlink(dst, target string) error {
	if target == "" {
		return fmt.Errorf("symlink %s: empty target", dst)
	}
	return im.add(dst, entry{typ: tar.TypeSymlink, mode: 0o777, target: target})
}

func (im *Image) add(dst string, e entry) error {
	p, err := clean(dst)
	if err != nil {
		return err
	}
	if old, ok := im.entries[p]; ok && !(old.typ == tar.TypeDir && e.typ == tar.TypeDir) {
		return fmt.Errorf("%s: added twice", dst)
	}
	im.entries[p] = e
	return nil
}

func clean(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("%q: image paths are absolute", p)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", errors.New(`"/" cannot be an entry`)
	}
	return c, nil
}

// layer returns the layer tarball: every entry, its missing parents as 0755
// directories, in path order.
func (im *Image) layer() ([]byte, error) {
	all := map[string]entry{}
	for p, e := range im.entries {
		all[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := im.entries[d]; !ok {
				all[d] = entry{typ: tar.TypeDir, mode: 0o755}
			} else if im.entries[d].typ != tar.TypeDir {
				return nil, fmt.Errorf("%s: parent %s is not a directory", p, d)
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := all[p]
		h := &tar.Header{Typeflag: e.typ, Name: strings.TrimPrefix(p, "/"), Mode: int64(e.mode.Perm()), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.target
		case tar.TypeReg:
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// config is the subset of the OCI image config we write.
type config struct {
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Created      string        `json:"created"`
	Config       runConfig     `json:"config"`
	RootFS       rootFS        `json:"rootfs"`
	History      []historyItem `json:"history"`
}

type runConfig struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type historyItem struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// manifestEntry is one element of a docker-save manifest.json.
type manifestEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Save writes the docker-save tarball to w. It returns the image ID
// (the config's digest, "sha256:…").
func (im *Image) Save(w io.Writer) (id string, err error) {
	if im.Ref == "" {
		return "", errors.New("image has no name")
	}
	layer, err := im.layer()
	if err != nil {
		return "", err
	}
	layerHex := sha256Hex(layer)
	env := im.Env
	if !hasKey(env, "PATH") {
		env = append([]string{defaultPath}, env...)
	}
	epoch := time.Unix(0, 0).UTC().Format(time.RFC3339)
	cfg, err := json.Marshal(config{
		Architecture: im.Arch, OS: "linux", Created: epoch,
		Config:  runConfig{Entrypoint: im.Entrypoint, Cmd: im.Cmd, Env: env, WorkingDir: im.WorkingDir},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{"sha256:" + layerHex}},
		History: []historyItem{{Created: epoch, CreatedBy: "vpcni ociimage"}},
	})
	if err != nil {
		return "", err
	}
	cfgHex := sha256Hex(cfg)
	manifest, err := json.Marshal([]manifestEntry{{Config: cfgHex + ".json", RepoTags: []string{im.Ref}, Layers: []string{layerHex + "/layer.tar"}}})
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{{layerHex + "/layer.tar", layer}, {cfgHex + ".json", cfg}, {"manifest.json", manifest}}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: layerHex + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return "", err
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	return "sha256:" + cfgHex, tw.Close()
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}
