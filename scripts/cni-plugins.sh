#!/usr/bin/env bash
# cni-plugins.sh OUTDIR — the upstream CNI plugins vpcni's conflist chains
# after it (portmap, bandwidth), built static from the Go module proxy at
# one pinned release. Debian's containernetworking-plugins (1.1.1) speak CNI
# only up to 1.0.0; these speak 1.1.0 too. Used by `make image` (the image
# carries them in /opt/cni-plugins for install-cni) and by
# scripts/install-deps.sh (the integration tests chain them). A no-op while
# OUTDIR/VERSION names the pinned release (and OUTDIR/ARCH the architecture).
#
# GOARCH (default: this machine's) is the architecture built for: make
# release cross-compiles one OUTDIR per architecture (they are static Go).
set -euo pipefail

version=v1.9.1
out=${1:?usage: [GOARCH=arch] $0 OUTDIR}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
arch=${GOARCH:-$("$GO" env GOHOSTARCH)}

# A directory from before ARCH was recorded holds this machine's build.
have_arch=$(cat "$out/ARCH" 2>/dev/null || { [ -f "$out/VERSION" ] && "$GO" env GOHOSTARCH; } || true)
if [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ] && [ "$have_arch" = "$arch" ] && [ -x "$out/portmap" ] && [ -x "$out/bandwidth" ]; then
  exit 0
fi
echo "building containernetworking plugins $version (portmap, bandwidth) for $arch into $out" >&2
mkdir -p "$out"
rm -f "$out/VERSION" "$out/ARCH"
# -mod=mod: built outside any module of ours, from the module's own go.mod
# and the checksum database. BuildVersion makes `portmap` (no CNI_COMMAND)
# say which release it is, which install-cni reports. go install puts a
# cross-compiled binary in GOPATH/bin/linux_ARCH (it refuses GOBIN then):
# a scratch GOPATH, with the usual module cache, collects either kind.
gopath=$(mktemp -d)
trap 'chmod -R u+w "$gopath"; rm -rf "$gopath"' EXIT
GOMODCACHE=$("$GO" env GOMODCACHE) GOPATH=$gopath GOARCH=$arch CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" install -trimpath \
  -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$version" \
  "github.com/containernetworking/plugins/plugins/meta/portmap@$version" \
  "github.com/containernetworking/plugins/plugins/meta/bandwidth@$version"
bindir=$gopath/bin
[ "$arch" = "$("$GO" env GOHOSTARCH)" ] || bindir=$gopath/bin/linux_$arch
mv "$bindir/portmap" "$bindir/bandwidth" "$out/"
echo "$arch" >"$out/ARCH"
echo "$version" >"$out/VERSION"
