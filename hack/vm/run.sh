#!/usr/bin/env bash
# run.sh boots a kernel fetched by kernels.sh with the initramfs from
# initramfs.sh in qemu (TCG), with a fresh sparse raw disk that the guest
# formats and mounts at /data (/dev/vda; /dev/vdb is the read-only tools disk
# from initramfs.sh), runs a command in the guest, streams the serial
# console to stdout and a log file, and exits with the command's exit status.
# It exits non-zero on timeout (124), kernel panic, oops or a missing end marker,
# showing the last lines of the log. An oops panics the guest (oops=panic), so
# the VM stops at once rather than leaving the command hung until the timeout.
# A guest kernel crash before init reports ready (an emulator flake, see
# main) is booted again, at most three boots in all.
#
# Usage: hack/vm/run.sh --kernel 6.12|7.3 [options] -- <guest command...>
#   The guest command is one shell command line ('a && b') or a command and
#   its arguments (run-steps.sh '10-*'); it runs in /data as root.
#   --disk-size SIZE   size of the /data disk (default 4G)
#   --disk FILE        use FILE as the /data disk and keep it: made (sparse,
#                      --disk-size) and formatted when missing, mounted as
#                      it is when it exists (a second boot on one disk)
#   --expect-reset     the guest command resets the guest on purpose: the VM
#                      ending after its "@@FASTBLK-VM-RESET <nonce>@@" line
#                      (init exports the nonce as FASTBLK_VM_NONCE) is
#                      success
#   --fs ext4|xfs      filesystem on /data (default ext4)
#   --timeout S        kill the VM after S seconds (default 1800)
#   --mem MiB --smp N  guest memory and CPUs (default 2048, 2)
#   --log FILE         console log (default $VM_CACHE/logs/<kernel>-<time>.log)
#   --quiet            do not stream the console, only the log file
# Environment: VM_DISK_DIR, where a fresh /data disk is made (default
#   $VM_CACHE/disks, on the host's disk; the benchmarks put it on /dev/shm
#   to take the host's disk out of the figures); VM_DISK_OPTS, more qemu
#   -drive options of the /data disk (the benchmarks' throttled disk:
#   throttling.iops-total=15000).
# Example: hack/vm/run.sh --kernel 7.3 -- /opt/fastblk/vm/run-steps.sh '00-*'
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"

KERNEL="" DISK_SIZE=4G FS=ext4 TIMEOUT=1800 MEM=2048 SMP=2 LOG="" QUIET=0 DISK="" EXPECT_RESET=0

usage() { sed -n '/^# Usage:/,/^# Example:/s/^# \{0,1\}//p' "$0" >&2; exit 2; }

