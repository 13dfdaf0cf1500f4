#!/bin/bash
# conformance.sh — Kubernetes' own [sig-network] e2e tests (e2e.test from the
# k8s.io/kubernetes module at the fixture's version) against vpcni on the
# real-node fixture (scripts/k8s-node.sh), and the summary line that joins
# them with cri-tools' critest.
#
#   scripts/conformance.sh build         e2e.test, agnhost and the test images (cached;
#                                        waits for a build under way)
#   scripts/conformance.sh build-coredns CoreDNS and its image, for the DNS tests (cached)
#   scripts/conformance.sh summary       print the closing `conformance:` line
#   scripts/conformance.sh dualstack-summary  print make dualstack's closing `dualstack:` line
#
# The run itself is test/k8se2e TestConformance (a Go test: lab node, fixture, vpcni
# through deploy/, then e2e.test inside the node's network namespace);
# `make conformance` and `make conformance-subset` drive both.
set -euo pipefail

# The fixture's cache layout, Go, version and helpers (sourcing runs
# nothing); this script's own log and die below.
# shellcheck source=k8s-node.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-node.sh"
# Where the runs leave their results: the e2e's JUnit report and summary,
# and (written by the critest step when it ran) critest's figures.
RESULTS=${VPCNI_CONFORMANCE_RESULTS:-/var/tmp/vpcni-conformance}
# Debian packages whose binaries (with their shared libraries) go into the
# agnhost image, standing in for the Alpine packages its Dockerfile adds.
E2E_APT_PKGS=(curl netcat-openbsd iproute2 bind9-dnsutils busybox-static)
# CoreDNS for the DNS conformance tests: the version kubeadm pins for this
# Kubernetes (cmd/kubeadm/app/constants CoreDNSVersion), built from its Go
# module; the image name is ours (the test's manifest says Never pull).
COREDNS_VERSION=${COREDNS_VERSION:-1.14.2}
COREDNS_IMAGE=vpcni.local/coredns:v$COREDNS_VERSION

