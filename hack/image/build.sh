#!/usr/bin/env bash
# Builds the csi-fastblk container image as an OCI image archive
# (bin/csi-fastblk-image.oci.tar: an OCI image layout in a tar) with no
# container engine and no image pulls:
#   1. resolve hack/image/packages.txt to a package closure with apt-cache,
#   2. apt-get download those .debs and dpkg-deb -x them into a root filesystem,
#   3. add bin/csi-fastblk-static as /usr/bin/csi-fastblk,
#   4. check every ELF finds its libraries and the plugin runs (chroot),
#   5. write the layout with umoci (one layer) and tar it.
# Tag: $IMAGE_TAG, else the VERSION file, else "dev". `make image` builds the
# static binary first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

BIN="${BIN:-bin/csi-fastblk-static}"
OUT="${OUT:-bin/csi-fastblk-image.oci.tar}"
TAG="${IMAGE_TAG:-$( [[ -s VERSION ]] && tr -d ' \n' <VERSION || echo dev)}"
NAME="csi-fastblk"

[[ -x "$BIN" ]] || { echo "build.sh: $BIN missing; run make static (or make image)" >&2; exit 1; }

need() { # need CMD PACKAGE: install PACKAGE from Debian when CMD is missing
	command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }
}
need umoci umoci
need dpkg-deb dpkg
need apt-get apt
apt-cache policy e2fsprogs | grep -q 'Candidate: [0-9]' || apt-get update -qq

work=$(mktemp -d)
# KEEP_ROOTFS=1 leaves the work directory for inspection.
[[ -n ${KEEP_ROOTFS:-} ]] || trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs" "$work/debs"

# resolve prints the Depends/Pre-Depends closure of the root packages, taking
# the first alternative of each group and skipping virtual and excluded names.
# One apt-cache call per level of the dependency tree keeps it fast.
resolve() {
	local -A seen=() deny=()
	local level=() next=() p line
	while read -r line; do
		line=${line%%#*}; line=${line//[[:space:]]/}
		[[ -z $line ]] && continue
		if [[ $line == !* ]]; then deny[${line#!}]=1; else next+=("$line"); fi
	done <hack/image/packages.txt
	while ((${#next[@]})); do
		level=()
		for p in "${next[@]}"; do
			[[ -n ${seen[$p]:-} || -n ${deny[$p]:-} ]] && continue
			seen[$p]=1
			level+=("$p")
		done
		((${#level[@]})) || break
		mapfile -t next < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
			--no-replaces --no-enhances "${level[@]}" | awk '
			/^[^ ]/ { skip = 0; next }
			/^ *\|?(Pre)?Depends: / {
				alt = ($0 ~ /^ *\|/)
				if (!skip) { name = $2; if (name !~ /^</) { sub(/:any$/, "", name); print name } }
				skip = alt
			}' | sort -u)
	done
	printf '%s\n' "${!seen[@]}" | sort
}

resolve >"$work/packages"
echo "image packages ($(wc -l <"$work/packages")): $(tr '\n' ' ' <"$work/packages")"
# .debs are cached by exact version, so a rebuild downloads nothing new.
debs="${CSI_FASTBLK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-fastblk}/debs"
mkdir -p "$debs"
xargs apt-cache policy <"$work/packages" | awk '/^[^ ]/ {sub(/:$/, ""); p = $1} /Candidate:/ {print p, $2}' |
	while read -r p ver; do
		f=$(ls "$debs/${p}_${ver/:/%3a}_"*.deb 2>/dev/null | head -n1 || true)
		if [[ -z $f ]]; then
			(cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "$p=$ver")
			f=$(ls "$debs/${p}_${ver/:/%3a}_"*.deb | head -n1)
		fi
		ln -s "$f" "$work/debs/"
	done
[[ $(ls "$work/debs" | wc -l) -eq $(wc -l <"$work/packages") ]] || { echo "package download incomplete" >&2; exit 1; }
for deb in "$work"/debs/*.deb; do
	dpkg-deb -x "$deb" "$rootfs"
done
# Record what is inside, like dpkg would (read by `status` and scanners).
mkdir -p "$rootfs/usr/share/csi-fastblk"
for deb in "$work"/debs/*.deb; do
	dpkg-deb -f "$deb" Package Version | paste -sd' '
done | sort >"$rootfs/usr/share/csi-fastblk/packages.txt"
rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian,bug} "$rootfs"/usr/share/python3

install -D -m 0755 "$BIN" "$rootfs/usr/bin/csi-fastblk"
mkdir -p "$rootfs"/{dev,proc,sys,run,tmp,etc,var/lib/csi-fastblk,csi}
chmod 1777 "$rootfs/tmp"
ln -sfn /proc/self/mounts "$rootfs/etc/mtab"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"

hack/image/verify-rootfs.sh "$rootfs"

layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$TAG"
umoci insert --rootless --image "$layout:$TAG" --history.created_by "hack/image/build.sh" "$rootfs" /
umoci config --image "$layout:$TAG" --os linux --architecture amd64 \
	--config.entrypoint /usr/bin/csi-fastblk --config.cmd serve \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label "org.opencontainers.image.title=$NAME" \
	--config.label "org.opencontainers.image.version=$TAG" \
	--config.label "org.opencontainers.image.source=https://github.com/fastblk/csi-fastblk" \
	--history.created_by "umoci config"
umoci gc --layout "$layout"
umoci stat --image "$layout:$TAG" >/dev/null

chmod -R a+rX "$layout"
mkdir -p "$(dirname "$OUT")"
tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "image $NAME:$TAG -> $OUT ($(du -h "$OUT" | cut -f1))"
