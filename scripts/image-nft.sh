#!/bin/bash
# image-nft.sh [ARCH] — mkimage arguments that put nft and the shared
# libraries it loads into the node image, at the paths the loader looks for
# them. vpcnid's SNAT table is written through knftables, which runs nft;
# the image is otherwise static Go binaries.
#
# ARCH (GOARCH naming, default: this machine's) is the image's architecture.
# For this machine's own, nft and its libraries are taken from this
# machine. For another (make release's arm64), Debian's packages of that
# architecture are downloaded and unpacked instead: the same packages this
# machine's nft and libraries come from, from the same mirrors, through apt
# with a private state and architecture (the host's dpkg architectures stay
# as they are). Cached in $VPCNI_RELEASE_CACHE/apt-ARCH
# (/var/cache/vpcni-release); the first run fetches ~3 MB.
set -euo pipefail
host=$(dpkg --print-architecture)
arch=${1:-$host}
nft=$(command -v nft) || { echo "image-nft: nft is not installed (make deps installs nftables)" >&2; exit 1; }
# ldd prints "name => /path (addr)" for libraries and "/path (addr)" for
# the loader.
libs=$(ldd "$nft" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')

if [ "$arch" = "$host" ]; then
	echo -file "$(readlink -f "$nft"):/usr/sbin/nft:0755"
	for lib in $libs; do
		echo -file "$(readlink -f "$lib"):$lib:0755"
	done
	exit 0
fi

# Debian's multiarch triplets and program loaders, by architecture.
triplet() { case $1 in amd64) echo x86_64-linux-gnu ;; arm64) echo aarch64-linux-gnu ;; *) return 1 ;; esac; }
loader() { case $1 in amd64) echo /lib64/ld-linux-x86-64.so.2 ;; arm64) echo /lib/ld-linux-aarch64.so.1 ;; *) return 1 ;; esac; }
htrip=$(triplet "$host") && ttrip=$(triplet "$arch") && tloader=$(loader "$arch") ||
	{ echo "image-nft: no Debian triplet known for $host or $arch" >&2; exit 1; }

# The packages holding nft and each library here (dpkg -S knows a file by
# the path its package ships, which under merged /usr may be the /usr one).
owner() {
	local p
	for p in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
		dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1 && return 0
	done
	echo "image-nft: no package owns $1" >&2
	return 1
}
pkgs=$(for f in "$nft" $libs; do owner "$f"; done | sort -u)

cache=${VPCNI_RELEASE_CACHE:-/var/cache/vpcni-release}/apt-$arch
root=$cache/root
stamp=$(echo "$pkgs" | tr '\n' ' ')
if [ "$(cat "$cache/packages" 2>/dev/null)" != "$stamp" ] || [ ! -x "$root/usr/sbin/nft" ]; then
	mkdir -p "$cache/state/lists/partial" "$cache/cache/archives/partial"
	touch "$cache/state/status"
	# An empty dpkg status: apt resolves nothing against the host's
	# installed packages; it only downloads the named ones.
	apt=(apt-get -qq -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
		-o "Dir::State=$cache/state" -o "Dir::State::status=$cache/state/status"
		-o "Dir::Cache=$cache/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
	echo "image-nft: fetching Debian's $arch packages: $stamp" >&2
	"${apt[@]}" update >&2
	rm -rf "$cache/debs" "$root" && mkdir -p "$cache/debs" "$root"
	(cd "$cache/debs" && "${apt[@]}" download $pkgs >&2)
	for deb in "$cache"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
	echo "$stamp" >"$cache/packages"
fi

# resolve PATH — the regular file PATH names inside $root, following
# symbolic links (absolute ones from $root), trying /usr as merged /usr would.
resolve() {
	local f=$1 t i
	[ -e "$root$f" ] || [ -L "$root$f" ] || f=/usr$f
	f=$root$f
	for i in $(seq 1 20); do
		[ -L "$f" ] || break
		t=$(readlink "$f")
		case $t in /*) f=$root$t ;; *) f=$(dirname "$f")/$t ;; esac
		[ -e "$f" ] || [ -L "$f" ] || f=$root/usr${f#"$root"}
	done
	[ -f "$f" ] || { echo "image-nft: $1 is not in Debian's $arch packages (looked in $root)" >&2; return 1; }
	echo "$f"
}

echo -file "$(resolve /usr/sbin/nft):/usr/sbin/nft:0755"
for lib in $libs; do
	case $lib in
	*/ld-linux*) dst=$tloader ;;
	*) dst=${lib//$htrip/$ttrip} ;;
	esac
	echo -file "$(resolve "$dst"):$dst:0755"
done
