#!/usr/bin/env bash
# Installs what vpcni's build and tests need, idempotently: only what is
# missing is installed. Debian/Ubuntu, as root.
set -euo pipefail

# clang, llvm and libbpf-dev build mode ebpf's tc programs (go generate,
# make verify-generate); the committed object is what nodes run.
# containerd and runc: test/release pulls and runs the release image (the
# real-node fixture runs them too); skopeo: test/release pushes with it.
pkgs=(iproute2 nftables iptables containernetworking-plugins iperf3 sockperf kmod procps util-linux clang llvm libbpf-dev containerd runc skopeo)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  echo "Go is required at /usr/local/go (https://go.dev/dl/)" >&2
  exit 1
fi
export PATH=/usr/local/go/bin:$PATH
# Modules the build and tests use, fetched once.
go mod download

# Upstream portmap and bandwidth (scripts/cni-plugins.sh pins the release):
# Debian's (1.1.1) speak CNI only up to 1.0.0, and vpcni is chained at 1.1.0 too.
upstream=/usr/local/lib/vpcni/cni-upstream
bash "$(dirname "${BASH_SOURCE[0]}")/cni-plugins.sh" "$upstream"

for tool in /usr/lib/cni/ptp /usr/lib/cni/host-local /usr/lib/cni/portmap /usr/lib/cni/bandwidth $upstream/portmap $upstream/bandwidth; do
  [ -x "$tool" ] || { echo "missing $tool after install" >&2; exit 1; }
done
# The EC2 tests hold vpcni's EC2 code to moto_server (Python moto 5.2.1, an
# EC2 emulator others wrote). It comes from PyPI, which the test machines do
# not reach: it must be installed beforehand.
if ! command -v moto_server >/dev/null; then
  echo "moto_server is required for the EC2 tests: pip install 'moto[server]==5.2.1'" >&2
  exit 1
fi
echo "dependencies ready"
