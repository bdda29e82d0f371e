#!/usr/bin/env bash
# A two-node Kubernetes on this machine, entirely inside namespaces it creates.
#
#   cluster.sh up        start it (install.sh must have run; images.list names
#                        the images to import, see e2e.sh)
#   cluster.sh down      stop it, remove what it made, and fail on any leak
#   cluster.sh kubectl … / helm …   run the client against it
#   cluster.sh restart-kubelet NODE  stop a node's kubelet and start it again
#   cluster.sh stop-kubelet NODE, start-kubelet NODE  the same in two steps
#
# Network: every address exists only inside network namespaces made here.
# A bridge lives in its own namespace ($NS_BR, 10.231.0.1/24); the control
# plane ($NS_CP, 10.231.0.2: etcd on loopback, kube-apiserver,
# kube-controller-manager, kube-scheduler) and each node ($NS_PREFIX-n1
# 10.231.0.11, -n2 10.231.0.12: containerd, kubelet, kube-proxy and the pods)
# reach it by a veth pair. Pods get 10.232.<n>.0/24 from a bridge/host-local
# CNI inside their node's namespace; services are 10.233.0.0/24, which only
# kube-proxy's rules in the node namespaces know. The host's own network
# namespace gets no address, route or rule.
#
# Mounts: each node runs in its own mount namespace (node.sh), so that
# /var/lib/kubelet, /var/lib/csi-fastblk and the runtime's directories are the
# node's own. cgroups: each kubelet's cgroupRoot is /$NS_PREFIX-<node>.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"

NS_PREFIX=fbk-k8s
NS_BR=$NS_PREFIX-br
NS_CP=$NS_PREFIX-cp
NODES=(n1 n2)
NET=10.231.0
CP_IP=$NET.2
POD_NET=10.232
SERVICE_CIDR=10.233.0.0/24
SERVICE_IP=10.233.0.1
PKI=$K8S_WORK/pki
LOGS=$K8S_WORK/logs
# Host directories the nodes bind-mount over (node.sh); those this script
# creates are listed in $K8S_WORK/created and removed by down.
# /lib/modules is a hostPath of the chart (DirectoryOrCreate), absent on some
# machines: made here so that kubelet does not leave it behind.
HOST_DIRS=(/run/netns /lib/modules /var/lib/kubelet /var/lib/csi-fastblk /var/lib/fastblk-classes /dev/fastblk /etc/cni/net.d /var/lib/cni
	/var/lib/containerd /run/containerd /var/log/pods /var/log/containers)

node_ip() { echo "$NET.$((10 + ${1#n}))"; }
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" -- "$@"; }

# wait_for SECONDS WHAT CMD... polls CMD every half second.
wait_for() {
	local t=$1 what=$2 end
	shift 2
	end=$((SECONDS + t))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || die "timed out after ${t}s waiting for $what"
		sleep 0.5
	done
}

# --- certificates ---------------------------------------------------------

# cert NAME CN [O] [SAN]: a key and a certificate signed by the test CA, for
# client and server use.
cert() {
	local name=$1 cn=$2 o=${3:-} san=${4:-} subj ext
	subj="/CN=$cn${o:+/O=$o}"
	ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth${san:+
subjectAltName=$san}"
	openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$PKI/$name.key" \
		-subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 2 -extfile <(echo "$ext") -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr"
}

# kubeconfig NAME SERVER: a kubeconfig for the certificate NAME.
kubeconfig() {
	cat >"$K8S_WORK/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {certificate-authority: $PKI/ca.crt, server: "$2"}
users:
- name: $1
  user: {client-certificate: $PKI/$1.crt, client-key: $PKI/$1.key}
contexts:
- name: e2e
  context: {cluster: e2e, user: $1}
current-context: e2e
EOF
}

