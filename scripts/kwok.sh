#!/usr/bin/env bash
# kwok.sh — prints the path of a kwok binary (sigs.k8s.io/kwok: it fakes
# Nodes and their pods against a real kube-apiserver, with no kubelet or
# container behind them) at one pinned release, building it first if the
# cache lacks it. Built static from its Go module through the module proxy,
# in a throwaway module of its own (kwok's own go.mod pins its Kubernetes
# libraries; vpcni's go.mod is never touched). Cached in
# $VPCNI_KWOK_CACHE/<version>/kwok (/var/cache/vpcni-kwok); a no-op while
# that binary exists. Beside it, stages.yaml: kwok's own stage
# definitions from the same module (a node initialised and Ready at once,
# its Lease renewed; a pod created, Running and Ready within seconds,
# finished and deleted), which kwok needs to act at all. Used by
# `make bench-scale` (test/scale).
#
#   scripts/kwok.sh            build if needed (or wait for a build under
#                              way), print the binary's path
#   KWOK_VERSION=v0.x.y scripts/kwok.sh
set -euo pipefail

version=${KWOK_VERSION:-v0.8.0}
cache=${VPCNI_KWOK_CACHE:-/var/cache/vpcni-kwok}/$version
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

if [ -x "$cache/kwok" ] && [ -s "$cache/stages.yaml" ]; then
  echo "$cache/kwok"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -x "$cache/kwok" ] && [ -s "$cache/stages.yaml" ]; then
  echo "$cache/kwok"
  exit 0
fi
echo "building kwok $version into $cache (cold: a few minutes)" >&2
# A throwaway module requiring kwok at the release, built into a temporary
# directory and moved in: an interrupted build leaves no half-written
# binary that the check above would take for a cached one.
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(
  cd "$tmp"
  "$GO" mod init vpcni.local/kwokbuild >/dev/null 2>&1
  GOFLAGS=-mod=mod "$GO" get "sigs.k8s.io/kwok@$version" >&2
  # consts.Version makes `kwok --version` name the release it is.
  CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$version" \
    -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
  src=$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/general/pod-create.yaml pod/general/pod-init-container-running.yaml pod/general/pod-init-container-completed.yaml \
    pod/general/pod-ready.yaml pod/general/pod-complete.yaml pod/general/pod-delete.yaml; do
    echo "---"
    cat "$src/kustomize/stage/$f"
  done >"$tmp/stages.yaml"
)
mv "$tmp/stages.yaml" "$cache/stages.yaml"
mv "$tmp/kwok" "$cache/kwok"
echo "$cache/kwok"
