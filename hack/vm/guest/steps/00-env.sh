#!/bin/sh
# timeout: 60
# 00-env: show the VM's kernel, CPUs, memory, and that ublk is available.
. /opt/fastblk/vm/lib.sh
set -e
echo "kernel: $(uname -r) ($(cat /proc/version))"
echo "build: $(cat "$FASTBLK_ROOT/BUILD" 2>/dev/null)"
echo "nproc: $(nproc)"
grep -E '^(MemTotal|MemFree):' /proc/meminfo
echo "modules loaded:"
cut -d' ' -f1-3 /proc/modules | sed 's/^/  /'
test -d /sys/module/ublk_drv || { echo "ublk_drv not loaded"; exit 1; }
echo "ublk_drv parameters:"
for p in /sys/module/ublk_drv/parameters/*; do
	[ -e "$p" ] && echo "  $(basename "$p")=$(cat "$p")"
done
ls -l /dev/ublk-control
test -c /dev/ublk-control
echo "io_uring_disabled: $(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo n/a)"
/usr/bin/findmnt -no SOURCE,FSTYPE,OPTIONS /data
df -h /data
test -x /usr/bin/csi-fastblk && /usr/bin/csi-fastblk --version 2>&1 | head -n1 || echo "csi-fastblk: not in image"