pki() {
	mkdir -p "$PKI"
	openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$PKI/ca.key" \
		-subj /CN=csi-fastblk-e2e-ca -days 2 -out "$PKI/ca.crt" 2>/dev/null
	openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
	openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
	cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$CP_IP,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
	cert admin admin system:masters
	cert controller-manager system:kube-controller-manager
	cert scheduler system:kube-scheduler
	cert kube-proxy system:kube-proxy
	local n
	for n in "${NODES[@]}"; do
		cert "node-$n" "system:node:$n" system:nodes
		cert "kubelet-$n" "$n" "" "IP:$(node_ip "$n"),DNS:$n"
	done
	kubeconfig admin "https://127.0.0.1:6443"
	kubeconfig controller-manager "https://127.0.0.1:6443"
	kubeconfig scheduler "https://127.0.0.1:6443"
	kubeconfig kube-proxy "https://$CP_IP:6443"
	for n in "${NODES[@]}"; do kubeconfig "node-$n" "https://$CP_IP:6443"; done
}

# --- network --------------------------------------------------------------

network() {
	local n ns
	ip netns add "$NS_BR"
	ip -n "$NS_BR" link set lo up
	ip -n "$NS_BR" link add br0 type bridge
	ip -n "$NS_BR" addr add "$NET.1/24" dev br0
	ip -n "$NS_BR" link set br0 up
	# veth NS IP: the namespace's eth0, plugged into br0.
	veth() {
		ip netns add "$1"
		ip -n "$1" link set lo up
		ip -n "$NS_BR" link add "v-${1#"$NS_PREFIX"-}" type veth peer name eth0 netns "$1"
		ip -n "$NS_BR" link set "v-${1#"$NS_PREFIX"-}" master br0 up
		ip -n "$1" addr add "$2/24" dev eth0
		ip -n "$1" link set eth0 up
		# Anything not for the cluster ends in the bridge namespace, which
		# forwards nothing.
		ip -n "$1" route add default via "$NET.1"
	}
	veth "$NS_CP" "$CP_IP"
	for n in "${NODES[@]}"; do
		veth "$NS_PREFIX-$n" "$(node_ip "$n")"
	done
	# Pod routes: each node's pod range via that node.
	for n in "${NODES[@]}"; do
		for ns in "$NS_CP" "${NODES[@]/#/$NS_PREFIX-}"; do
			[[ $ns == "$NS_PREFIX-$n" ]] && continue
			ip -n "$ns" route add "$POD_NET.${n#n}.0/24" via "$(node_ip "$n")"
		done
	done
}

# --- control plane ----------------------------------------------------------

# start NAME NS CMD...: runs CMD in the network namespace NS, logging to
# $LOGS/NAME.log, its pid in $K8S_WORK/pids/NAME.
start() {
	local name=$1 ns=$2
	shift 2
	(exec nsenter --net="/run/netns/$ns" -- "$@") >"$LOGS/$name.log" 2>&1 &
	echo $! >"$K8S_WORK/pids/$name"
}

control_plane() {
	local b=$K8S_BIN
	start etcd "$NS_CP" "$b/etcd" --name e2e --data-dir "$K8S_WORK/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster e2e=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
		--unsafe-no-fsync --log-level warn
	wait_for 60 etcd in_ns "$NS_CP" curl -sf http://127.0.0.1:2381/health
	start kube-apiserver "$NS_CP" "$b/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
		--advertise-address="$CP_IP" --bind-address=0.0.0.0 --secure-port=6443 \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
		--client-ca-file="$PKI/ca.crt" \
		--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$PKI/ca.crt" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-extend-token-expiration=false \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--allow-privileged=true --profiling=false --v=1 \
		--runtime-config=storage.k8s.io/v1beta1=true
	wait_for 180 "kube-apiserver" kubectl get --raw /readyz
	start kube-controller-manager "$NS_CP" "$b/kube-controller-manager" \
		--kubeconfig="$K8S_WORK/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$K8S_WORK/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$K8S_WORK/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --service-account-private-key-file="$PKI/sa.key" \
		--root-ca-file="$PKI/ca.crt" --use-service-account-credentials=true \
		--service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_NET.0.0/16" \
		--allocate-node-cidrs=false --profiling=false --v=2
	start kube-scheduler "$NS_CP" "$b/kube-scheduler" --kubeconfig="$K8S_WORK/scheduler.kubeconfig" \
		--authentication-kubeconfig="$K8S_WORK/scheduler.kubeconfig" \
		--authorization-kubeconfig="$K8S_WORK/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --profiling=false --v=2
}

