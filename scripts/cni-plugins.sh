#!/usr/bin/env bash
# cni-plugins.sh OUTDIR — the upstream CNI plugins vpcni's conflist chains
# after it (portmap, bandwidth), built static from the Go module proxy at
# one pinned release. Debian's containernetworking-plugins (1.1.1) speak CNI
# only up to 1.0.0; these speak 1.1.0 too. Used by `make image` (the image
# carries them in /opt/cni-plugins for install-cni) and by
# scripts/install-deps.sh (the integration tests chain them). A no-op while
# OUTDIR/VERSION names the pinned release.
set -euo pipefail

version=v1.9.1
out=${1:?usage: $0 OUTDIR}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

if [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ] && [ -x "$out/portmap" ] && [ -x "$out/bandwidth" ]; then
  exit 0
fi
echo "building containernetworking plugins $version (portmap, bandwidth) into $out" >&2
mkdir -p "$out"
rm -f "$out/VERSION"
# -mod=mod: built outside any module of ours, from the module's own go.mod
# and the checksum database. BuildVersion makes `portmap` (no CNI_COMMAND)
# say which release it is, which install-cni reports.
GOBIN=$(cd "$out" && pwd) CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" install -trimpath \
  -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$version" \
  "github.com/containernetworking/plugins/plugins/meta/portmap@$version" \
  "github.com/containernetworking/plugins/plugins/meta/bandwidth@$version"
echo "$version" >"$out/VERSION"
