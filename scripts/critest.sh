#!/bin/bash
# critest.sh — cri-tools' critest and the images its networking tests ask
# for, built locally and cached beside the real-node fixture's build.
#
#   scripts/critest.sh build    build what is missing (a no-op when cached);
#                               prints CRITEST=… and CRITEST_IMAGES=… lines
#   scripts/critest.sh nginx-image NAME OUT
#                               the web server image alone, named NAME
#
# critest is built from sigs.k8s.io/cri-tools at the version the fixture's
# crictl is (CRICTL_VERSION in scripts/k8s-node.sh), the way crictl is built
# there: a throwaway module, because `go install …@version` asks the proxy
# for the module's version list, which the proxy here refuses. test/critest
# runs it against the fixture's containerd with vpcni as its CNI.
set -euo pipefail

# The fixture's cache layout, Go, versions and helpers (sourcing runs nothing).
# shellcheck source=k8s-node.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-node.sh"

CRITEST_BIN=$CACHE/bin/critest
CRITEST_IMG=$CACHE/images/critest

# The images critest v1.36's networking tests run (pkg/validate/consts.go,
# pkg/framework/util.go): every container but the web server is the default
# test image; the port-mapping tests' container is the web server.
CRITEST_BUSYBOX=registry.k8s.io/e2e-test-images/busybox:1.29-2
CRITEST_NGINX=registry.k8s.io/e2e-test-images/nginx:1.14-2

# The test binary needs the test-only imports of cmd/critest in the module
# graph (go mod tidy keeps a dependency's packages, not its tests' imports):
# the tools file names them.
build_critest() {
	local mod=$CACHE/critest-mod
	log "go test -c critest v$CRICTL_VERSION (cold ~2-3 min)"
	mkdir -p "$mod" "$CACHE/bin"
	printf 'module vpcni.local/critest\n\ngo 1.24\n\nrequire sigs.k8s.io/cri-tools v%s\n' "$CRICTL_VERSION" >"$mod/go.mod"
	cat >"$mod/tools.go" <<'EOT'
//go:build tools

package tools

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/ginkgo/v2/types"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/common"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
	_ "sigs.k8s.io/cri-tools/pkg/version"
)
EOT
	(cd "$mod" && "$GO" mod tidy >/dev/null 2>&1 &&
		CGO_ENABLED=0 "$GO" test -c -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
			-o "$CRITEST_BIN.tmp" sigs.k8s.io/cri-tools/cmd/critest)
	mv "$CRITEST_BIN.tmp" "$CRITEST_BIN"
}

# deb_root PKG DIR: the package's files under DIR (apt-get download; the
# package lists are fetched once if this machine never did).
deb_root() {
	local tmp
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get download -qq "$1" >/dev/null 2>&1) ||
		{ apt-get update -qq >/dev/null && (cd "$tmp" && apt-get download -qq "$1" >/dev/null 2>&1); } ||
		{ rm -rf "$tmp"; die "apt-get download $1 failed"; }
	dpkg-deb -x "$tmp"/"$1"_*.deb "$2"
	rm -rf "$tmp"
}

