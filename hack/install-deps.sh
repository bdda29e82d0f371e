#!/usr/bin/env bash
# Installs what building, running and testing csi-fastblk needs on a fresh
# Debian machine (root, Go installed). Safe to run repeatedly: it installs only
# what is missing.
set -euo pipefail

packages=(
	e2fsprogs xfsprogs util-linux mount   # mkfs, resize, blkid, losetup, mount
	fio                                   # benchmarks and verify tests
	gcc libc6-dev                         # cgo, for the race-detector build of the ublk tests (VM step 43)
	qemu-system-x86 busybox-static cpio xz-utils zstd file debian-archive-keyring  # the ublk VM harness
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go mod download
