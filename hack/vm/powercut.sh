#!/usr/bin/env bash
# powercut.sh runs the power-cut test (TestPowerCut in test/e2e) on one
# kernel in two boots of the VM on one data disk: the first boot serves a
# raw, an ext4 and an xfs ublk volume, writes and flushes data through them
# (fdatasync on the raw device, fsync of files and their directory on the
# filesystems; each acknowledged write recorded in a log fsynced on the
# data disk), goes on writing without flushing and resets the guest kernel
# in the middle (sysrq b: no sync, no unmount); the second boot mounts the
# same disk as it was left (ext4 replays its journal), starts the plugin on
# the same data directory, stages and publishes the volumes again as
# kubelet would after a reboot (their ext4 and xfs replay their logs), and
# verifies every acknowledged block and file by its CRC (the line
# "verified after the reset" counts them per volume).
#
# Usage: hack/vm/powercut.sh --kernel 6.12|7.3 [--log-dir DIR] [--no-flush]
#   --no-flush  check the test itself: the write boot records its writes as
#               acknowledged without flushing them, and the verify boot must
#               then find some lost (this run passes when it does; the
#               "verified after the reset" line says how many per volume)
#   Needs the images of kernels.sh and initramfs.sh (e2e.sh builds them and
#   runs this, without --no-flush, after the steps of each kernel).
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

kernel="" logdir=$REPO_ROOT/bin/vm noflush=""
while (($#)); do
	case "$1" in
	--kernel) kernel=${2:?}; shift 2 ;;
	--log-dir) logdir=${2:?}; shift 2 ;;
	--no-flush) noflush=1; shift ;;
	*) die "powercut.sh: unknown argument $1 (usage: --kernel 6.12|7.3 [--log-dir DIR])" ;;
	esac
done
kernel_dir "${kernel:?--kernel is required}" >/dev/null
mkdir -p "$logdir" "$VM_CACHE/disks"
disk=$(mktemp "$VM_CACHE/disks/powercut-$kernel.XXXXXX.raw")
trap 'rm -f "$disk"' EXIT
rm -f "$disk" # run.sh makes it, formatted, at the first boot

guest() {
	printf '. /opt/fastblk/vm/lib.sh && FASTBLK_POWERCUT=%s FASTBLK_POWERCUT_NOFLUSH=%s FASTBLK_POWERCUT_DIR=/data/powercut FASTBLK_BIN=/usr/bin/csi-fastblk gotest test/e2e -test.run %s' \
		"$1" "$noflush" "'^TestPowerCut\$'"
}

t0=$(date +%s)
log "power cut on $kernel: boot 1 writes, flushes and is reset"
"$VM_DIR/run.sh" --kernel "$kernel" --disk "$disk" --expect-reset --timeout 900 --quiet \
	--log "$logdir/powercut-$kernel-1.log" -- "$(guest write)" ||
	{ tail -n 30 "$logdir/powercut-$kernel-1.log" >&2; die "power cut on $kernel: the write boot failed"; }
grep -a -E 'acknowledged:' "$logdir/powercut-$kernel-1.log" | sed 's/^ */  /' >&2 || true
log "power cut on $kernel: boot 2 verifies on the same disk"
rc=0
"$VM_DIR/run.sh" --kernel "$kernel" --disk "$disk" --timeout 900 --quiet \
	--log "$logdir/powercut-$kernel-2.log" -- "$(guest verify)" || rc=$?
grep -a -E 'verified after the reset' "$logdir/powercut-$kernel-2.log" | sed 's/^ */  /' >&2 || true
if [[ -n $noflush ]]; then
	lost=$(grep -a -c -E 'after the reset, [0-9a-f]+ written|acknowledged file .*: open' "$logdir/powercut-$kernel-2.log" || true)
	((rc != 0 && lost > 0)) || die "power cut on $kernel --no-flush: the verify boot found no lost write (exit $rc): it cannot tell"
	log "power cut on $kernel --no-flush: the verify boot found $lost unflushed writes lost, as it must"
elif ((rc != 0)); then
	tail -n 40 "$logdir/powercut-$kernel-2.log" >&2
	die "power cut on $kernel: the verify boot failed"
fi
log "power cut on $kernel: PASS in $(($(date +%s) - t0))s"
