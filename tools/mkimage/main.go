// mkimage writes a one-layer container image from local files as a
// docker-save tarball that `ctr -n k8s.io images import` reads (see
// internal/ociimage). It is how the test node gets its images without a
// registry:
//
//	mkimage -name vpcni/vpcni:dev -out bin/vpcni-image.tar -tree bin/image:/usr/local/bin
//	mkimage -name registry.k8s.io/pause:3.10 -out pause.tar -entrypoint /pause -file pause:/pause:0755
//	mkimage -name vpcni.local/busybox:1 -out busybox.tar -file busybox:/bin/busybox:0755 -symlink /bin/sh:busybox
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vpcni/vpcni/internal/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var files, trees, dirs, links, env list
	fl := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	name := fl.String("name", "", "image reference, e.g. vpcni/vpcni:dev (required)")
	out := fl.String("out", "", "the tarball to write (required)")
	entrypoint := fl.String("entrypoint", "", "entrypoint, split on spaces")
	cmd := fl.String("cmd", "", "command, split on spaces")
	arch := fl.String("arch", "amd64", "architecture in the image config")
	fl.Var(&files, "file", "src:dst[:mode] — a file (mode in octal, default: the source's) (repeatable)")
	fl.Var(&trees, "tree", "srcdir:dstdir — every regular file directly in srcdir, keeping its mode (repeatable)")
	fl.Var(&dirs, "dir", "dst[:mode] — an empty directory (repeatable)")
	fl.Var(&links, "symlink", "dst:target — a symbolic link (repeatable)")
	fl.Var(&env, "env", "KEY=VALUE (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *name == "" || *out == "" || fl.NArg() > 0 {
		return errors.New("usage: mkimage -name REF -out FILE [-file src:dst[:mode]] [-tree dir:dst] [-dir dst[:mode]] [-symlink dst:target] [-entrypoint …] [-cmd …] [-env K=V]")
	}
	im := ociimage.New(*name)
	im.Arch, im.Entrypoint, im.Cmd, im.Env = *arch, strings.Fields(*entrypoint), strings.Fields(*cmd), env
	var errs []error
	for _, f := range files {
		errs = append(errs, addFile(im, f))
	}
	for _, t := range trees {
		errs = append(errs, addTree(im, t))
	}
	for _, d := range dirs {
		dst, mode, err := pathMode(d, 0o755)
		if err == nil {
			err = im.AddDir(dst, mode)
		}
		errs = append(errs, err)
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok {
			errs = append(errs, fmt.Errorf("-symlink %q: want dst:target", l))
			continue
		}
		errs = append(errs, im.AddSymlink(dst, target))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var buf bytes.Buffer
	id, err := im.Save(&buf)
	if err != nil {
		return err
	}
	if err := writeAtomic(*out, buf.Bytes()); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, *name, id)
	return nil
}

func addFile(im *ociimage.Image, spec string) error {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("-file %q: want src:dst[:mode]", spec)
	}
	data, err := os.ReadFile(parts[0])
	if err != nil {
		return err
	}
	st, err := os.Stat(parts[0])
	if err != nil {
		return err
	}
	mode := st.Mode().Perm()
	if len(parts) == 3 {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil {
			return fmt.Errorf("-file %q: mode: %w", spec, err)
		}
		mode = fs.FileMode(m)
	}
	return im.AddFile(parts[1], data, mode)
}

func addTree(im *ociimage.Image, spec string) error {
	src, dst, ok := strings.Cut(spec, ":")
	if !ok {
		return fmt.Errorf("-tree %q: want srcdir:dstdir", spec)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := im.AddDir(dst, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := addFile(im, filepath.Join(src, e.Name())+":"+path.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func pathMode(spec string, def fs.FileMode) (string, fs.FileMode, error) {
	p, m, ok := strings.Cut(spec, ":")
	if !ok {
		return p, def, nil
	}
	v, err := strconv.ParseUint(m, 8, 32)
	if err != nil {
		return "", 0, fmt.Errorf("%q: mode: %w", spec, err)
	}
	mode := fs.FileMode(v).Perm()
	if v&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return p, mode, nil
}

// writeAtomic writes data next to name, syncs it and renames it into place.
func writeAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), ".mkimage-*")
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
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
