#!/usr/bin/env bash
# kernels.sh fetches the Debian kernels the ublk VM tests boot: 6.12 from trixie
# and 7.3 from trixie-backports. It uses a private apt configuration under
# $VM_CACHE/apt (own sources list, state and cache), so the machine's apt setup
# is untouched, and leaves per kernel in $VM_CACHE/kernels/<6.12|7.3>/:
#   vmlinuz        the kernel image
#   release        its uname -r
#   packages       the Debian packages and versions it came from
#   modules/       the modules the guest needs (ublk_drv and what the disk, the
#                  filesystems and the tests need), decompressed for busybox insmod
#   modules.load   the modules /init loads at boot, in load order
#   modules.deps   every module in modules/: "name path dep,dep" (guest/modprobe
#                  loads the others, e.g. xfs, on demand: xfs alone takes
#                  seconds to load under TCG)
# A second run reuses the cache and costs nothing; --refresh looks for newer
# kernels in the archive.
#
# Usage: hack/vm/kernels.sh [--refresh]
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

# Modules loaded in the guest at boot, then on demand. The optional ones exist
# in only one of the kernels.
MODULES=(virtio_blk ublk_drv loop ext4)
LAZY_MODULES=(xfs null_blk)
OPTIONAL_MODULES=(crc32c_generic crc32c_intel crc32c_cryptoapi)
STAMP="modules=${MODULES[*]} lazy=${LAZY_MODULES[*]} ${OPTIONAL_MODULES[*]} v3"

APT_DIR="$VM_CACHE/apt"
DEB_DIR="$VM_CACHE/debs"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
APT_OPTS=()

# mirror_uri prints the Debian mirror the machine's own apt sources use.
mirror_uri() {
	local f uri=""
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -r $f ]] || continue
		uri=$(awk 'tolower($1)=="uris:" {for (i=2;i<=NF;i++) if ($i !~ /security/) {print $i; exit}}' "$f")
		[[ -n $uri ]] && break
	done
	if [[ -z $uri ]]; then
		uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
			sed -E 's/\[[^]]*\]//' | awk '$1=="deb" && $2 ~ /debian/ && $2 !~ /security/ {print $2; exit}')
	fi
	printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# apt_setup writes the private apt configuration for trixie and trixie-backports.
apt_setup() {
	local uri
	uri=$(mirror_uri)
	[[ -r $KEYRING ]] || need_pkgs /nonexistent:debian-archive-keyring
	# The keyring must know trixie's archive keys (debian-archive-keyring from
	# bookworm 12.x carries them as debian-archive-trixie-*.gpg).
	if [[ ! -e /usr/share/keyrings/debian-archive-trixie-stable.gpg ]]; then
		die "$KEYRING lacks Debian trixie's keys: upgrade debian-archive-keyring (bookworm's 2023.3+deb12u1 or later has them)"
	fi
	mkdir -p "$APT_DIR"/{etc/sources.list.d,etc/preferences.d,state/lists/partial,cache/archives/partial} "$DEB_DIR"
	: >"$APT_DIR/state/status"
	cat >"$APT_DIR/etc/sources.list" <<-EOF
		deb [signed-by=$KEYRING] $uri trixie main
		deb [signed-by=$KEYRING] $uri trixie-backports main
	EOF
	APT_OPTS=(
		-o "Dir::Etc::SourceList=$APT_DIR/etc/sources.list"
		-o "Dir::Etc::SourceParts=$APT_DIR/etc/sources.list.d"
		-o "Dir::Etc::Preferences=$APT_DIR/etc/preferences"
		-o "Dir::Etc::PreferencesParts=$APT_DIR/etc/preferences.d"
		-o "Dir::State=$APT_DIR/state"
		-o "Dir::State::status=$APT_DIR/state/status"
		-o "Dir::Cache=$APT_DIR/cache"
		-o "APT::Architectures::=amd64"
		-o "Acquire::Languages=none"
		-o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
		-o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
		-o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
		-o "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false"
		-o "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false"
	)
	log "private apt config: $uri trixie trixie-backports (state in $APT_DIR)"
	apt-get "${APT_OPTS[@]}" -qq update || die "apt-get update (private trixie config) failed"
}

