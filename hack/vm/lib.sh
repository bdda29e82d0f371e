# shellcheck shell=bash
# Shared helpers for the VM harness scripts in hack/vm. Source it; do not run it.

VM_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034 # used by the scripts that source this file
REPO_ROOT="$(cd "$VM_DIR/../.." && pwd)"
# Everything downloaded or built for the VMs lives here, outside the repo, so a
# second run reuses it. Override with CSI_FASTBLK_VM_CACHE.
VM_CACHE="${CSI_FASTBLK_VM_CACHE:-/var/cache/csi-fastblk-vm}"
# The kernels we test: short name -> directory under $VM_CACHE/kernels.
VM_KERNELS=(6.12 7.3)

log() { printf '[vm] %s\n' "$*" >&2; }
die() { printf '[vm] error: %s\n' "$*" >&2; exit 1; }

# need_pkgs CMD:PKG... installs PKG with apt-get when CMD is missing.
need_pkgs() {
	local missing=() pair cmd pkg
	for pair in "$@"; do
		cmd="${pair%%:*}" pkg="${pair#*:}"
		if ! command -v "$cmd" >/dev/null 2>&1 && [[ ! -x "$cmd" ]]; then
			missing+=("$pkg")
		fi
	done
	((${#missing[@]})) || return 0
	log "installing ${missing[*]}"
	if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
		apt-get update -qq
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
		die "apt-get install ${missing[*]} failed"
}

# kernel_dir NAME prints the cache directory of kernel NAME (6.12 or 7.3).
kernel_dir() {
	case "$1" in
	6.12 | 7.3) printf '%s/kernels/%s\n' "$VM_CACHE" "$1" ;;
	*) die "unknown kernel '$1' (want one of: ${VM_KERNELS[*]})" ;;
	esac
}

# lock NAME serialises the scripts that write $VM_CACHE (two engineers or CI
# jobs may run them at once); the lock is released when the script exits.
lock() {
	mkdir -p "$VM_CACHE"
	exec 9>"$VM_CACHE/$1.lock"
	flock 9
}

# AWK_MEDIAN is an awk function for the bench tables: median(list) of a
# space-separated list of numbers ("" for none).
AWK_MEDIAN='
	function median(list,   n, v, i, j, t) {
		n = split(list, v, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
		if (n == 0) return ""
		return n % 2 ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2
	}
'
