#!/usr/bin/env bash
# helm.sh — prints the path of a helm binary at one pinned release, building
# it first if the cache lacks it. Debian 12 ships no helm, so it is built
# static from its Go module (helm.sh/helm/v3/cmd/helm) through the module
# proxy, outside vpcni's go.mod (-mod=mod: the module's own go.mod and the
# checksum database). Cached in $VPCNI_HELM_CACHE/<version>/helm
# (/var/cache/vpcni-helm); a no-op while that binary exists. Used by
# `make helm` (the chart test) and test/k8se2e (the Helm install).
#
#   scripts/helm.sh            build if needed (or wait for a build under
#                              way), print the binary's path
#   HELM_VERSION=v3.x.y scripts/helm.sh
set -euo pipefail

version=${HELM_VERSION:-v3.21.4}
cache=${VPCNI_HELM_CACHE:-/var/cache/vpcni-helm}/$version
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

if [ -x "$cache/helm" ]; then
  echo "$cache/helm"
  exit 0
fi
# One build at a time: `make deps` starts one in the background (its module
# downloads overlap the other steps), and `make helm` waits for it here.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -x "$cache/helm" ]; then
  echo "$cache/helm"
  exit 0
fi
echo "building helm $version into $cache (cold: a few minutes)" >&2
# Built into a temporary GOBIN and moved in: an interrupted build leaves no
# half-written binary that the check above would take for a cached one.
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# version.version makes `helm version` name the release it is.
GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
  "helm.sh/helm/v3/cmd/helm@$version"
mv "$tmp/helm" "$cache/helm"
echo "$cache/helm"
