#!/usr/bin/env bash
# last-mount-holder.sh shows, on a VM kernel, the ublk server self-deadlock
# that the plugin's staging guard (mountinfo.MountDiesWithProcess) keeps it
# out of: a `csi-fastblk ublk serve` process in a mount namespace of its own,
# the only holder of an ext4 mount of the device it serves with dirty data,
# is killed with SIGKILL; its exit tears the namespace down, and the final
# unmount's writeback waits for the server that is exiting: it stays in D
# state (cleanup_mnt, sync_filesystem), for good. The same with the mount in
# the shared namespace exits at once. The guest resets itself at the end
# (the stuck device would hang its poweroff). Not part of make test: it
# leaves the guest unusable and proves a kernel behaviour, not ours.
#
# Usage: hack/vm/last-mount-holder.sh --kernel 6.12|7.3
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
source "$(dirname "$0")/lib.sh"
[[ ${1:-} == --kernel && -n ${2:-} ]] || die "usage: $0 --kernel 6.12|7.3"
kernel=$2
mkdir -p "$REPO_ROOT/bin/vm"
log=$REPO_ROOT/bin/vm/last-mount-holder-$kernel.log
# shellcheck disable=SC2016 # expanded by the guest's shell
guest='f=/data/dl.img; truncate -s 256M $f; /usr/sbin/mkfs.ext4 -q -F -b 4096 $f; n=0
for mode in own-ns shared-ns; do
 if [ $mode = own-ns ]; then unshare -m --propagation private /usr/bin/csi-fastblk ublk serve --file $f >/data/srv$n.log 2>&1 &
 else /usr/bin/csi-fastblk ublk serve --file $f >/data/srv$n.log 2>&1 & fi
 pid=$!; d=/dev/ublkb$n; i=0; while [ ! -b $d ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; sleep 1
 c="mkdir -p /mnt/dl$n && /usr/bin/mount -t ext4 $d /mnt/dl$n && dd if=/dev/urandom of=/mnt/dl$n/x bs=1M count=16 2>/dev/null"
 if [ $mode = own-ns ]; then nsenter -t $pid -m sh -c "$c"; else sh -c "$c"; fi
 echo "LMH $mode: server $pid has $d mounted with dirty data; kill -9"; kill -9 $pid; i=0
 while [ -d /proc/$pid ] && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
 if [ -d /proc/$pid ]; then for t in /proc/$pid/task/*; do echo "LMH $mode: task ${t##*/} $(grep State $t/status) after 30s"; head -8 $t/stack; done
 else echo "LMH $mode: server exited within ${i}s"; fi
 n=$((n+1))
done
echo 1 >/proc/sys/kernel/sysrq; echo "@@FASTBLK-VM-RESET $FASTBLK_VM_NONCE@@"; sleep 1; echo b >/proc/sysrq-trigger'
"$VM_DIR/run.sh" --kernel "$kernel" --quiet --expect-reset --timeout 400 --log "$log" -- "$guest"
grep -a -E '^(LMH |\[<)' "$log"