# newest_pkg REGEX prints the newest package name matching REGEX.
newest_pkg() {
	apt-cache "${APT_OPTS[@]}" pkgnames | grep -E "$1" | sort -V | tail -n1
}

# download PKG prints the path of PKG's .deb, downloading it once.
download() {
	local pkg=$1 ver deb
	ver=$(apt-cache "${APT_OPTS[@]}" show --no-all-versions "$pkg" | awk '/^Version:/ {print $2; exit}')
	[[ -n $ver ]] || die "package $pkg not found in trixie/trixie-backports"
	deb=$(ls "$DEB_DIR/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -n1 || true)
	if [[ -z $deb ]]; then
		log "downloading $pkg $ver"
		(cd "$DEB_DIR" && apt-get "${APT_OPTS[@]}" -qq -o APT::Sandbox::User=root download "$pkg=$ver") >&2 ||
			die "apt-get download $pkg=$ver failed"
		deb=$(ls "$DEB_DIR/${pkg}_${ver//:/%3a}_"*.deb | head -n1)
	fi
	printf '%s\n' "$deb"
}

# modinfo_field KO FIELD prints a .modinfo field of a (possibly compressed) module.
modinfo_field() {
	decompress "$1" | tr '\0' '\n' | grep -a -m1 "^$2=" | cut -d= -f2- || true
}

decompress() {
	case "$1" in
	*.xz) xz -dc "$1" ;;
	*.zst) zstd -qdc "$1" ;;
	*.gz) gzip -dc "$1" ;;
	*) cat "$1" ;;
	esac
}

