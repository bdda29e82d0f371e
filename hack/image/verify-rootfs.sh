#!/usr/bin/env bash
# Checks an unpacked image root filesystem: the tools the plugin runs exist,
# every ELF finds all of its shared libraries through the image's own
# dynamic loader, and the plugin and the tools run inside it (chroot).
# Usage: verify-rootfs.sh ROOTFS
set -euo pipefail
rootfs=$1
fail=0

tools=(/usr/bin/csi-fastblk /sbin/mkfs.ext4 /sbin/mkfs.xfs /sbin/resize2fs /usr/sbin/xfs_growfs
	/bin/mount /bin/umount /sbin/blkid /sbin/losetup /sbin/modprobe /sbin/e2fsck /sbin/fsck /sbin/xfs_repair)
for t in "${tools[@]}"; do
	[[ -e "$rootfs$t" || -L "$rootfs$t" ]] || { echo "missing $t" >&2; fail=1; }
done

ld=/lib64/ld-linux-x86-64.so.2
elves=0
while IFS= read -r f; do
	rel=${f#"$rootfs"}
	head -c4 "$f" | grep -q $'\x7fELF' || continue
	elves=$((elves + 1))
	out=$(chroot "$rootfs" "$ld" --list "$rel" 2>&1) || true
	if grep -q 'not found' <<<"$out"; then
		echo "$rel: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')" >&2
		fail=1
	fi
done < <(find "$rootfs"/{bin,sbin,usr/bin,usr/sbin} -type f -perm -u+x 2>/dev/null)

run() { chroot "$rootfs" "$@" >/dev/null 2>&1 || { echo "chroot: $* failed" >&2; fail=1; }; }
chroot "$rootfs" /usr/bin/csi-fastblk version >/dev/null 2>&1 ||
	chroot "$rootfs" /usr/bin/csi-fastblk --help >/dev/null 2>&1 ||
	{ echo "chroot: csi-fastblk does not run" >&2; fail=1; }
run /sbin/mkfs.ext4 -V
run /sbin/mkfs.xfs -V
run /usr/sbin/xfs_growfs -V
run /bin/mount --version
run /sbin/blkid --version
run /sbin/losetup --version
run /sbin/modprobe --version

# A real format in the image: mkfs of a sparse file with the image's tools.
# /proc is mounted as in a container (the tools read /proc/self/mounts).
img="$rootfs/tmp/verify.img"
mount -t proc proc "$rootfs/proc"
trap 'umount "$rootfs/proc" 2>/dev/null || true; rm -f "$img"' EXIT
truncate -s 64M "$img"
run /sbin/mkfs.ext4 -q -F /tmp/verify.img
run /sbin/e2fsck -fn /tmp/verify.img
truncate -s 128M "$img"
run /sbin/resize2fs /tmp/verify.img
truncate -s 320M "$img"
run /sbin/mkfs.xfs -q -f /tmp/verify.img
run /sbin/xfs_repair -n /tmp/verify.img
rm -f "$img"

((fail == 0)) || { echo "rootfs check failed" >&2; exit 1; }
echo "rootfs ok: ${#tools[@]} tools present, $elves ELF files resolve their libraries, tools run in chroot"
