#!/usr/bin/env bash
# One Kubernetes node of the harness, run by cluster.sh inside the node's own
# network namespace and a new private mount namespace:
#   nsenter --net=/run/netns/<ns> unshare -m --propagation private node.sh NODE
# It bind-mounts the node's directories of $K8S_WORK/<node> over the usual
# host paths (so the chart's kubeletDir and dataDir defaults are this node's
# own), mounts two device classes' disks, starts the node's containerd,
# imports the images, then starts kubelet and kube-proxy, and waits. Killing it (and what it started) ends the node;
# its mount namespace, and every mount in it, goes with the last process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"

node=$1
dir=$K8S_WORK/$node
conf=$dir/conf
logs=$K8S_WORK/logs

# start_kubelet starts the node's kubelet in the background (its log
# appended to), recording its pid.
start_kubelet() {
	"$K8S_BIN/kubelet" --config="$conf/kubelet.yaml" --kubeconfig="$conf/kubelet.kubeconfig" \
		--hostname-override="$node" --node-ip="$(cat "$conf/node-ip")" --v=2 >>"$logs/$node-kubelet.log" 2>&1 &
	echo $! >"$dir/kubelet.pid"
}

# node.sh NODE kubelet, run inside a running node's namespaces (cluster.sh
# restart-kubelet), starts its kubelet again.
if [[ ${2:-} == kubelet ]]; then
	start_kubelet
	exit 0
fi

# Host path -> the node's private directory. /var/lib/kubelet is then made
# shared so that mounts the plugin makes in its container (Bidirectional
# propagation) reach kubelet, and pods' mounts reach the plugin.
binds=(
	/var/lib/kubelet:kubelet
	/var/lib/csi-fastblk:data
	/var/lib/fastblk-classes:classes
	/dev/fastblk:dev-fastblk
	/etc/cni/net.d:cni-conf
	/var/lib/cni:cni-state
	/var/lib/containerd:containerd
	/run/containerd:run-containerd
	/run/netns:run-netns
	/var/log/pods:log-pods
	/var/log/containers:log-containers
)
for b in "${binds[@]}"; do
	mkdir -p "$dir/${b#*:}"
	mount --bind "$dir/${b#*:}" "${b%%:*}"
done
mount --make-shared /var/lib/kubelet
# Two device classes' disks (test/k8s TestDeviceClasses): an xfs and an
# ext4 filesystem on loop devices over sparse images in the node's
# directory (disks/), mounted in this mount namespace only, below
# /var/lib/fastblk-classes. mount -o loop sets the devices to clear
# themselves when the namespace's last process ends and unmounts them. The
# chart mounts their parent with HostToContainer propagation, which needs
# a shared (or slave) mount.
mkdir -p "$dir/disks"
for fs in xfs ext4; do
	img=$dir/disks/$fs.img
	rm -f "$img"
	truncate -s "$CLASS_DISK_SIZE" "$img"
	case $fs in
	xfs) mkfs.xfs -q -f "$img" ;;
	ext4) mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 "$img" ;;
	esac
	mkdir -p "/var/lib/fastblk-classes/$fs"
	mount -o loop "$img" "/var/lib/fastblk-classes/$fs"
done
mount --make-shared /var/lib/fastblk-classes
# Kubelet sets these kernel-wide sysctls to its preferred values at start
# (vm.overcommit_memory=1, kernel.panic_on_oops=1, ...) and fails when it
# cannot; the host's must not change. In this mount namespace each one that
# differs reads as kubelet wants it: a file with that value over the
# /proc/sys entry. Pods get their own /proc and see the real values.
mkdir -p "$dir/sysctl"
while read -r key want; do
	f=/proc/sys/${key//.//}
	[[ $(cat "$f") == "$want" ]] && continue
	echo "$want" >"$dir/sysctl/$key"
	mount --bind "$dir/sysctl/$key" "$f"
done <<'EOF'
vm.overcommit_memory 1
vm.panic_on_oom 0
kernel.panic 10
kernel.panic_on_oops 1
kernel.keys.root_maxkeys 1000000
kernel.keys.root_maxbytes 25000000
EOF
sysctl -qw net.ipv4.ip_forward=1

containerd --config "$conf/containerd.toml" >"$logs/$node-containerd.log" 2>&1 &
echo $! >"$dir/containerd.pid"
for _ in $(seq 100); do
	ctr version >/dev/null 2>&1 && break
	sleep 0.2
done
ctr version >/dev/null || die "$node: containerd did not start (see $logs/$node-containerd.log)"

while read -r ref archive; do
	ctr -n k8s.io images import --base-name "${ref%:*}" "$archive" >/dev/null ||
		die "$node: import $ref from $archive"
done <"$K8S_WORK/images.list"
have=$(ctr -n k8s.io images ls -q)
while read -r ref _; do
	grep -qx "$ref" <<<"$have" || die "$node: $ref missing after import"
done <"$K8S_WORK/images.list"

start_kubelet
"$K8S_BIN/kube-proxy" --config="$conf/kube-proxy.yaml" --v=2 >"$logs/$node-kube-proxy.log" 2>&1 &
echo $! >"$dir/kube-proxy.pid"
echo ready >"$dir/node.ready"
wait
