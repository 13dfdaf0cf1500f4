#!/usr/bin/env bash
# registry.sh — a real OCI registry (distribution's cmd/registry, the
# registry Docker Hub and Harbor run) on a loopback port of its own, and
# crane (go-containerregistry) as the standard client that pushes to it.
# Both are built static from their Go modules through the module proxy at
# pinned releases, outside vpcni's go.mod, and cached in
# $VPCNI_REGISTRY_CACHE/<name>-<version> (/var/cache/vpcni-registry).
#
#   scripts/registry.sh build           build both if needed, print the registry's path
#   scripts/registry.sh crane           build crane if needed, print its path
#   scripts/registry.sh up              start it (a leftover by recorded PID is stopped first)
#   scripts/registry.sh down            stop it by recorded PID, delete its storage
#   scripts/registry.sh status          exit 0 when it answers
#   scripts/registry.sh push ARCHIVE REF  crane push an OCI image layout archive
#                                        (make release's) as REF, e.g.
#                                        127.0.0.1:5100/vpcni/vpcni:v0.3.0
#
# Settings (environment):
#   VPCNI_REGISTRY_ADDR   listen address, 127.0.0.1:5100
#   VPCNI_REGISTRY_STATE  PID, config, log and storage: /var/tmp/vpcni-registry
#   VPCNI_REGISTRY_NETNS  a network namespace to run it (and push) in: the
#                         real-node e2e runs one on the node's own loopback,
#                         where its containerd pulls from.
set -euo pipefail

registry_version=v3.1.2
crane_version=v0.22.1
cache=${VPCNI_REGISTRY_CACHE:-/var/cache/vpcni-registry}
addr=${VPCNI_REGISTRY_ADDR:-127.0.0.1:5100}
state=${VPCNI_REGISTRY_STATE:-/var/tmp/vpcni-registry}
netns=${VPCNI_REGISTRY_NETNS:-}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

# gobuild NAME VERSION PKG — the cached binary's path, building it once
# (under a lock: two callers wait for one build). Built into a temporary
# GOBIN and moved in, so an interrupted build leaves no half binary.
gobuild() {
  local name=$1 version=$2 pkg=$3 dir=$cache/$1-$2
  if [ -x "$dir/$name" ]; then echo "$dir/$name"; return 0; fi
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [ ! -x "$dir/$name" ]; then
    echo "building $name $version into $dir (cold: a minute or two)" >&2
    local tmp
    tmp=$(mktemp -d "$dir/.build.XXXXXX")
    GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" install -trimpath -ldflags "-s -w" "$pkg@$version" >&2 || { rm -rf "$tmp"; return 1; }
    mv "$tmp/$name" "$dir/$name"
    rm -rf "$tmp"
  fi
  exec 9>&-
  echo "$dir/$name"
}
registry_bin() { gobuild registry "$registry_version" github.com/distribution/distribution/v3/cmd/registry; }
crane_bin() { gobuild crane "$crane_version" github.com/google/go-containerregistry/cmd/crane; }

in_ns() { if [ -n "$netns" ]; then ip netns exec "$netns" "$@"; else "$@"; fi; }

answers() { in_ns curl -fsS -m 2 -o /dev/null "http://$addr/v2/" 2>/dev/null; }

# stop stops the recorded process if it still is a registry serving our
# config (a recycled PID is left alone).
stop() {
  local pid
  pid=$(cat "$state/pid" 2>/dev/null || true)
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$state/config.yml"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    [ -e "/proc/$pid" ] && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$state/pid"
}

case ${1:-} in
build)
  crane_bin >/dev/null
  registry_bin
  ;;
crane)
  crane_bin
  ;;
up)
  bin=$(registry_bin)
  stop
  rm -rf "$state/storage"
  mkdir -p "$state/storage"
  # A port someone else holds would make our registry fail to bind, and a
  # client talk to theirs: refuse loudly instead.
  if in_ns ss -Hltn "sport = :${addr##*:}" | grep -q .; then
    echo "registry: $addr is taken by another process" >&2
    exit 1
  fi
  cat >"$state/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $state/storage
  delete:
    enabled: true
http:
  addr: $addr
EOF
  # setsid: the registry outlives this script and the caller's process
  # group. Neither setsid (not a group leader here) nor ip netns exec
  # forks: the PID recorded is the registry's.
  cmd=("$bin" serve "$state/config.yml")
  [ -z "$netns" ] || cmd=(ip netns exec "$netns" "${cmd[@]}")
  setsid "${cmd[@]}" >"$state/log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  for _ in $(seq 1 100); do
    if answers; then echo "registry: serving http://$addr (pid $(cat "$state/pid"), state $state)"; exit 0; fi
    [ -e "/proc/$(cat "$state/pid")" ] || break
    sleep 0.1
  done
  echo "registry: did not come up on $addr; log:" >&2
  tail -20 "$state/log" >&2
  stop
  exit 1
  ;;
down)
  stop
  rm -rf "$state/storage"
  ;;
status)
  answers && echo "registry: serving http://$addr"
  ;;
push)
  archive=${2:?usage: $0 push ARCHIVE REF}
  ref=${3:?usage: $0 push ARCHIVE REF}
  crane=$(crane_bin)
  # crane push reads an OCI image layout directory, not the archive: unpack
  # it to a scratch directory. index.json's one entry is pushed as it is:
  # the image index of a multi-platform archive, the manifest of a
  # single-platform one.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar -xf "$archive" -C "$tmp"
  in_ns "$crane" push --insecure "$tmp" "$ref"
  ;;
*)
  echo "usage: $0 build|crane|up|down|status|push ARCHIVE REF" >&2
  exit 2
  ;;
esac