# --- nodes ------------------------------------------------------------------

node_conf() {
	local n=$1 ip conf=$K8S_WORK/$1/conf
	ip=$(node_ip "$n")
	mkdir -p "$conf" "$K8S_WORK/$n/cni-conf"
	echo "$ip" >"$conf/node-ip"
	cp "$K8S_WORK/node-$n.kubeconfig" "$conf/kubelet.kubeconfig"
	cat >"$conf/containerd.toml" <<EOF
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  # This machine refuses negative oom_score_adj writes even to root, and
  # runc fails a container whose spec asks for one (every pod sandbox: -998):
  # clamp them to containerd's own (0).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
	cat >"$K8S_WORK/$n/cni-conf/10-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_NET.${n#n}.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	cat >"$conf/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine runs cgroup v1, which kubelet 1.36 refuses by default.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$NS_PREFIX-$n
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-$n.crt
tlsPrivateKeyFile: $PKI/kubelet-$n.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: ""
# Images cannot be pulled again here: never collect them; the machine's
# disk is shared, so evict only when it is really full.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
volumeStatsAggPeriod: 10s
# Pods are resynced (and online filesystem growth noticed) this often.
syncFrequency: 10s
EOF
	cat >"$conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $K8S_WORK/kube-proxy.kubeconfig}
hostnameOverride: $n
mode: iptables
clusterCIDR: $POD_NET.0.0/16
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Leave the kernel-wide conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# cgroup_roots makes /$NS_PREFIX-<node> in every cgroup v1 hierarchy (kubelet
# expects its cgroupRoot to exist in each).
cgroup_roots() {
	local h n
	for h in /sys/fs/cgroup/*/; do
		[[ -e ${h}cgroup.procs ]] || continue
		for n in "${NODES[@]}"; do
			mkdir -p "$h$NS_PREFIX-$n"
			# A new v1 cpuset has no CPUs or memory nodes: give it the root's.
			if [[ -e ${h}cpuset.cpus ]]; then
				cat "${h}cpuset.cpus" >"$h$NS_PREFIX-$n/cpuset.cpus"
				cat "${h}cpuset.mems" >"$h$NS_PREFIX-$n/cpuset.mems"
			fi
		done
	done
}

nodes() {
	local n
	for n in "${NODES[@]}"; do
		node_conf "$n"
		# exec: the recorded pid is node.sh's, in the node's namespaces.
		(exec nsenter --net="/run/netns/$NS_PREFIX-$n" -- unshare -m --propagation private -- \
			"$ROOT/hack/k8s/node.sh" "$n") >"$LOGS/$n-node.log" 2>&1 &
		echo $! >"$K8S_WORK/pids/node-$n"
	done
	for n in "${NODES[@]}"; do
		wait_for 300 "node $n to start (see $LOGS/$n-node.log)" test -e "$K8S_WORK/$n/node.ready"
	done
	for n in "${NODES[@]}"; do
		wait_for 300 "node $n Ready" kubectl wait --for=condition=Ready "node/$n" --timeout=5s
	done
}

# --- up / down ----------------------------------------------------------------

kubectl() { in_ns "$NS_CP" "$K8S_BIN/kubectl" --kubeconfig="$K8S_WORK/admin.kubeconfig" "$@"; }
# helm installs, upgrades and renders the chart with the harness's resizer
# (RESIZER_TAG and RESIZER_ARGS, see lib.sh) instead of the chart's default.
helm() {
	local extra=()
	case ${1:-} in
	install | upgrade | template) extra=(--set "resizer.image.tag=$RESIZER_TAG" --set "resizer.extraArgs={$RESIZER_ARGS}") ;;
	esac
	in_ns "$NS_CP" "$K8S_BIN/helm" --kubeconfig="$K8S_WORK/admin.kubeconfig" "$@" "${extra[@]}"
}

# host_state prints what the leak check compares: the host's iptables and
# nftables rules and the kernel-wide sysctls kubelet likes to set.
host_state() {
	local t
	for t in iptables-legacy-save iptables-nft-save ip6tables-legacy-save ip6tables-nft-save; do
		echo "## $t"
		{ "$t" 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//'
	done
	echo "## sysctl"
	sysctl vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys \
		kernel.keys.root_maxbytes net.ipv4.ip_forward
	echo "## nft"
	nft list ruleset 2>/dev/null || true
}

up() {
	[[ ! -e $K8S_WORK/pids ]] || die "a cluster is running (or was not torn down): run $0 down"
	for b in etcd kube-apiserver kubelet kubectl helm; do
		[[ -x $K8S_BIN/$b ]] || die "$K8S_BIN/$b missing: run hack/k8s/install.sh"
	done
	[[ -s $K8S_WORK/images.list ]] || die "$K8S_WORK/images.list missing (REF ARCHIVE lines)"
	mkdir -p "$K8S_WORK"/{pids,logs}
	host_state >"$K8S_WORK/host-state.before"
	losetup -l -n -O NAME >"$K8S_WORK/loop.before" 2>/dev/null || true
	local d
	: >"$K8S_WORK/created"
	for d in "${HOST_DIRS[@]}"; do
		[[ -e $d ]] && continue
		mkdir -p "$d"
		echo "$d" >>"$K8S_WORK/created"
	done
	pki
	network
	control_plane
	cgroup_roots
	nodes
	kubectl get nodes -o wide
}

# kill_pids SIGNAL PID...: signals the live ones, waits up to 10 s for all,
# then kills what is left.
kill_pids() {
	local sig=$1 p end
	shift
	(($#)) || return 0
	kill "-$sig" "$@" 2>/dev/null || true
	end=$((SECONDS + 10))
	for p in "$@"; do
		while kill -0 "$p" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
	done
	for p in "$@"; do
		kill -0 "$p" 2>/dev/null && { log "pid $p survived SIG$sig; killing"; kill -KILL "$p" 2>/dev/null || true; }
	done
	return 0
}

# our_pids prints the processes whose network namespace is one of ours or
# whose cgroup is under a node's cgroup root.
our_pids() {
	local ids
	ids=$(for f in /run/netns/"$NS_PREFIX"-*; do [[ -e $f ]] && echo "net:[$(stat -L -c %i "$f")]"; done)
	{
		[[ -z $ids ]] || find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%l %p\n' 2>/dev/null |
			awk 'NR == FNR {ns[$1] = 1; next} $1 in ns {split($2, a, "/"); print a[3]}' <(echo "$ids") -
		grep -l ":/$NS_PREFIX-" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3
	} | sort -un | grep -vx -e "$$" -e "$BASHPID" || true
}

# loop_devices prints loop devices whose backing file is a file under
# $K8S_WORK (matched by device and inode: the paths the kernel reports are
# the nodes' /var/lib/csi-fastblk, the same string on both).
loop_devices() {
	local inodes name ino majmin maj min
	inodes=$(find "$K8S_WORK" -xdev -type f -printf '%d %i\n' 2>/dev/null | sort -u)
	while read -r name ino majmin; do
		[[ -n $majmin ]] || continue
		maj=${majmin%%:*} min=${majmin##*:}
		# st_dev as find prints it: the kernel's new_encode_dev.
		grep -qx "$(((maj << 8) | (min & 0xff) | ((min & ~0xff) << 12))) $ino" <<<"$inodes" && echo "$name"
	done < <(losetup -l -n -O NAME,BACK-INO,BACK-MAJ:MIN 2>/dev/null)
	return 0
}

# disk_numbers prints the MAJ:MIN of each loop device over a file under
# $K8S_WORK (the nodes' device-class disks, and any volume device left).
disk_numbers() {
	local d
	d=$(loop_devices)
	[[ -z $d ]] || losetup -l -n -O MAJ:MIN $d 2>/dev/null | tr -d ' '
}

# class_loop_devices prints loop devices whose backing file is on a
# device-class disk of a node (node.sh: a loop device over an image under
# $K8S_WORK): the plugin's devices of those classes' volumes.
class_loop_devices() {
	local disks name majmin
	disks=$(disk_numbers)
	[[ -n $disks ]] || return 0
	while read -r name majmin; do
		grep -qx "$majmin" <<<"$disks" && echo "$name"
	done < <(losetup -l -n -O NAME,BACK-MAJ:MIN 2>/dev/null)
	return 0
}

# stale_loop_devices prints loop devices attached since up to a deleted
# volume file of a node: the kernel shows such a file as
# /volumes/<id>.img (deleted), relative to the nodes' data directory (or
# device class) mount, on the filesystem of $K8S_WORK or of a device-class
# disk. The plugin deleted the file and left the device attached.
stale_loop_devices() {
	local devs name majmin file disk
	devs=" $(stat -c %d "$K8S_WORK") "
	for disk in $(disk_numbers); do
		devs+="$(((${disk%%:*} << 8) | (${disk##*:} & 0xff) | ((${disk##*:} & ~0xff) << 12))) "
	done
	while read -r name majmin file; do
		[[ $file =~ ^/volumes/v[0-9a-f]+\.img\ \(deleted\)$ ]] || continue
		grep -qx "$name" "$K8S_WORK/loop.before" 2>/dev/null && continue
		local maj=${majmin%%:*} min=${majmin##*:}
		[[ $devs == *" $(((maj << 8) | (min & 0xff) | ((min & ~0xff) << 12))) "* ]] && echo "$name"
	done < <(losetup -l -n -O NAME,BACK-MAJ:MIN,BACK-FILE 2>/dev/null)
	return 0
}

down() {
	local n p pids d fail=0
	[[ -d $K8S_WORK ]] || { log "nothing to tear down"; return 0; }
	# 1. kubelets and kube-proxies first, so nothing restarts containers.
	pids=()
	for n in "${NODES[@]}"; do
		for p in kubelet kube-proxy; do
			[[ -s $K8S_WORK/$n/$p.pid ]] && pids+=("$(cat "$K8S_WORK/$n/$p.pid")")
		done
	done
	kill_pids TERM "${pids[@]}"
	# 2. the control plane, then everything left in our namespaces and cgroups
	#    (containers, shims, containerd, the node holders).
	local batch
	for batch in "kube-scheduler kube-controller-manager kube-apiserver" etcd; do
		pids=()
		for p in $batch; do
			[[ -s $K8S_WORK/pids/$p ]] && pids+=("$(cat "$K8S_WORK/pids/$p")")
		done
		kill_pids TERM "${pids[@]}"
	done
	mapfile -t pids < <(our_pids)
	kill_pids TERM "${pids[@]}"
	mapfile -t pids < <(our_pids)
	kill_pids KILL "${pids[@]}"
	# 3. loop devices the plugins left attached to the nodes' volume files
	#    (those on the device-class disks first, which keep their disks busy).
	for d in $(class_loop_devices); do
		log "detaching $d (a volume file on a device-class disk)"
		losetup -d "$d" || true
	done
	for d in $(loop_devices); do
		log "detaching $d (backing file under $K8S_WORK)"
		losetup -d "$d" || true
	done
	for d in $(stale_loop_devices); do
		log "leak: the plugin left $d attached to a deleted volume file ($(losetup -n -O BACK-FILE "$d")); detaching"
		losetup -d "$d" || true
		fail=1
	done
	# 4. cgroups, deepest first.
	for d in /sys/fs/cgroup/*/"$NS_PREFIX"-*; do
		[[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	# 5. network namespaces (and the rules inside them).
	for n in $(ip netns list | awk -v p="$NS_PREFIX-" 'index($1, p) == 1 {print $1}'); do
		ip netns del "$n"
	done
	# 6. host directories made by up (ip netns add makes /run/netns a mount
	#    point), then the work directory but its logs.
	if grep -qx /run/netns "$K8S_WORK/created" 2>/dev/null && mountpoint -q /run/netns; then
		umount /run/netns
	fi
	if [[ -s $K8S_WORK/created ]]; then
		tac "$K8S_WORK/created" | while read -r d; do rmdir "$d" 2>/dev/null || log "leak: $d not empty"; done
	fi
	leak_check || fail=1
	find "$K8S_WORK" -mindepth 1 -maxdepth 1 ! -name logs ! -name 'host-state.*' -exec rm -rf {} +
	return "$fail"
}

# leak_check fails when anything the cluster made is still there.
leak_check() {
	local fail=0 x
	x=$(our_pids)
	[[ -z $x ]] || { log "leak: processes $(echo $x)"; fail=1; }
	x=$(grep -E " ($K8S_WORK|/var/lib/kubelet|/var/lib/csi-fastblk|/run/containerd|/run/netns/$NS_PREFIX)" /proc/self/mountinfo || true)
	[[ -z $x ]] || { log "leak: mounts"$'\n'"$x"; fail=1; }
	# A device busy when detached goes when its last mount does.
	for _ in $(seq 20); do x=$(loop_devices); [[ -z $x ]] && break; sleep 0.5; done
	[[ -z $x ]] || { log "leak: loop devices $x"; fail=1; }
	x=$(stale_loop_devices)
	[[ -z $x ]] || { log "leak: loop devices of deleted volume files $x"; fail=1; }
	x=$(ip netns list | grep "^$NS_PREFIX-" || true)
	[[ -z $x ]] || { log "leak: network namespaces $x"; fail=1; }
	x=$(ls -d /sys/fs/cgroup/*/"$NS_PREFIX"-* 2>/dev/null || true)
	[[ -z $x ]] || { log "leak: cgroups $x"; fail=1; }
	if [[ -s $K8S_WORK/created ]]; then
		x=$(while read -r d; do [[ -e $d ]] && echo "$d"; done <"$K8S_WORK/created")
		[[ -z $x ]] || { log "leak: host directories $x"; fail=1; }
	fi
	if [[ -s $K8S_WORK/host-state.before ]]; then
		host_state >"$K8S_WORK/host-state.after"
		diff -u "$K8S_WORK/host-state.before" "$K8S_WORK/host-state.after" >&2 ||
			{ log "leak: the host's iptables/nftables rules or sysctls changed"; fail=1; }
	fi
	((fail == 0)) && log "leak check: nothing left behind"
	return "$fail"
}

# restart_kubelet NODE stops the node's kubelet and starts a new one in the
# node's namespaces (those of its node.sh), as a kubelet upgrade or crash
# does; containers keep running.
restart_kubelet() {
	stop_kubelet "$1"
	start_kubelet "$1"
}

# stop_kubelet NODE stops the node's kubelet (its containers, containerd
# and kube-proxy keep running: a node whose kubelet is gone);
# start_kubelet NODE starts it again in the node's namespaces.
stop_kubelet() {
	[[ -s $K8S_WORK/pids/node-$1 ]] || die "node $1 is not running"
	kill_pids TERM "$(cat "$K8S_WORK/$1/kubelet.pid")"
}
start_kubelet() {
	local holder
	holder=$(cat "$K8S_WORK/pids/node-$1") || die "node $1 is not running"
	nsenter -t "$holder" -m -n -- "$ROOT/hack/k8s/node.sh" "$1" kubelet
}

# Sourced (to reuse the functions): stop here.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0
case ${1:-} in
up) up ;;
down) down ;;
kubectl | helm) c=$1; shift; "$c" "$@" ;;
restart-kubelet) restart_kubelet "$2" ;;
stop-kubelet) stop_kubelet "$2" ;;
start-kubelet) start_kubelet "$2" ;;
*) echo "usage: $0 up|down|restart-kubelet NODE|stop-kubelet NODE|start-kubelet NODE|kubectl ARGS|helm ARGS" >&2; exit 2 ;;
esac
