// Package ocilayout writes OCI image layout archives — a tarball holding
// oci-layout, index.json and blobs/sha256/…, the "oci-archive" format
// skopeo, crane and `ctr images import` read — from images written by
// internal/ociimage as docker-save tarballs, one per platform. A release
// image is one archive for every platform: an image index with one manifest
// per linux/ARCH, each with its own config and layer.
//
// It converts rather than extending ociimage, so that ociimage and
// tools/mkimage, which the test fixtures' cached images are keyed on, stay
// as they are.
//
// The output is reproducible: layers are compressed with a fixed gzip
// header, the config's creation time is the caller's, and the archive's
// entries are in a fixed order, dated at the Unix epoch.
package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"
)

// Media types of the OCI image spec (v1.1).
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// Annotations on index.json's entry: the OCI one is the tag (what
// `skopeo copy oci-archive:FILE:TAG` selects by); containerd's is the full
// name `ctr images import` gives the image.
const (
	AnnotationRefName   = "org.opencontainers.image.ref.name"
	AnnotationImageName = "io.containerd.image.name"
)

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is the platform an index entry runs on.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// Index is an OCI image index (index.json has this shape too).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Image is one platform's image read from a docker-save tarball.
type Image struct {
	config map[string]json.RawMessage // the image config, as written
	layers [][]byte                   // uncompressed layer tarballs, base first
}

// Platform is the image's platform, from its config.
func (im *Image) Platform() (Platform, error) {
	var p Platform
	for key, dst := range map[string]*string{"architecture": &p.Architecture, "os": &p.OS, "variant": &p.Variant} {
		if raw, ok := im.config[key]; ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				return p, fmt.Errorf("image config %s: %w", key, err)
			}
		}
	}
	if p.Architecture == "" || p.OS == "" {
		return p, errors.New("image config names no os or architecture")
	}
	return p, nil
}

// dockerManifest is one element of a docker-save manifest.json.
type dockerManifest struct {
	Config string
	Layers []string
}

// ReadDockerSave reads a docker-save tarball holding one image.
func ReadDockerSave(r io.Reader) (*Image, error) {
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("docker-save tarball: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("docker-save tarball: %s: %w", h.Name, err)
		}
		files[path.Clean(h.Name)] = b
	}
	var ms []dockerManifest
	if err := json.Unmarshal(files["manifest.json"], &ms); err != nil {
		return nil, fmt.Errorf("docker-save manifest.json: %w", err)
	}
	if len(ms) != 1 {
		return nil, fmt.Errorf("docker-save tarball holds %d images, want 1", len(ms))
	}
	im := &Image{}
	if err := json.Unmarshal(files[path.Clean(ms[0].Config)], &im.config); err != nil {
		return nil, fmt.Errorf("docker-save config %s: %w", ms[0].Config, err)
	}
	for _, l := range ms[0].Layers {
		b, ok := files[path.Clean(l)]
		if !ok {
			return nil, fmt.Errorf("docker-save tarball lacks layer %s", l)
		}
		im.layers = append(im.layers, b)
	}
	return im, nil
}

// Options describe the image written.
type Options struct {
	// Ref names the image, e.g. docker.io/vpcni/vpcni:v0.3.0; its tag goes
	// into index.json's ref.name annotation.
	Ref string
	// Labels are set in every platform's config (org.opencontainers.image.*).
	Labels map[string]string
	// Created is the config's creation time (a fixed one, e.g. the
	// commit's, keeps the image reproducible).
	Created time.Time
}