parse_args() {
	while (($#)); do
		case "$1" in
		--kernel) KERNEL=${2:?}; shift 2 ;;
		--disk-size) DISK_SIZE=${2:?}; shift 2 ;;
		--disk) DISK=${2:?}; shift 2 ;;
		--expect-reset) EXPECT_RESET=1; shift ;;
		--fs) FS=${2:?}; shift 2 ;;
		--timeout) TIMEOUT=${2:?}; shift 2 ;;
		--mem) MEM=${2:?}; shift 2 ;;
		--smp) SMP=${2:?}; shift 2 ;;
		--log) LOG=${2:?}; shift 2 ;;
		--quiet) QUIET=1; shift ;;
		--) shift; break ;;
		-h | --help) usage ;;
		*) echo "run.sh: unknown argument $1" >&2; usage ;;
		esac
	done
	[[ -n $KERNEL ]] || { echo "run.sh: --kernel is required" >&2; usage; }
	(($#)) || { echo "run.sh: no guest command after --" >&2; usage; }
	[[ $FS == ext4 || $FS == xfs ]] || die "--fs must be ext4 or xfs, not $FS"
	[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds, not $TIMEOUT"
	# One argument is a shell command line; several are a command and its
	# arguments, quoted for the guest's shell.
	if (($# == 1)); then GUEST_CMD=$1; else GUEST_CMD=$(printf '%q ' "$@"); fi
}

main() {
	parse_args "$@"
	need_pkgs qemu-system-x86_64:qemu-system-x86
	local kdir initrd tools disk nonce cmdline rc start marker
	kdir=$(kernel_dir "$KERNEL")
	initrd="$VM_CACHE/initramfs/initramfs-$KERNEL.cpio"
	tools="$VM_CACHE/initramfs/tools.img"
	[[ -s $kdir/vmlinuz ]] || die "kernel $KERNEL missing: run hack/vm/kernels.sh"
	[[ -s $initrd && -s $tools ]] || die "$initrd or $tools missing: run hack/vm/initramfs.sh"
	local diskdir=${VM_DISK_DIR:-$VM_CACHE/disks}
	mkdir -p "$diskdir" "$VM_CACHE/logs"
	LOG=${LOG:-$VM_CACHE/logs/$KERNEL-$(date +%Y%m%d-%H%M%S)-$$.log}
	local keepfs=0
	if [[ -n $DISK ]]; then
		disk=$DISK
		[[ -s $disk ]] && keepfs=1
	else
		disk=$(mktemp "$diskdir/data-$KERNEL.XXXXXX.raw")
		trap 'rm -f "$disk"' EXIT
	fi
	nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
	# tsc=reliable: under TCG a loaded host delays the clocksource
	# watchdog's reads, it then marks the TSC unstable mid-run, and the
	# kernel code patching that follows can crash an emulated guest
	# ("Oops: int3" in sched_clock_cpu, seen once on 7.3). QEMU derives the
	# guest TSC from the host clock, so it is consistent across vCPUs.
	cmdline="console=ttyS0 loglevel=5 panic=1 oops=panic tsc=reliable fastblk.nonce=$nonce fastblk.fs=$FS fastblk.keepfs=$keepfs"
	cmdline+=" fastblk.cmd=$(printf '%s' "$GUEST_CMD" | base64 -w0)"
	((${#cmdline} < 2000)) || die "guest command too long for the kernel command line"
	local attempt
	for attempt in 1 2 3; do
		log "booting $(cat "$kdir/release") ($KERNEL), disk $DISK_SIZE $FS, timeout ${TIMEOUT}s, log $LOG"
		# A kept disk is never wiped: a boot that crashed before init ran
		# left it as it was.
		((keepfs)) || { truncate -s 0 "$disk" && truncate -s "$DISK_SIZE" "$disk"; }
		start=$(date +%s)
		set +e
		timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
			-accel tcg,thread=multi -cpu max -smp "$SMP" -m "$MEM" \
			-kernel "$kdir/vmlinuz" -initrd "$initrd" -append "$cmdline" \
			-drive "if=virtio,format=raw,cache=none,aio=io_uring,file=$disk${VM_DISK_OPTS:+,$VM_DISK_OPTS}" \
			-drive "if=virtio,format=raw,readonly=on,file=$tools" \
			-nodefaults -nographic -serial stdio -net none -no-reboot </dev/null 2>&1 |
			sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' |
			tee "$LOG" | { if ((QUIET)); then cat >/dev/null; else cat; fi; }
		rc=${PIPESTATUS[0]}
		set -e
		log "VM ran $(($(date +%s) - start))s (qemu exit $rc)"
		crashed_booting || break
		# Under TCG, the kernel's own code patching at boot (static keys
		# flipped by late initcalls) now and then meets a stale
		# translation on the other vCPU: "Oops: int3" before init has
		# run anything of ours. Such a boot says nothing about the
		# project, so boot again; a crash after "vm: ready" still fails.
		((attempt < 3)) || break
		cp "$LOG" "$LOG.boot-crash-$attempt"
		log "the guest kernel crashed while booting, before the command ran (kept in $LOG.boot-crash-$attempt); booting again"
	done
	check_log "$rc" "$nonce"
}

# crashed_booting: the log shows a kernel panic or oops and the guest never
# reached init's "vm: ready" line, so none of the command ran.
crashed_booting() {
	grep -a -q -E '^\[ *[0-9]+\.[0-9]+\] (Kernel panic|BUG: |Oops: |general protection fault)' "$LOG" &&
		! grep -a -q '^vm: ready after' "$LOG"
}

# check_log QEMU_RC NONCE exits with the guest command's status from the log.
check_log() {
	local qrc=$1 nonce=$2 marker status
	marker=$(grep -a -o "@@FASTBLK-VM-END $nonce rc=[0-9]*@@" "$LOG" | tail -n1 || true)
	local kmsg='^\[ *[0-9]+\.[0-9]+\] '
	if grep -a -q -E "$kmsg"'(WARNING:|------------\[ cut here)' "$LOG"; then
		log "note: the guest kernel logged a WARNING (see $LOG)"
	fi
	if grep -a -q -E "$kmsg"'(Kernel panic|BUG: |Oops: |general protection fault)' "$LOG"; then
		tail_log "kernel panic or oops in the guest"
		exit 1
	fi
	if [[ -z $marker ]] && ((EXPECT_RESET)) && grep -a -q "@@FASTBLK-VM-RESET $nonce@@" "$LOG" && ((qrc == 0)); then
		log "the guest reset itself, as the command asked"
		exit 0
	fi
	if [[ -z $marker ]]; then
		((qrc == 124 || qrc == 137)) && { tail_log "timed out after ${TIMEOUT}s"; exit 124; }
		tail_log "VM exited (qemu status $qrc) without the end marker"
		exit 1
	fi
	status=${marker##*rc=}
	status=${status%@@}
	log "guest command exited $status"
	exit "$status"
}

tail_log() {
	log "FAIL: $1; last lines of $LOG:"
	tail -n 40 "$LOG" | sed 's/^/    /' >&2
}

main "$@"