log() { printf '[conformance %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { echo "conformance: $*" >&2; exit 1; }

# The e2e's own throwaway module, beside the fixture's: the fixture's go.mod
# (k8s.io/kubernetes at $K8S_VERSION, every staging module replaced by its
# published v0.x.y) under another module path, plus a tools.go importing
# what e2e.test's test files and agnhost's main import, so that `go mod
# tidy` keeps their dependencies (a main package cannot be imported; the
# test files of a dependency are not looked at by tidy). A module of its own
# so that the fixture's `build` (which tidies its module) and this one never
# rewrite each other's go.mod.
write_e2e_module() {
	local mod=$CACHE/e2e-mod p
	[ -f "$CACHE/mod/go.mod" ] || die "no fixture module in $CACHE/mod: run scripts/k8s-node.sh build first"
	mkdir -p "$mod"
	sed 's|^module .*|module vpcni.local/k8se2e|' "$CACHE/mod/go.mod" >"$mod/go.mod"
	cp "$CACHE/mod/go.sum" "$mod/go.sum"
	{
		echo '//go:build tools'
		echo
		echo '// Package tools keeps the dependencies of e2e.test and agnhost in go.mod.'
		echo 'package tools'
		echo
		echo 'import ('
		for p in $(cd "$mod" && "$GO" list -e -f '{{join .TestImports "\n"}}' k8s.io/kubernetes/test/e2e) \
			$(cd "$mod" && "$GO" list -e -f '{{join .Imports "\n"}}' k8s.io/kubernetes/test/images/agnhost) \
			k8s.io/kubernetes/test/e2e; do
			case $p in *.*/*) printf '\t_ "%s"\n' "$p" ;; esac
		done | sort -u
		echo ')'
	} >"$mod/tools.go"
	(cd "$mod" && "$GO" mod tidy >/dev/null)
}

build_bins() {
	local mod=$CACHE/e2e-mod ldf minor p
	minor=$(echo "$K8S_VERSION" | cut -d. -f2)
	ldf="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldf+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	log "go test -c k8s.io/kubernetes/test/e2e (cold: see docs/k8s-node.md)"
	(cd "$mod" && CGO_ENABLED=0 "$GO" test -c -vet=off -trimpath -ldflags "$ldf" -o "$CACHE/bin/e2e.test.tmp" k8s.io/kubernetes/test/e2e)
	mv "$CACHE/bin/e2e.test.tmp" "$CACHE/bin/e2e.test"
	log "go build k8s.io/kubernetes/test/images/agnhost"
	(cd "$mod" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldf" -o "$CACHE/bin/agnhost" k8s.io/kubernetes/test/images/agnhost)
}

# CoreDNS from its own throwaway module (its main package imported by a
# tools.go only so that `go mod tidy` resolves its dependencies).
build_coredns() {
	local mod=$CACHE/coredns-mod
	mkdir -p "$mod"
	printf 'module vpcni.local/coredns\n\ngo 1.24\n\nrequire github.com/coredns/coredns v%s\n' "$COREDNS_VERSION" >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/coredns/coredns"\n' >"$mod/tools.go"
	log "go build coredns v$COREDNS_VERSION"
	(cd "$mod" && "$GO" mod tidy >/dev/null 2>&1 && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$CACHE/bin/coredns" github.com/coredns/coredns)
	"$CACHE/bin/mkimage" -name "$COREDNS_IMAGE" -out "$CACHE/images/coredns.tar" -entrypoint /coredns \
		-file "$CACHE/bin/coredns:/coredns:0755" -dir /tmp:1777 >/dev/null
	echo "$COREDNS_IMAGE" >"$CACHE/images/coredns.name"
}

# image_ref NAME prints the reference the e2e framework asks for, read from
# the module's test/utils/image/manifest.go (configs[X] = Config{registry, name, version}).
image_ref() {
	local name=$1 manifest
	manifest=$(cd "$CACHE/e2e-mod" && "$GO" list -f '{{.Dir}}' k8s.io/kubernetes/test/utils/image)/manifest.go
	awk -v n="$1" '
		/PromoterE2eRegistry: / { gsub(/[",]/, "", $2); reg["list.PromoterE2eRegistry"] = $2 }
		/GcRegistry: / { gsub(/[",]/, "", $2); reg["list.GcRegistry"] = $2 }
		$1 == "configs[" n "]" {
			sub(/.*Config\{/, ""); sub(/\}.*/, ""); gsub(/[" ]/, "")
			split($0, f, ","); print reg[f[1]] "/" f[2] ":" f[3]; exit
		}' "$manifest"
}

# libs_of BIN… prints -file arguments for each binary's shared libraries
# and the loader, at the paths the loader looks for them.
libs_of() {
	local lib
	for lib in $(ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
		printf -- '-file\n%s:%s:0755\n' "$(readlink -f "$lib")" "$lib"
	done
}

build_images() {
	local img=$CACHE/images mk=$CACHE/bin/mkimage agn bb pause dnst nginx src tmp b applet args=()
	mkdir -p "$img"
	agn=$(image_ref Agnhost)
	bb=$(image_ref BusyBox)
	pause=$(image_ref Pause)
	dnst=$(image_ref GlibcDnsTesting)
	nginx=$(image_ref Nginx)
	[ -n "$agn" ] && [ -n "$bb" ] && [ -n "$pause" ] && [ -n "$dnst" ] && [ -n "$nginx" ] || die "cannot read the image names from manifest.go"
	src=$(cd "$CACHE/e2e-mod" && "$GO" list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost)
	tmp=$(mktemp -d)
	# What agnhost's Dockerfile puts in its Alpine image, from Debian:
	# curl, nc (OpenBSD's, as the tests pass it -z/-w/-u), ss and ip, dig,
	# getent, bash, a shell (dash) and the usual tools (busybox); /uploads for netexec, porter's
	# certificate, the agnhost-2 link, and the user and group it adds.
	# Each Debian binary comes with its shared libraries.
	printf 'root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >"$tmp/passwd"
	# getent (the DNS tests' /etc/hosts checks) is glibc's: tell it where to look.
	printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$tmp/nsswitch.conf"
	printf 'root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >"$tmp/group"
	# The tools both Debian-built images share (the DNS tests' second
	# querier, glibc-dns-testing, is Debian with dnsutils: dig and glibc's
	# getent; agnhost gets them too, as its Dockerfile adds bind-tools).
	local tools=(-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		-file "$tmp/passwd:/etc/passwd:0644" -file "$tmp/group:/etc/group:0644" -file "$tmp/nsswitch.conf:/etc/nsswitch.conf:0644"
		-file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:0644
		-dir /tmp:1777 -dir /root -dir /var/run)
	local debbins=(/usr/bin/curl /bin/nc.openbsd /bin/ss /bin/ip /usr/bin/dig /usr/bin/nslookup /usr/bin/host /usr/bin/getent /bin/bash)
	for b in "${debbins[@]}"; do
		tools+=(-file "$(readlink -f "$b"):/usr/bin/$(basename "$b"):0755")
	done
	# The shell is Debian's dash, not busybox's: Debian builds busybox as a
	# standalone shell that runs its own applets (ip, …) before anything
	# in PATH.
	debbins+=(/bin/dash)
	tools+=(-file "$(readlink -f /bin/dash):/bin/sh:0755" -symlink /usr/bin/nc:nc.openbsd -symlink /bin/bash:/usr/bin/bash)
	mapfile -t -O "${#tools[@]}" tools < <(libs_of "${debbins[@]}")
	tools+=(-file /bin/busybox:/bin/busybox:0755)
	for applet in $(/bin/busybox --list); do
		case " sh ash bash nc ss ip dig nslookup host curl getent busybox " in *" $applet "*) continue ;; esac
		tools+=(-symlink "/bin/$applet:busybox")
	done
	"$mk" -name "$dnst" -out "$img/glibc-dns-testing.tar" -cmd sh "${tools[@]}" >/dev/null
	args=(-name "$agn" -out "$img/agnhost.tar" -entrypoint /agnhost -cmd pause "${tools[@]}"
		-file "$CACHE/bin/agnhost:/agnhost:0755" -symlink /agnhost-2:agnhost
		-file "$src/porter/localhost.crt:/localhost.crt:0644" -file "$src/porter/localhost.key:/localhost.key:0600"
		-dir /uploads -dir /home/user-defined-in-image)
	"$mk" "${args[@]}" >/dev/null
	# busybox: the same static busybox as the fixture's own image.
	args=(-name "$bb" -out "$img/e2e-busybox.tar" -cmd sh -file /bin/busybox:/bin/busybox:0755 -dir /tmp:1777 -dir /etc -dir /root -dir /var)
	for applet in $(/bin/busybox --list); do
		[ "$applet" = busybox ] || args+=(-symlink "/bin/$applet:busybox")
	done
	"$mk" "${args[@]}" >/dev/null
	# pause: this repo's tools/pause, under the framework's tag.
	"$mk" -name "$pause" -out "$img/e2e-pause.tar" -entrypoint /pause -file "$CACHE/bin/pause:/pause:0755" >/dev/null
	# nginx: the EndpointSlice and Endpoints tests' pods run it (only their
	# endpoints are checked, nothing connects): critest's web server image,
	# Debian's nginx, under the framework's name.
	bash "$REPO/scripts/critest.sh" nginx-image "$nginx" "$img/e2e-nginx.tar"
	rm -rf "$tmp"
	printf '%s\n' "$agn" "$bb" "$pause" "$dnst" "$nginx" >"$img/e2e.names"
	log "images: $agn $bb $pause $dnst $nginx"
}

# The stamp: what the outputs depend on. Go's own caches make a rebuild
# cheap, but `go test -c` of the e2e still links for ~1 min; skip it all
# while nothing changed.
stamp_key() {
	{
		echo "$K8S_VERSION"
		"$GO" version
		sha256sum "$REPO/scripts/conformance.sh" "$REPO/scripts/critest.sh" "$CACHE/mod/go.mod"
		cat "$REPO"/tools/mkimage/*.go "$REPO"/internal/ociimage/*.go "$REPO"/tools/pause/*.go | sha256sum
		dpkg-query -W -f='${Package} ${Version}\n' "${E2E_APT_PKGS[@]}"
	} | sha256sum | cut -c1-32
}

# all_built: every image build_images writes is there.
all_built() {
	local f
	for f in agnhost glibc-dns-testing e2e-busybox e2e-pause e2e-nginx; do
		[ -f "$CACHE/images/$f.tar" ] || return 1
	done
}

cmd_build() {
	local key t0
	bash "$REPO/scripts/k8s-node.sh" build
	# One build at a time: `make test` starts one in the background (it
	# overlaps the integration suites, which mostly wait on their servers),
	# and the e2e that needs e2e.test waits for it here.
	mkdir -p "$CACHE"
	exec 8>"$CACHE/.e2e-build.lock"
	flock 8
	ensure_apt "${E2E_APT_PKGS[@]}"
	key=$(stamp_key)
	if [ "$(cat "$CACHE/e2e.stamp" 2>/dev/null)" = "$key" ] && [ -x "$CACHE/bin/e2e.test" ] && all_built; then
		log "e2e.test, agnhost and images: cached ($CACHE)"
		return
	fi
	t0=$(date +%s)
	write_e2e_module
	build_bins
	build_images
	echo "$key" >"$CACHE/e2e.stamp"
	log "built in $(($(date +%s) - t0)) s: $CACHE/bin/e2e.test, $CACHE/images/{agnhost,glibc-dns-testing,e2e-busybox,e2e-pause,e2e-nginx}.tar"
}

# CoreDNS has a stamp of its own: only the DNS tests need it, and the
# focused subset should not pay its ~3 min cold build.
cmd_build_coredns() {
	local key
	key="$COREDNS_VERSION $("$GO" env GOVERSION) $(cat "$REPO"/tools/mkimage/*.go "$REPO"/internal/ociimage/*.go | sha256sum | cut -c1-16)"
	if [ "$(cat "$CACHE/coredns.stamp" 2>/dev/null)" = "$key" ] && [ -f "$CACHE/images/coredns.tar" ]; then
		log "coredns v$COREDNS_VERSION: cached"
		return
	fi
	[ -x "$CACHE/bin/mkimage" ] || die "no mkimage in $CACHE/bin: run scripts/k8s-node.sh build first"
	build_coredns
	echo "$key" >"$CACHE/coredns.stamp"
}

# The closing line. The e2e's figures come from TestConformance's result
# file; critest's from the file its step writes (a line
# critest_passed=C/D) if that step ran. A file older than this run's start
# ($RESULTS/.started, which make conformance touches) is an earlier run's
# and does not count.
fresh() { [ -f "$1" ] && { [ ! -f "$RESULTS/.started" ] || [ "$1" -nt "$RESULTS/.started" ]; }; }

# passed FILE KEY PREFIX WHAT prints the A/B of a fresh result file's line
# KEY=A/B, or 0/0 when the file is missing or an earlier run's, saying so
# (PREFIX: WHAT) on stderr.
passed() {
	if fresh "$1"; then
		sed -n "s/^$2=//p" "$1"
	else
		echo "$3: $4 (no fresh $1)" >&2
		echo 0/0
	fi
}

cmd_summary() {
	local k8s cri
	k8s=$(passed "$RESULTS/k8s.result" k8s_passed conformance "the Kubernetes e2e did not run to its end")
	cri=$(passed "$RESULTS/critest.result" critest_passed conformance "critest not run")
	echo "conformance: k8s_passed=${k8s:-0/0} critest_passed=${cri:-0/0}"
}

# make dualstack's closing line: TestDualStackConformance's two runs on the
# dual-stack cluster, the dual-stack specs and then the conformance set.
cmd_dualstack_summary() {
	local ds conf
	ds=$(passed "$RESULTS/dualstack/k8s.result" k8s_passed dualstack "the dual-stack specs did not run to their end")
	conf=$(passed "$RESULTS/dualstack-conformance/k8s.result" k8s_passed dualstack "the conformance set did not run to its end")
	echo "dualstack: k8s_passed=${ds:-0/0} conformance_passed=${conf:-0/0}"
}

main() {
	case ${1:-} in
	build) cmd_build ;;
	build-coredns) cmd_build_coredns ;;
	summary) cmd_summary ;;
	dualstack-summary) cmd_dualstack_summary ;;
	image-ref) image_ref "$2" ;;
	*) echo "usage: $0 build|build-coredns|summary|dualstack-summary|image-ref NAME" >&2; exit 2 ;;
	esac
}

# One line, read whole before it runs: an edit of this file during a long
# build cannot change what runs after it.
main "$@"; exit $?
