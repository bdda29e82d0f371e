#!/usr/bin/env bash
# Builds the csi-fastblk container image for amd64 and arm64 as one OCI
# image index in an OCI image layout tar (bin/csi-fastblk-image.oci.tar),
# with no container engine and no image pulls:
#   1. the image reference comes from the chart (ocitool chartref: the
#      plugin.image the chart runs by default), so the two cannot drift;
#   2. per architecture, with a private apt configuration (the host's
#      Debian sources, the architecture's package lists, state under the
#      cache): resolve hack/image/packages.txt to its Depends closure, take
#      each package at the version pinned in hack/image/packages.lock,
#      download and unpack the .debs (dpkg-deb -x) into a root filesystem;
#   3. cross-compile the static plugin (CGO_ENABLED=0 GOARCH=...) into it;
#   4. check it: every ELF is for the architecture and finds its loader and
#      libraries (ocitool elfcheck); on the host's own architecture the
#      tools also run in it (verify-rootfs.sh, chroot);
#   5. umoci writes one image per architecture, and ocitool index joins
#      them into an index named by the reference.
# Import into containerd or push: see docs/image.md.
#
# Environment: ARCHES (default "amd64 arm64"), OUT, VERSION (the binary's
# version, default git describe), IMAGE_REF (default: the chart's),
# UPDATE_LOCK=1 re-pins packages.lock to the archive's current versions
# (needed when Debian replaced a pinned version), KEEP_ROOTFS=1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

OUT="${OUT:-bin/csi-fastblk-image.oci.tar}"
ARCHES="${ARCHES:-amd64 arm64}"
LOCK=hack/image/packages.lock
VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
REF="${IMAGE_REF:-$(go run ./hack/image/ocitool chartref charts/csi-fastblk)}"
TAG=${REF##*:}
NAME=csi-fastblk
CACHE="${CSI_FASTBLK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-fastblk}"

need() { # need CMD PACKAGE: install PACKAGE from Debian when CMD is missing
	command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }
}
need umoci umoci
need dpkg-deb dpkg
need apt-get apt

work=$(mktemp -d)
[[ -n ${KEEP_ROOTFS:-} ]] || trap 'rm -rf "$work"' EXIT

