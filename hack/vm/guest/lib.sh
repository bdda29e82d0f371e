# shellcheck shell=sh
# Helpers for the guest step scripts (busybox sh). Source it:
#   . /opt/fastblk/vm/lib.sh
# Real tools live in /usr/bin and /usr/sbin; busybox sh runs its own applet
# before a same-named program on PATH, so call them by absolute path.
FASTBLK_ROOT=${FASTBLK_ROOT:-/opt/fastblk}
FASTBLK_DATA=${FASTBLK_DATA:-/data}

# FASTBLK_REQUIRE lists what the tests must find on this kernel
# (internal/testgate): a test that would skip, or leave out part of its
# coverage, for lack of one of these fails instead. Every kernel the VM
# boots has root, ublk, loop devices, the tools of the image (e2fsprogs,
# xfsprogs), two CPUs, provided-buffer rings and USER_COPY; 7.3 has every ublk feature
# the plugin uses (AUTO_BUF_REG zero copy, BATCH_IO, UPDATE_SIZE, QUIESCE;
# TestRequiredFeatures asserts them). A kernel not listed requires the
# common set only. The test binaries are built with the failpoints, test
# hooks and ablation switches (hack/vm/initramfs.sh, TEST_TAGS).
_require=root,ublk,loop,tools,smp,bufring,usercopy,failpoint,ablation
case "$(uname -r)" in
7.3.*) FASTBLK_REQUIRE=${FASTBLK_REQUIRE:-$_require,zerocopy,batch,updatesize,quiesce} ;;
*) FASTBLK_REQUIRE=${FASTBLK_REQUIRE:-$_require} ;;
esac
export FASTBLK_REQUIRE

# gotest PKG [ARGS...] runs the test binary of package PKG (as listed in
# hack/vm/tests.list, e.g. pkg/blockdev/uring) verbosely, once, in its package
# directory, with ARGS appended (e.g. -test.run 'TestX').
gotest() {
	_pkg=${1#./}
	shift
	_bin="$FASTBLK_ROOT/$_pkg/$(basename "$_pkg").test"
	if [ ! -x "$_bin" ]; then
		echo "gotest: $_bin missing: is $_pkg in hack/vm/tests.list and does it compile?"
		return 1
	fi
	(cd "$FASTBLK_ROOT/$_pkg" && "$_bin" -test.v -test.count=1 -test.timeout=20m "$@")
}

# require_block DEV fails unless DEV is a live block device (exists, is a
# block device, and a 4 KiB direct read succeeds).
require_block() {
	if [ ! -b "$1" ]; then
		echo "require_block: $1 is not a block device"
		return 1
	fi
	dd if="$1" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null || {
		echo "require_block: $1 does not answer a read"
		return 1
	}
}

# ublk_devices lists the ublk character and block devices present.
ublk_devices() {
	ls /dev/ublkc* /dev/ublkb* 2>/dev/null
}
