// ocilayout writes an OCI image layout archive (the "oci-archive" skopeo,
// crane and `ctr images import` read) from docker-save tarballs written by
// tools/mkimage, one per platform (see internal/ocilayout). make release
// writes vpcni's release image with it:
//
//	ocilayout -ref docker.io/vpcni/vpcni:v0.3.0 -out vpcni-image.oci.tar \
//	    -created 1764244800 -label org.opencontainers.image.version=v0.3.0 \
//	    image-amd64.tar image-arm64.tar
//
// It prints the archive, the reference and the digest of index.json's entry.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/ocilayout"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ocilayout:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var labels list
	fl := flag.NewFlagSet("ocilayout", flag.ContinueOnError)
	ref := fl.String("ref", "", "image reference with its tag, e.g. docker.io/vpcni/vpcni:v0.3.0 (required)")
	out := fl.String("out", "", "the archive to write (required)")
	created := fl.String("created", "0", "the configs' creation time: Unix seconds (e.g. the commit's) or RFC 3339")
	fl.Var(&labels, "label", "KEY=VALUE set in every config's labels (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *ref == "" || *out == "" || fl.NArg() == 0 {
		return errors.New("usage: ocilayout -ref REF -out FILE [-label K=V] [-created TIME] DOCKER-SAVE.tar...")
	}
	opt := ocilayout.Options{Ref: *ref, Labels: map[string]string{}}
	var err error
	if opt.Created, err = parseTime(*created); err != nil {
		return err
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		opt.Labels[k] = v
	}
	var images []*ocilayout.Image
	for _, name := range fl.Args() {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		im, err := ocilayout.ReadDockerSave(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		images = append(images, im)
	}
	var buf bytes.Buffer
	top, err := ocilayout.Write(&buf, opt, images...)
	if err != nil {
		return err
	}
	if err := writeAtomic(*out, buf.Bytes()); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, *ref, top.Digest)
	return nil
}

func parseTime(s string) (time.Time, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return t, fmt.Errorf("-created %q: want Unix seconds or RFC 3339", s)
	}
	return t, nil
}

// writeAtomic writes data next to name and renames it into place: a reader
// never sees half an archive.
func writeAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), ".ocilayout-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