# apt_config ARCH sets APT_OPTS to a private apt configuration for ARCH:
# the host's sources, lists and state of its own under the cache.
apt_config() {
	local arch=$1 dir="$CACHE/image-apt-$1"
	mkdir -p "$dir"/{etc/sources.list.d,etc/preferences.d,state/lists/partial,cache/archives/partial}
	[[ -e $dir/state/status ]] || : >"$dir/state/status"
	cp /etc/apt/sources.list "$dir/etc/" 2>/dev/null || : >"$dir/etc/sources.list"
	cp /etc/apt/sources.list.d/*.{list,sources} "$dir/etc/sources.list.d/" 2>/dev/null || true
	APT_OPTS=(
		-o "Dir::Etc::SourceList=$dir/etc/sources.list" -o "Dir::Etc::SourceParts=$dir/etc/sources.list.d"
		-o "Dir::Etc::Preferences=$dir/etc/preferences" -o "Dir::Etc::PreferencesParts=$dir/etc/preferences.d"
		-o "Dir::State=$dir/state" -o "Dir::State::status=$dir/state/status" -o "Dir::Cache=$dir/cache"
		-o "APT::Architecture=$arch" -o "APT::Architectures::=$arch" -o "Acquire::Languages=none" -o "APT::Sandbox::User=root"
		-o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false" -o "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false"
	)
	# Lists older than a day (or none) are fetched again.
	if [[ -z $(find "$dir/state/lists" -name '*_Packages*' -mtime -1 2>/dev/null | head -n1) ]]; then
		apt-get "${APT_OPTS[@]}" -qq update
	fi
}

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
		mapfile -t next < <(apt-cache "${APT_OPTS[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks \
			--no-replaces --no-enhances "${level[@]}" | awk '
			/^[^ ]/ { skip = 0; next }
			/^ *\|?(Pre)?Depends: / {
				alt = ($0 ~ /^ *\|/)
				if (!skip) { name = $2; if (name !~ /^</) { sub(/:any$/, "", name); sub(/:[a-z0-9]+$/, "", name); print name } }
				skip = alt
			}' | sort -u)
	done
	printf '%s\n' "${!seen[@]}" | sort
}

# pins ARCH prints "package version" for ARCH: from the lock, or with
# UPDATE_LOCK=1 (or ARCH not in the lock yet) the archive's candidates, which replace
# ARCH's lines in the lock. A closure that no longer matches the lock fails.
pins() {
	local arch=$1 closure
	closure=$(resolve)
	if [[ -n ${UPDATE_LOCK:-} ]] || ! grep -q "^$arch " "$LOCK" 2>/dev/null; then
		local fresh
		fresh=$(xargs apt-cache "${APT_OPTS[@]}" policy <<<"$closure" |
			awk -v a="$arch" '/^[^ ]/ {sub(/:.*$/, ""); p = $1} /Candidate:/ {print a, p, $2}')
		{ grep -v "^$arch " "$LOCK" 2>/dev/null || true; echo "$fresh"; } | sort >"$work/lock" && cp "$work/lock" "$LOCK"
		echo "pinned $(wc -l <<<"$fresh") $arch packages in $LOCK" >&2
	fi
	local locked
	locked=$(awk -v a="$arch" '$1 == a {print $2}' "$LOCK")
	if [[ $locked != "$closure" ]]; then
		echo "$LOCK does not list the $arch package closure of packages.txt; run UPDATE_LOCK=1 make image:" >&2
		diff <(echo "$locked") <(echo "$closure") >&2 || true
		exit 1
	fi
	awk -v a="$arch" '$1 == a {print $2, $3}' "$LOCK"
}

# rootfs ARCH DIR unpacks ARCH's pinned packages and the plugin into DIR.
rootfs() {
	local arch=$1 rootfs=$2 debs="$CACHE/debs" p ver f
	mkdir -p "$rootfs" "$debs" "$work/debs-$arch"
	pins "$arch" >"$work/pins-$arch"
	echo "image $arch packages ($(wc -l <"$work/pins-$arch")): $(cut -d' ' -f1 "$work/pins-$arch" | tr '\n' ' ')"
	while read -r p ver; do
		f=$(ls "$debs/${p}_${ver/:/%3a}_"{"$arch",all}.deb 2>/dev/null | head -n1 || true)
		if [[ -z $f ]]; then
			(cd "$debs" && apt-get "${APT_OPTS[@]}" download -qq "$p=$ver") ||
				{ echo "$p $ver ($arch) is not in the archive any more: run UPDATE_LOCK=1 make image" >&2; exit 1; }
			f=$(ls "$debs/${p}_${ver/:/%3a}_"{"$arch",all}.deb 2>/dev/null | head -n1 || true)
			[[ -n $f ]] || { echo "apt-get download $p=$ver ($arch) left no .deb in $debs" >&2; exit 1; }
		fi
		dpkg-deb -x "$f" "$rootfs"
		dpkg-deb -f "$f" Package Version | paste -sd' ' >>"$work/installed-$arch"
	done <"$work/pins-$arch"
	# Record what is inside, like dpkg would (read by `status` and scanners).
	mkdir -p "$rootfs/usr/share/csi-fastblk"
	sort "$work/installed-$arch" >"$rootfs/usr/share/csi-fastblk/packages.txt"
	rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian,bug} "$rootfs"/usr/share/python3
	CGO_ENABLED=0 GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$VERSION" \
		-o "$rootfs/usr/bin/csi-fastblk" ./cmd/csi-fastblk
	mkdir -p "$rootfs"/{dev,proc,sys,run,tmp,etc,var/lib/csi-fastblk,csi}
	chmod 1777 "$rootfs/tmp"
	ln -sfn /proc/self/mounts "$rootfs/etc/mtab"
	printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
}

layout="$work/oci"
umoci init --layout "$layout"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tags=()
for arch in $ARCHES; do
	apt_config "$arch"
	fs="$work/rootfs-$arch"
	rootfs "$arch" "$fs"
	go run ./hack/image/ocitool elfcheck "$fs" "$arch"
	if [[ $arch == "$(go env GOHOSTARCH)" ]]; then
		hack/image/verify-rootfs.sh "$fs"
	fi
	umoci new --image "$layout:$TAG-$arch"
	umoci insert --rootless --image "$layout:$TAG-$arch" --history.created_by "hack/image/build.sh" "$fs" /
	umoci config --image "$layout:$TAG-$arch" --os linux --architecture "$arch" \
		--config.entrypoint /usr/bin/csi-fastblk --config.cmd serve \
		--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--config.label "org.opencontainers.image.title=$NAME" \
		--config.label "org.opencontainers.image.version=$TAG" \
		--config.label "org.opencontainers.image.revision=$revision" \
		--config.label "org.opencontainers.image.source=https://github.com/fastblk/csi-fastblk" \
		--history.created_by "umoci config"
	tags+=("$TAG-$arch")
done
go run ./hack/image/ocitool index "$layout" "$REF" "${tags[@]}"
umoci gc --layout "$layout"

chmod -R a+rX "$layout"
mkdir -p "$(dirname "$OUT")"
tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "image $REF ($ARCHES) -> $OUT ($(du -h "$OUT" | cut -f1))"
echo "import: ctr -n k8s.io images import --all-platforms $OUT   push: skopeo copy --all oci-archive:$OUT docker://<registry>/csi-fastblk:$TAG"
