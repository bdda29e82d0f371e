#!/usr/bin/env bash
# initramfs.sh builds what the test VM boots from, in $VM_CACHE/initramfs:
#   initramfs-<6.12|7.3>.cpio  small and uncompressed (qemu loads a large initrd
#                              slowly under TCG): /init (hack/vm/guest/init),
#                              busybox-static with applet links in /bin (/sbin
#                              links to it), /etc, and the kernel's modules in
#                              /modules/<release> with /modules/modules.load
#   tools.img                  a read-only ext4 image, the guest's /usr and /opt
#                              (attached as /dev/vdb and bind-mounted by /init):
#     /usr/bin, /usr/sbin        real tools (fio, util-linux, e2fsprogs,
#                                xfsprogs; perf with VM_PERF=1) with their
#                                shared libraries; call
#                                them by absolute path: busybox sh runs its own
#                                applet before a same-named program on PATH
#     /usr/bin/csi-fastblk       bin/csi-fastblk-static (make static), if built
#     /opt/fastblk/<pkg>/<name>.test  Go test binaries of hack/vm/tests.list
#     /opt/fastblk/vm/           run-steps.sh, lib.sh, bench.sh and steps/
#     /opt/ref/                  with VM_REFERENCE=DIR, the files of DIR: a
#                                reference ublk server the benchmarks compare
#                                against (bench-scale.sh --reference), which
#                                the project neither builds nor ships
#
# Usage: hack/vm/initramfs.sh [--keep-going]
#   --keep-going  skip test packages that fail to compile instead of failing
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

OUT="$VM_CACHE/initramfs"
BASE="$OUT/base"
ROOT="$OUT/tools"
# Real tools copied with their libraries: name, then the package that has it.
TOOLS=(
	fio:fio
	mkfs.ext4:e2fsprogs mke2fs:e2fsprogs e2fsck:e2fsprogs fsck.ext4:e2fsprogs
	resize2fs:e2fsprogs tune2fs:e2fsprogs dumpe2fs:e2fsprogs
	mkfs.xfs:xfsprogs xfs_growfs:xfsprogs xfs_repair:xfsprogs xfs_io:xfsprogs xfs_db:xfsprogs
	blkid:util-linux losetup:mount mount:mount umount:mount findmnt:util-linux fsck:util-linux
	blockdev:util-linux lsblk:util-linux fallocate:util-linux wipefs:util-linux
)
# With VM_PERF=1, also perf (Debian's linux-perf, about 33 MiB with its
# libraries) for the benchmarks' profiles (bench-scale.sh --profile).
[[ ${VM_PERF:-0} != 1 ]] || TOOLS+=(perf:linux-perf)
KEEP_GOING=0

# busybox_static prints the path of a statically linked busybox.
busybox_static() {
	local b
	for b in /bin/busybox /usr/bin/busybox; do
		if [[ -x $b ]] && file -L "$b" | grep -q 'statically linked'; then
			echo "$b"
			return
		fi
	done
	need_pkgs /nonexistent:busybox-static
	echo /bin/busybox
}