# libs BINARY: mkimage -file arguments for the shared libraries it loads, at
# the paths the loader looks for them (as scripts/image-nft.sh does).
libs() {
	local lib
	for lib in $(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
		echo -file "$(readlink -f "$lib"):$lib:0755"
	done
}

# The default test image: Debian's static busybox, as the fixture's
# busybox; the tests run top, cat /etc/resolv.conf and hostname in it.
build_busybox() {
	local tmp applet args
	tmp=$(mktemp -d)
	deb_root busybox-static "$tmp/root"
	args=(-name "$CRITEST_BUSYBOX" -out "$CRITEST_IMG/busybox.tar" -cmd sh -file "$tmp/root/bin/busybox:/bin/busybox:0755" -dir /tmp:1777 -dir /etc -dir /root -dir /var)
	for applet in $("$tmp/root/bin/busybox" --list); do
		[ "$applet" = busybox ] || args+=(-symlink "/bin/$applet:busybox")
	done
	"$CACHE/bin/mkimage" "${args[@]}" >/dev/null
	rm -rf "$tmp"
}

# The web server: upstream's e2e nginx image is nginx (1.14) serving its
# welcome page on port 80, and the port-mapping tests check only that
# GET / answers 200 at pod-IP:80 and at 127.0.0.1:hostPort. This is
# Debian's nginx (1.22) and its shared libraries with a configuration that
# does that: master as root, workers as nobody, port 80, a static index.
# build_nginx NAME OUT writes it as image NAME to OUT (scripts/conformance.sh
# asks for one too, under the e2e framework's nginx name).
build_nginx() {
	local name=$1 out=$2 tmp bin args
	tmp=$(mktemp -d)
	deb_root nginx "$tmp/root"
	bin=$tmp/root/usr/sbin/nginx
	mkdir -p "$tmp/files"
	cat >"$tmp/files/nginx.conf" <<'EOC'
user nobody nogroup;
worker_processes 1;
daemon off;
pid /run/nginx.pid;
error_log stderr;
events { worker_connections 256; }
http {
	access_log /dev/stdout;
	default_type text/html;
	server {
		listen 80;
		root /usr/share/nginx/html;
		index index.html;
	}
}
EOC
	printf '<!DOCTYPE html>\n<html><head><title>nginx</title></head><body><p>nginx test page (vpcni critest image)</p></body></html>\n' >"$tmp/files/index.html"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$tmp/files/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/files/group"
	# shellcheck disable=SC2046 # libs prints one argument a word
	args=(-name "$name" -out "$out" -entrypoint /usr/sbin/nginx
		-file "$bin:/usr/sbin/nginx:0755" $(libs "$bin")
		-file "$tmp/files/nginx.conf:/etc/nginx/nginx.conf:0644"
		-file "$tmp/files/index.html:/usr/share/nginx/html/index.html:0644"
		-file "$tmp/files/passwd:/etc/passwd:0644" -file "$tmp/files/group:/etc/group:0644"
		-dir /tmp:1777 -dir /run -dir /var/lock -dir /var/log/nginx -dir /var/lib/nginx)
	"$CACHE/bin/mkimage" "${args[@]}" >/dev/null
	rm -rf "$tmp"
}

critest_key() {
	echo "cri-tools=$CRICTL_VERSION $("$GO" env GOVERSION)"
}

images_key() {
	cat "${BASH_SOURCE[0]}" "$REPO"/tools/mkimage/*.go "$REPO"/internal/ociimage/*.go | sha256sum | cut -c1-16
}

cmd_critest_build() {
	local key
	# the fixture's build: containerd, crictl, mkimage, the pause image
	cmd_build
	key=$(critest_key)
	if [ "$(cat "$CACHE/critest.stamp" 2>/dev/null)" != "$key" ] || [ ! -x "$CRITEST_BIN" ]; then
		rm -f "$CACHE/critest.stamp"
		build_critest
		echo "$key" >"$CACHE/critest.stamp"
		log "critest: built $CRITEST_BIN"
	fi
	key=$(images_key)
	if [ "$(cat "$CRITEST_IMG/stamp" 2>/dev/null)" != "$key" ]; then
		rm -f "$CRITEST_IMG/stamp"
		mkdir -p "$CRITEST_IMG"
		build_busybox
		build_nginx "$CRITEST_NGINX" "$CRITEST_IMG/nginx.tar"
		echo "$key" >"$CRITEST_IMG/stamp"
		log "critest: images $CRITEST_BUSYBOX $CRITEST_NGINX ($CRITEST_IMG)"
	fi
	log "critest: up to date"
	echo "CRITEST=$CRITEST_BIN"
	echo "CRITEST_VERSION=$CRICTL_VERSION"
	echo "CRITEST_IMAGES=$CRITEST_IMG/busybox.tar $CRITEST_IMG/nginx.tar"
}

case ${1:-} in
build) cmd_critest_build ;;
nginx-image)
	[ $# -eq 3 ] || die "usage: $0 nginx-image NAME OUT"
	build_nginx "$2" "$3"
	;;
*)
	echo "usage: $0 build | nginx-image NAME OUT" >&2
	exit 2
	;;
esac