// Write writes the OCI image layout archive of images, one per platform,
// to w. With one image index.json names its manifest; with more, it names
// an image index listing one manifest per platform. It returns the
// descriptor index.json holds (its digest is what a registry reports).
func Write(w io.Writer, opt Options, images ...*Image) (Descriptor, error) {
	if len(images) == 0 {
		return Descriptor{}, errors.New("no images")
	}
	tag, err := tagOf(opt.Ref)
	if err != nil {
		return Descriptor{}, err
	}
	blobs := map[string][]byte{}
	put := func(mediaType string, b []byte) Descriptor {
		d := Descriptor{MediaType: mediaType, Digest: digest(b), Size: int64(len(b))}
		blobs[d.Digest] = b
		return d
	}
	var manifests []Descriptor
	seen := map[Platform]bool{}
	for _, im := range images {
		p, err := im.Platform()
		if err != nil {
			return Descriptor{}, err
		}
		if seen[p] {
			return Descriptor{}, fmt.Errorf("two images for %s/%s", p.OS, p.Architecture)
		}
		seen[p] = true
		m := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest}
		var diffIDs []string
		for _, l := range im.layers {
			gz, err := gzipped(l)
			if err != nil {
				return Descriptor{}, err
			}
			diffIDs = append(diffIDs, digest(l))
			m.Layers = append(m.Layers, put(MediaTypeLayerGz, gz))
		}
		cfg, err := im.configWith(opt, diffIDs)
		if err != nil {
			return Descriptor{}, err
		}
		m.Config = put(MediaTypeConfig, cfg)
		mb, err := json.Marshal(m)
		if err != nil {
			return Descriptor{}, err
		}
		d := put(MediaTypeManifest, mb)
		d.Platform = &p
		manifests = append(manifests, d)
	}
	top := manifests[0]
	if len(manifests) > 1 {
		sort.Slice(manifests, func(i, j int) bool {
			a, b := manifests[i].Platform, manifests[j].Platform
			return a.OS+"/"+a.Architecture+"/"+a.Variant < b.OS+"/"+b.Architecture+"/"+b.Variant
		})
		ib, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: manifests})
		if err != nil {
			return Descriptor{}, err
		}
		top = put(MediaTypeIndex, ib)
	}
	top.Annotations = map[string]string{AnnotationRefName: tag, AnnotationImageName: opt.Ref}
	index, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{top}})
	if err != nil {
		return Descriptor{}, err
	}
	return top, writeArchive(w, index, blobs)
}

// configWith returns the image's config with opt's labels and time, and
// the diff IDs of its layers as written (the docker-save ones may predate
// a rebuild of the layers; the ones here are what the manifest holds).
func (im *Image) configWith(opt Options, diffIDs []string) ([]byte, error) {
	cfg := map[string]json.RawMessage{}
	for k, v := range im.config {
		cfg[k] = v
	}
	run := map[string]json.RawMessage{}
	if raw, ok := cfg["config"]; ok {
		if err := json.Unmarshal(raw, &run); err != nil {
			return nil, fmt.Errorf("image config: config: %w", err)
		}
	}
	var err error
	set := func(m map[string]json.RawMessage, key string, v any) {
		if err != nil {
			return
		}
		m[key], err = json.Marshal(v)
	}
	if len(opt.Labels) > 0 {
		set(run, "Labels", opt.Labels)
	}
	set(cfg, "config", run)
	created := opt.Created.UTC().Format(time.RFC3339)
	set(cfg, "created", created)
	set(cfg, "rootfs", map[string]any{"type": "layers", "diff_ids": diffIDs})
	set(cfg, "history", []map[string]string{{"created": created, "created_by": "vpcni ociimage"}})
	if err != nil {
		return nil, err
	}
	return json.Marshal(cfg) // encoding/json sorts map keys: the same input gives the same bytes
}

// tagOf returns ref's tag: "v0.3.0" of "docker.io/vpcni/vpcni:v0.3.0".
func tagOf(ref string) (string, error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") || i == len(ref)-1 {
		return "", fmt.Errorf("image reference %q has no tag", ref)
	}
	return ref[i+1:], nil
}

func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf) // a zero header: no name, no time
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// writeArchive writes the layout: oci-layout, index.json, then the blobs
// in digest order.
func writeArchive(w io.Writer, index []byte, blobs map[string][]byte) error {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", index); err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
			return err
		}
	}
	return tw.Close()
}
