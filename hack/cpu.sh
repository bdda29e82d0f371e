# shellcheck shell=bash
# cpu.sh (sourced): the CPU seconds make test's tables print (phases.sh,
# hack/k8s/prebuild.sh). A command runs in a cgroup v1 cpuacct group of its
# own, under this process's, which counts every process it starts, waited
# for or not; where no cpuacct hierarchy is writable, bash's times counts
# the processes the command waited for.

# cpu_group NAME makes a cpuacct group for NAME and prints its directory;
# it prints nothing where there is no writable cpuacct hierarchy.
cpu_group() {
	local root parent dir
	root=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpuacct(,|$)/ {print $2; exit}' /proc/mounts 2>/dev/null)
	parent=$(awk -F: '$2 ~ /(^|,)cpuacct(,|$)/ {print $3; exit}' /proc/self/cgroup 2>/dev/null)
	[[ -n $root && -n $parent && -w $root$parent/cgroup.procs ]] || return 0
	dir=$root${parent%/}/csi-fastblk-$1-$$
	if mkdir -p "$dir" 2>/dev/null; then echo "$dir"; fi
}

# cpu_join DIR moves the calling (sub)shell into the group DIR (if any).
cpu_join() {
	[[ -z $1 ]] || echo "$BASHPID" >"$1/cgroup.procs" 2>/dev/null || true
}

# cpu_seconds DIR prints the CPU seconds the group DIR has used.
cpu_seconds() {
	local ns
	ns=$(cat "$1/cpuacct.usage" 2>/dev/null) || ns=0
	echo $((ns / 1000000000))
}

# cpu_release DIR moves what still runs in the group DIR to its parent and
# removes it.
cpu_release() {
	local pid
	[[ -d $1 ]] || return 0
	while read -r pid; do
		echo "$pid" >"$(dirname "$1")/cgroup.procs" 2>/dev/null || true
	done <"$1/cgroup.procs"
	rmdir "$1" 2>/dev/null || true
}

# children_ms prints the user and system milliseconds of this shell's waited
# children (cutime and cstime in /proc/PID/stat, in ticks of 10 ms: Linux's
# USER_HZ is 100 on every architecture).
children_ms() {
	local stat f
	stat=$(cat "/proc/$$/stat")
	read -ra f <<<"${stat##*) }"
	echo $(((f[13] + f[14]) * 10))
}

# cpu_run NAME CMD... runs CMD, sets CPU_SECONDS to the CPU it used and
# returns its status.
cpu_run() {
	local name=$1 dir rc=0 t0
	shift
	dir=$(cpu_group "$name")
	if [[ -n $dir ]]; then
		(cpu_join "$dir" && exec "$@") || rc=$?
		CPU_SECONDS=$(cpu_seconds "$dir")
		cpu_release "$dir"
	else
		t0=$(children_ms)
		"$@" || rc=$?
		CPU_SECONDS=$((($(children_ms) - t0) / 1000))
	fi
	return "$rc"
}
