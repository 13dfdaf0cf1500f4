#!/usr/bin/env bash
# release.sh — what `make release` writes into OUT (bin/release), for each
# architecture in ARCHES (amd64 arm64):
#
#   vpcni-image-VERSION.oci.tar               the node image, every architecture (an OCI image index)
#   vpcni-image-VERSION-linux-ARCH.oci.tar    the node image, one architecture
#   vpcni-VERSION-linux-ARCH.tar.gz           the CNI plugin, vpcnictl and kubectl-vpcni, static
#   vpcni-CHARTVERSION.tgz                    the Helm chart (helm package)
#   vpcni-deploy-VERSION.tar.gz               deploy/ for kubectl apply -k, its image tag the version
#   SHA256SUMS                                sha256sum of each of the above
#
# Image archives are OCI image layouts in a tarball ("oci-archive"):
# `skopeo copy oci-archive:FILE docker://REGISTRY/vpcni/vpcni:VERSION`,
# `crane push` (of the unpacked directory), `ctr images import` read them.
# Each line printed names one artifact, its architecture ("all" for the
# multi-architecture image, the chart and the sums) and its size.
#
# Environment: VERSION (required; make passes git describe's), OUT, ARCHES,
# IMAGE_REPO (docker.io/vpcni/vpcni), GO, CA_BUNDLE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=${VERSION:?VERSION is required}
out=${OUT:-bin/release}
arches=${ARCHES:-amd64 arm64}
repo=${IMAGE_REPO:-docker.io/vpcni/vpcni}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# Fixed times keep archives reproducible: the commit's, not the clock's.
created=$(git log -1 --format=%ct 2>/dev/null || echo 0)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Helm wants SemVer: v0.3.0-2-gabc1234 is 0.3.0-2-gabc1234; a build with no
# release tag behind it is 0.0.0-g<describe>.
if [[ $version =~ ^v?[0-9]+\.[0-9]+\.[0-9]+ ]]; then chart_version=${version#v}; else chart_version=0.0.0-g$version; fi

work=$out/.work
rm -rf "$out"
mkdir -p "$work/tools"
trap 'rm -rf "$work"' EXIT
CGO_ENABLED=0 "$GO" build -trimpath -o "$work/tools/" ./tools/mkimage ./tools/ocilayout

labels=(-label "org.opencontainers.image.version=$version"
	-label "org.opencontainers.image.revision=$revision"
	-label "org.opencontainers.image.source=https://github.com/vpcni/vpcni"
	-label "org.opencontainers.image.title=vpcni"
	-label "org.opencontainers.image.licenses=Apache-2.0"
	-label "org.opencontainers.image.created=$(date -u -d "@$created" +%Y-%m-%dT%H:%M:%SZ)")
lines=()
note() { lines+=("$1 $2"); }

images=()
for arch in $arches; do
	d=$work/$arch
	mkdir -p "$d/bin"
	GOARCH=$arch CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X main.version=$version" -o "$d/bin/" ./cmd/...
	# kubectl-vpcni is for an operator's workstation (the CLI tarball below),
	# not the node image.
	mkdir -p "$d/cli" && mv "$d/bin/kubectl-vpcni" "$d/cli/"
	# The chained plugins stay built between releases (bin/cni-plugins-ARCH).
	GOARCH=$arch bash scripts/cni-plugins.sh "$(dirname "$out")/cni-plugins-linux-$arch"
	cp -r "$(dirname "$out")/cni-plugins-linux-$arch" "$d/cni-plugins"
	nft=$(bash scripts/image-nft.sh "$arch")
	# The same image as make image, for arch.
	# shellcheck disable=SC2086 # $nft is mkimage's arguments, one per word
	"$work/tools/mkimage" -name "$repo:$version" -arch "$arch" -out "$d/image.tar" \
		-tree "$d/bin:/usr/local/bin" -dir /tmp:1777 -entrypoint /usr/local/bin/vpcnid \
		-env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		-tree "$d/cni-plugins:/opt/cni-plugins" $nft \
		$([ -f "$ca" ] && echo -file "$ca:/etc/ssl/certs/ca-certificates.crt:0644") >/dev/null
	images+=("$d/image.tar")
	img=vpcni-image-$version-linux-$arch.oci.tar
	"$work/tools/ocilayout" -ref "$repo:$version" -created "$created" "${labels[@]}" -out "$out/$img" "$d/image.tar" >/dev/null
	note "$img" "$arch"
	# What a node needs outside the image to be driven by hand (the plugin
	# the runtime executes, the CLI) and the kubectl plugin for an
	# operator's workstation, in a reproducible tarball.
	tgz=vpcni-$version-linux-$arch.tar.gz
	mkdir -p "$d/dist/vpcni-$version-linux-$arch"
	cp "$d/bin/vpcni" "$d/bin/vpcnictl" "$d/cli/kubectl-vpcni" "$d/dist/vpcni-$version-linux-$arch/"
	tar -C "$d/dist" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$created" -cf - "vpcni-$version-linux-$arch" | gzip -n -9 >"$out/$tgz"
	note "$tgz" "$arch"
done

img=vpcni-image-$version.oci.tar
"$work/tools/ocilayout" -ref "$repo:$version" -created "$created" "${labels[@]}" -out "$out/$img" "${images[@]}" >/dev/null
note "$img" all

# The chart as released installs this release's image: its image.tag
# default (the first "  tag:" in values.yaml, under image:) becomes the
# version. A copy, symlinks followed (files/ links into deploy/).
helm=$(bash scripts/helm.sh)
cp -rL deploy/helm/vpcni "$work/vpcni"
sed -i "0,/^  tag: .*/s//  tag: \"$version\"/" "$work/vpcni/values.yaml"
grep -A3 '^image:' "$work/vpcni/values.yaml" | grep -qx "  tag: \"$version\"" ||
	{ echo "release: could not set image.tag in the chart's values.yaml" >&2; exit 1; }
msg=$("$helm" package "$work/vpcni" --version "$chart_version" --app-version "$version" -d "$work/chart" 2>&1) || { echo "$msg" >&2; exit 1; }
# helm dates the package's entries now: repacked with the commit's time
# (and sorted, gzip without a name or time), two releases of one commit
# give the same chart package, as they give the same images.
mkdir -p "$work/chart/x"
tar -xzmf "$work/chart/vpcni-$chart_version.tgz" -C "$work/chart/x"
tar -C "$work/chart/x" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$created" -cf - vpcni | gzip -n -9 >"$out/vpcni-$chart_version.tgz"
note "vpcni-$chart_version.tgz" all

# deploy/ as kubectl apply -k reads it, installing this release's image:
# the kustomization's newTag is the version (newName stays for the user's
# registry). Symlinks followed, as for the chart.
cp -rL deploy "$work/vpcni-deploy-$version"
rm -rf "$work/vpcni-deploy-$version/helm"
sed -i "s/^    newTag: .*/    newTag: \"$version\"/" "$work/vpcni-deploy-$version/kustomization.yaml"
grep -qx "    newTag: \"$version\"" "$work/vpcni-deploy-$version/kustomization.yaml" ||
	{ echo "release: could not set newTag in deploy/kustomization.yaml" >&2; exit 1; }
tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$created" -cf - "vpcni-deploy-$version" | gzip -n -9 >"$out/vpcni-deploy-$version.tar.gz"
note "vpcni-deploy-$version.tar.gz" all
(cd "$out" && sha256sum -- $(for l in "${lines[@]}"; do echo "${l%% *}"; done) >SHA256SUMS)
note SHA256SUMS all

for l in "${lines[@]}"; do
	f=${l%% *} arch=${l#* }
	size=$(stat -c %s "$out/$f")
	echo "release: $f arch=$arch size=$(awk -v b="$size" 'BEGIN { if (b >= 1048576) printf "%.1fMiB", b/1048576; else printf "%.1fKiB", b/1024 }')"
done