# copy_elf SRC DST copies a dynamic binary to DST inside $ROOT with its libraries.
copy_elf() {
	local src=$1 dst=$2 lib
	install -D -m 0755 "$src" "$ROOT$dst"
	while read -r lib; do
		[[ -e "$ROOT$lib" ]] && continue
		mkdir -p "$ROOT$(dirname "$lib")"
		cp -L "$lib" "$ROOT$lib"
	done < <(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
}

# stage_base fills $BASE, the part of the initramfs common to both kernels.
stage_base() {
	local bb applet
	rm -rf "$BASE"
	mkdir -p "$BASE"/{bin,usr,etc,proc,sys,dev,run,tmp,data,root,opt,mnt/tools,modules}
	ln -s bin "$BASE/sbin"
	ln -s usr/lib "$BASE/lib"
	ln -s usr/lib64 "$BASE/lib64"
	bb=$(busybox_static)
	cp "$bb" "$BASE/bin/busybox"
	for applet in $("$bb" --list); do
		[[ $applet == busybox ]] || ln -s busybox "$BASE/bin/$applet"
	done
	install -m 0755 "$VM_DIR/guest/init" "$BASE/init"
	install -m 0755 "$VM_DIR/guest/modprobe" "$BASE/bin/fastblk-modprobe"
	cat >"$BASE/etc/passwd" <<-EOF
		root:x:0:0:root:/root:/bin/sh
		nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$BASE/etc/group"
	printf '127.0.0.1 localhost fastblk-vm\n::1 localhost\n' >"$BASE/etc/hosts"
	printf 'passwd: files\ngroup: files\nhosts: files\n' >"$BASE/etc/nsswitch.conf"
	: >"$BASE/etc/fstab"
	ln -s /proc/self/mounts "$BASE/etc/mtab"
	[[ ! -f /etc/mke2fs.conf ]] || cp /etc/mke2fs.conf "$BASE/etc/"
}

stage_tools() {
	local pair tool path pkgs=()
	rm -rf "$ROOT"
	mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib,usr/lib64,opt/fastblk/vm}
	ln -s usr/lib "$ROOT/lib"
	ln -s usr/lib64 "$ROOT/lib64"
	for pair in "${TOOLS[@]}"; do pkgs+=("${pair%%:*}:${pair#*:}"); done
	need_pkgs "${pkgs[@]}"
	for pair in "${TOOLS[@]}"; do
		tool=${pair%%:*}
		path=$(command -v "$tool") || die "$tool not found after installing ${pair#*:}"
		path=$(realpath -s "$path")
		case "$path" in
		/sbin/* | /usr/sbin/*) copy_elf "$path" "/usr/sbin/$tool" ;;
		*) copy_elf "$path" "/usr/bin/$tool" ;;
		esac
	done
	# No ld.so.cache: the loader searches its multiarch default paths.
}

# The test binaries build with the failpoints, test hooks and ablation
# switches the plugin's binary lacks (the Makefile's TEST_TAGS).
TEST_TAGS=failpoint,ablation

# stage_binaries builds the test binaries of tests.list and adds csi-fastblk.
stage_binaries() {
	local pkg rel name out failed=()
	command -v go >/dev/null || die "go not found (the Go toolchain of go.mod is needed to build the test binaries)"
	if [[ -x $REPO_ROOT/bin/csi-fastblk-static ]]; then
		install -m 0755 "$REPO_ROOT/bin/csi-fastblk-static" "$ROOT/usr/bin/csi-fastblk"
	else
		log "warning: bin/csi-fastblk-static missing (run make static); the image has no csi-fastblk"
	fi
	while read -r pkg; do
		pkg=${pkg%%#*}
		pkg=${pkg//[[:space:]]/}
		[[ -n $pkg ]] || continue
		rel=${pkg#./}
		name=$(basename "$rel")
		out="$ROOT/opt/fastblk/$rel"
		mkdir -p "$out"
		log "go test -c $pkg"
		if ! (cd "$REPO_ROOT" && CGO_ENABLED=0 go test -c -trimpath -tags "$TEST_TAGS" -ldflags='-s -w' -o "$out/$name.test" "$pkg"); then
			((KEEP_GOING)) || die "test package $pkg does not compile"
			failed+=("$pkg")
			continue
		fi
		[[ -f $out/$name.test ]] || log "warning: $pkg has no test files"
		[[ ! -d $REPO_ROOT/$rel/testdata ]] || cp -r "$REPO_ROOT/$rel/testdata" "$out/"
	done <"$VM_DIR/tests.list"
	# The race detector needs cgo: these packages' tests are also built
	# with -race, linked statically, for steps/43-ublk-race.sh (the server
	# threads' concurrency only shows against the real kernel).
	for pkg in ./pkg/blockdev/ublk; do
		rel=${pkg#./}
		name=$(basename "$rel")
		log "go test -race -c $pkg"
		# (glibc warns that static binaries may need its shared
		# libraries for name lookups, which the tests do not do.)
		if ! (cd "$REPO_ROOT" && CGO_ENABLED=1 go test -race -c -trimpath -tags "$TEST_TAGS" -ldflags='-linkmode=external -extldflags=-static' \
			-o "$ROOT/opt/fastblk/$rel/$name.race.test" "$pkg" >"$ROOT/race-build.log" 2>&1); then
			cat "$ROOT/race-build.log" >&2
			((KEEP_GOING)) || die "race build of $pkg failed"
			failed+=("$pkg (race)")
		fi
		rm -f "$ROOT/race-build.log"
	done
	((${#failed[@]} == 0)) || log "warning: skipped (did not compile): ${failed[*]}"
	cp "$VM_DIR/guest/run-steps.sh" "$VM_DIR/guest/lib.sh" "$VM_DIR/guest/bench.sh" "$VM_DIR/guest/bench-scale.sh" "$ROOT/opt/fastblk/vm/"
	cp -r "$VM_DIR/guest/steps" "$ROOT/opt/fastblk/vm/"
	chmod 0755 "$ROOT"/opt/fastblk/vm/*.sh "$ROOT"/opt/fastblk/vm/steps/*.sh
	(cd "$REPO_ROOT" && git describe --always --dirty 2>/dev/null || echo unknown) >"$ROOT/opt/fastblk/BUILD"
	rm -rf "$ROOT/opt/ref"
	if [[ -n ${VM_REFERENCE:-} ]]; then
		[[ -d $VM_REFERENCE ]] || die "VM_REFERENCE=$VM_REFERENCE: not a directory"
		mkdir -p "$ROOT/opt/ref"
		cp -a "$VM_REFERENCE/." "$ROOT/opt/ref/"
	fi
}

# pack DIR OUT writes DIR as a newc cpio archive owned by root.
pack() {
	(cd "$1" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
		cpio --null --quiet -o -H newc -R 0:0) >"$2.tmp"
	mv "$2.tmp" "$2"
}

# pack_kernel NAME writes initramfs-NAME.cpio: the base plus NAME's modules.
pack_kernel() {
	local name=$1 kdir release mod
	kdir=$(kernel_dir "$name")
	[[ -f $kdir/ready ]] || die "kernel $name not fetched: run hack/vm/kernels.sh"
	release=$(cat "$kdir/release")
	mod="$OUT/mod-$name"
	rm -rf "$mod"
	mkdir -p "$mod/modules"
	cp -r "$kdir/modules" "$mod/modules/$release"
	cp "$kdir/modules.load" "$kdir/modules.deps" "$mod/modules/"
	pack "$mod" "$OUT/mod-$name.cpio"
	cat "$OUT/base.cpio" "$OUT/mod-$name.cpio" >"$OUT/initramfs-$name.cpio.tmp"
	mv "$OUT/initramfs-$name.cpio.tmp" "$OUT/initramfs-$name.cpio"
	rm -rf "$mod" "$OUT/mod-$name.cpio"
	log "initramfs-$name.cpio: $(du -h "$OUT/initramfs-$name.cpio" | cut -f1) for $release"
}

# make_tools_image writes tools.img, an ext4 image of $ROOT (no mount needed).
make_tools_image() {
	local mib
	mib=$(($(du -sm "$ROOT" | cut -f1) * 5 / 4 + 32))
	rm -f "$OUT/tools.img.tmp"
	/usr/sbin/mke2fs -q -t ext4 -O ^has_journal -L fastblk-tools -E root_owner=0:0 \
		-d "$ROOT" "$OUT/tools.img.tmp" "${mib}M" >/dev/null || die "mke2fs -d $ROOT failed"
	mv "$OUT/tools.img.tmp" "$OUT/tools.img"
	log "tools.img: ${mib} MiB"
}

main() {
	case "${1:-}" in
	--keep-going) KEEP_GOING=1 ;;
	"") ;;
	*) die "usage: $0 [--keep-going]" ;;
	esac
	need_pkgs cpio:cpio file:file
	lock initramfs
	mkdir -p "$OUT"
	stage_base
	stage_tools
	stage_binaries
	pack "$BASE" "$OUT/base.cpio"
	make_tools_image
	local name
	for name in "${VM_KERNELS[@]}"; do pack_kernel "$name"; done
}

main "$@"
