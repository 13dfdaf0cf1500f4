#!/bin/bash
# image-nft.sh — mkimage arguments that put this machine's nft and the
# shared libraries it loads into the node image, at the paths the loader
# looks for them. vpcnid's SNAT table is written through knftables, which
# runs nft; the image is otherwise static Go binaries. (Debian's nft is
# built for this machine's architecture, as the image is.)
set -euo pipefail
nft=$(command -v nft) || { echo "image-nft: nft is not installed (make deps installs nftables)" >&2; exit 1; }
echo -file "$(readlink -f "$nft"):/usr/sbin/nft:0755"
# ldd prints "name => /path (addr)" for libraries and "/path (addr)" for
# the loader.
for lib in $(ldd "$nft" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
	echo -file "$(readlink -f "$lib"):$lib:0755"
done