# install_modules ROOT RELEASE OUT copies the module closure into OUT.
install_modules() {
	local root=$1 release=$2 out=$3 mdir f name
	mdir="$root/usr/lib/modules/$release"
	[[ -d $mdir ]] || mdir="$root/lib/modules/$release"
	declare -gA MOD_PATH=() MOD_DONE=() MOD_DEPS=()
	MOD_ORDER=()
	while IFS= read -r f; do
		name=$(basename "$f")
		name=${name%%.ko*}
		MOD_PATH[${name//-/_}]=${f#"$mdir/"}
	done < <(find "$mdir/kernel" -name '*.ko*')
	# The crc32c providers go first: jbd2, ext4 and xfs ask for crc32c.
	for name in "${OPTIONAL_MODULES[@]}"; do
		[[ -z ${MOD_PATH[$name]:-} ]] || visit "$mdir" "$name"
	done
	for name in "${MODULES[@]}"; do
		[[ -n ${MOD_PATH[$name]:-} ]] || die "module $name missing from kernel $release"
		visit "$mdir" "$name"
	done
	local eager=("${MOD_ORDER[@]}")
	for name in "${LAZY_MODULES[@]}"; do
		[[ -n ${MOD_PATH[$name]:-} ]] || die "module $name missing from kernel $release"
		visit "$mdir" "$name"
	done
	rm -rf "$out/modules"
	mkdir -p "$out/modules"
	: >"$out/modules.deps"
	for name in "${MOD_ORDER[@]}"; do
		f=${MOD_PATH[$name]}
		mkdir -p "$out/modules/$(dirname "$f")"
		decompress "$mdir/$f" >"$out/modules/${f%.ko*}.ko"
		printf '%s %s %s\n' "$name" "${f%.ko*}.ko" "${MOD_DEPS[$name]:--}" >>"$out/modules.deps"
	done
	: >"$out/modules.load"
	for name in "${eager[@]}"; do
		f=${MOD_PATH[$name]}
		printf '%s\n' "${f%.ko*}.ko" >>"$out/modules.load"
	done
}

# visit MDIR NAME appends NAME's dependencies, then NAME, to MOD_ORDER.
visit() {
	local mdir=$1 name=$2 dep deps
	[[ -n ${MOD_DONE[$name]:-} ]] && return 0
	MOD_DONE[$name]=1
	deps=$(modinfo_field "$mdir/${MOD_PATH[$name]}" depends)
	MOD_DEPS[$name]=${deps//-/_}
	for dep in ${deps//,/ }; do
		dep=${dep//-/_}
		[[ -n ${MOD_PATH[$dep]:-} ]] || die "module $name needs $dep, not found"
		visit "$mdir" "$dep"
	done
	MOD_ORDER+=("$name")
}

# fetch_kernel NAME downloads and unpacks kernel NAME (6.12 or 7.3).
fetch_kernel() {
	local name=$1 kdir tmp pkgs=() release p
	kdir=$(kernel_dir "$name")
	case "$name" in
	6.12)
		p=$(newest_pkg '^linux-image-6\.12\.[0-9]+\+deb13-amd64-unsigned$')
		[[ -n $p ]] || die "no linux-image-6.12.*-amd64-unsigned in trixie"
		pkgs=("$p")
		release=${p#linux-image-}
		release=${release%-unsigned}
		;;
	7.3)
		p=$(newest_pkg '^linux-binary-7\.3\.[0-9]+\+deb13-amd64$')
		[[ -n $p ]] || die "no linux-binary-7.3.*-amd64 in trixie-backports"
		release=${p#linux-binary-}
		pkgs=("$p" "linux-modules-$release")
		;;
	esac
	rm -rf "$VM_CACHE"/extract.*
	tmp=$(mktemp -d "$VM_CACHE/extract.XXXXXX")
	: >"$tmp/packages"
	for p in "${pkgs[@]}"; do
		local deb
		deb=$(download "$p")
		dpkg-deb -x "$deb" "$tmp/root"
		printf '%s %s\n' "$p" "$(dpkg-deb -f "$deb" Version)" >>"$tmp/packages"
	done
	mkdir -p "$kdir"
	rm -f "$kdir/ready"
	if [[ -f $tmp/root/boot/vmlinuz-$release ]]; then
		cp "$tmp/root/boot/vmlinuz-$release" "$kdir/vmlinuz"
	elif [[ -f $tmp/root/usr/lib/modules/$release/vmlinuz ]]; then
		cp "$tmp/root/usr/lib/modules/$release/vmlinuz" "$kdir/vmlinuz"
	else
		die "no vmlinuz for $release in ${pkgs[*]}"
	fi
	install_modules "$tmp/root" "$release" "$kdir"
	printf '%s\n' "$release" >"$kdir/release"
	cp "$tmp/packages" "$kdir/packages"
	printf '%s\n' "$STAMP" >"$kdir/ready"
	rm -rf "$tmp"
}

kernel_ready() {
	local kdir
	kdir=$(kernel_dir "$1")
	[[ -f $kdir/ready && "$(cat "$kdir/ready")" == "$STAMP" && -s $kdir/vmlinuz ]]
}

main() {
	local refresh=0 name kdir
	case "${1:-}" in
	--refresh) refresh=1 ;;
	"") ;;
	*) die "usage: $0 [--refresh]" ;;
	esac
	need_pkgs apt-get:apt dpkg-deb:dpkg xz:xz-utils zstd:zstd
	lock kernels
	local todo=()
	for name in "${VM_KERNELS[@]}"; do
		if ((refresh)) || ! kernel_ready "$name"; then todo+=("$name"); fi
	done
	if ((${#todo[@]})); then
		apt_setup
		for name in "${todo[@]}"; do fetch_kernel "$name"; done
	fi
	for name in "${VM_KERNELS[@]}"; do
		kdir=$(kernel_dir "$name")
		printf 'kernel %-5s %s (%s) modules: %s at boot, %s in all\n' "$name" "$(cat "$kdir/release")" \
			"$(tr '\n' ' ' <"$kdir/packages" | sed 's/ $//')" "$(wc -l <"$kdir/modules.load")" \
			"$(wc -l <"$kdir/modules.deps")"
	done
}

main "$@"
