#!/usr/bin/env bash
# Installs and builds everything the two-node Kubernetes harness needs, once:
#   1. Debian packages (bookworm): containerd, runc, CNI plugins, iptables,
#      conntrack, openssl, umoci, busybox-static;
#   2. etcd 3.5 from trixie (a static binary, unpacked into the cache; the
#      machine's own apt state is not touched);
#   3. kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#      kube-proxy and kubectl from the k8s.io/kubernetes Go module through a
#      wrapper module that replaces the staging modules by their releases;
#   4. helm as hack/chart builds it, and promtool from Debian's prometheus
#      package (the tests evaluate the chart's alerts with it);
#   5. the CSI sidecars from their Go modules: csi-provisioner, csi-snapshotter,
#      snapshot-controller and csi-snapshot-metadata at the chart's versions,
#      csi-resizer at $RESIZER_TAG (lib.sh: the newest release the module
#      proxy serves), the backup client of the changed-block test
#      (hack/k8s/snapshotlister, in csi-snapshot-metadata's wrapper module),
#      and the OCI image archives of every image the cluster runs. The plugin
#      registers itself with the kubelet and answers its liveness probe, so
#      neither node-driver-registrar nor livenessprobe is needed;
#   6. e2e: storage-e2e.test (Kubernetes' external storage suite alone, from
#      hack/k8s/storagesuite, in the wrapper module of step 3 and its build
#      cache), the ginkgo CLI that runs it in parallel, agnhost, and the test
#      images (agnhost, glibc-dns-testing, nginx: step test_images).
# Safe to run repeatedly: each step is skipped when its result is cached in
# $K8S_CACHE (a warm run takes seconds), and two runs at once take turns.
# Usage: install.sh [step...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/k8s/lib.sh
. "$ROOT/hack/k8s/lib.sh"

mkdir -p "$K8S_CACHE"/{bin,stamps,src,images}
stamp() { [[ -e "$K8S_CACHE/stamps/$1" ]]; }
mark() { touch "$K8S_CACHE/stamps/$1"; }

# packages installs the bookworm packages the nodes run. A machine without
# an init system (or with a policy-rc.d refusing starts) does not start the
# packaged containerd service; the harness runs one containerd per node.
packages() {
	local pkgs=(containerd runc containernetworking-plugins iptables conntrack iproute2 util-linux
		openssl umoci busybox-static e2fsprogs xfsprogs curl git) missing=() p
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# etcd unpacks trixie's etcd-server (3.5: Kubernetes 1.36 needs etcd 3.5 or
# newer, bookworm has 3.4) into the cache through a private apt
# configuration pointing at the machine's own Debian mirror.
etcd() {
	local id=etcd-trixie apt=$K8S_CACHE/apt-trixie mirror deb
	stamp "$id" && [[ -x $K8S_BIN/etcd ]] && return 0
	mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
	[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
	[[ -n $mirror ]] || die "no Debian mirror in /etc/apt/sources.list*"
	mkdir -p "$apt"/{lists/partial,cache/archives/partial,parts,debs}
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} trixie main" >"$apt/sources.list"
	local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
		-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
	log "fetching etcd-server from trixie ($mirror)"
	apt-get "${opts[@]}" update -qq
	(cd "$apt/debs" && apt-get "${opts[@]}" download -qq etcd-server)
	deb=$(ls -t "$apt"/debs/etcd-server_*.deb | head -n1)
	rm -rf "$apt/root" && mkdir -p "$apt/root"
	dpkg-deb -x "$deb" "$apt/root"
	install -m 0755 "$apt/root/usr/bin/etcd" "$K8S_BIN/etcd"
	"$K8S_BIN/etcd" --version | grep -q 'etcd Version: 3\.[5-9]' || die "etcd: $("$K8S_BIN/etcd" --version | head -n1)"
	mark "$id"
}

# kube builds the Kubernetes binaries from k8s.io/kubernetes $KUBE_VERSION.
kube() {
	local id="kube-$KUBE_VERSION" mod dir=$K8S_CACHE/src/kube-$KUBE_VERSION ver=${KUBE_VERSION#v}
	local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
	stamp "$id" && return 0
	log "building Kubernetes $KUBE_VERSION (${cmds[*]}); 10-20 min on 2 cores with a cold cache"
	mkdir -p "$dir"
	mod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[[ -s $mod ]] || die "no go.mod for k8s.io/kubernetes@$KUBE_VERSION"
	{
		echo "module csi-fastblk.local/kube"
		echo
		echo "go $(sed -n 's/^go //p' "$mod")"
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		# Every staging module k8s.io/kubernetes replaces by a local path.
		sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 v0.'"${ver#1.}"'#p' "$mod"
	} >"$dir/go.mod"
	{
		echo "//go:build tools"
		echo
		echo "// Package kube records the commands built from k8s.io/kubernetes."
		echo "package kube"
		echo
		echo "import ("
		for c in "${cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
		echo ")"
	} >"$dir/tools.go"
	(cd "$dir" && go mod tidy)
	local pkg=k8s.io/component-base/version major=${ver%%.*} minor
	minor=${ver#*.}; minor=${minor%%.*}
	local ld="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
	local pkgs=()
	for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$K8S_BIN/" "${pkgs[@]}")
	"$K8S_BIN/kubelet" --version | grep -qx "Kubernetes $KUBE_VERSION" || die "kubelet reports $("$K8S_BIN/kubelet" --version)"
	mark "$id"
}

# Each sidecar: image reference (the chart's value), repository, tag,
# command. The tags are read from the chart's values.yaml, but the
# resizer's ($RESIZER_TAG, see lib.sh).
sidecar_list() {
	local v=$ROOT/charts/csi-fastblk/values.yaml
	val() { awk -v s="$1:" '$1 == s {f = 1} f && $1 == "tag:" {print $2; exit}' "$v"; }
	echo "registry.k8s.io/sig-storage/csi-provisioner external-provisioner $(val provisioner) csi-provisioner"
	echo "registry.k8s.io/sig-storage/csi-resizer external-resizer $RESIZER_TAG csi-resizer"
	echo "registry.k8s.io/sig-storage/csi-snapshotter external-snapshotter $(val snapshotter) csi-snapshotter"
	echo "registry.k8s.io/sig-storage/snapshot-controller external-snapshotter $(val snapshotController) snapshot-controller"
	echo "registry.k8s.io/sig-storage/csi-snapshot-metadata external-snapshot-metadata $(val snapshotMetadata) csi-snapshot-metadata"
}

# Harness programs built in a sidecar's wrapper module, against that
# module's packages at the sidecar's tag: repository => a directory of
# hack/k8s holding one command behind the build tag of its name. The command
# is built as $K8S_BIN/sidecars/<directory>-<tag>.
declare -A SIDECAR_EXTRA=([external-snapshot-metadata]=snapshotlister)

# sidecar_module REPO TAG prints the Go module path of a kubernetes-csi
# repository at TAG (github.com/kubernetes-csi/REPO, with /vN for N >= 2).
sidecar_module() {
	local major=${2%%.*}
	major=${major#v}
	if ((major >= 2)); then echo "github.com/kubernetes-csi/$1/v$major"; else echo "github.com/kubernetes-csi/$1"; fi
}

# sidecar_replaces GOMOD TAG prints the replace directives of a module's
# go.mod as a wrapper module must repeat them (Go ignores the replace
# directives of a dependency): a replacement by a release is copied; one by
# a directory of the repository (external-snapshotter's ./client) becomes
# that submodule's release at the same tag.
sidecar_replaces() {
	awk -v tag="$2" '
	function emit(line,   f, n, i, old, new) {
		sub(/\/\/.*/, "", line)
		n = split(line, f, /[ \t]+/)
		old = ""; new = ""
		for (i = 1; i <= n; i++) if (f[i] == "=>") break
		if (i > n) return
		old = f[1]; if (i == 3) old = old " " f[2]
		new = f[i + 1]; if (i + 2 <= n) new = new " " f[i + 2]
		if (new ~ /^\.\.?\//) new = f[1] " " tag
		print "replace " old " => " new
	}
	/^replace \($/ {blk = 1; next}
	blk && /^\)/ {blk = 0; next}
	blk {line = $0; sub(/^[ \t]+/, "", line); emit(line); next}
	/^replace / {line = $0; sub(/^replace[ \t]+/, "", line); emit(line)}
	' "$1"
}

# sidecar_build REPO TAG CMD... builds the commands of a kubernetes-csi
# repository at TAG from its Go module into $K8S_BIN/sidecars/<cmd>-<tag>,
# through a wrapper module ($K8S_CACHE/src/mod-REPO-TAG) that requires it and
# repeats its replace directives. Returns 1 when the proxy does not serve
# the module at TAG.
sidecar_build() {
	local repo=$1 tag=$2 mod dir gomod c
	shift 2
	local id="sidecar-module-$repo-$tag" have=1 extra=${SIDECAR_EXTRA[$repo]:-}
	for c in "$@" $extra; do [[ -x $K8S_BIN/sidecars/$c-$tag ]] || have=0; done
	if [[ -n $extra ]] && ! cmp -s "$ROOT/hack/k8s/$extra/main.go" "$K8S_CACHE/src/mod-$repo-$tag/$extra/main.go"; then
		have=0
	fi
	stamp "$id" && ((have)) && return 0
	mod=$(sidecar_module "$repo" "$tag")
	dir=$K8S_CACHE/src/mod-$repo-$tag
	rm -rf "$dir" && mkdir -p "$dir" "$K8S_BIN/sidecars"
	gomod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "$mod@$tag" 2>/dev/null |
		sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p') || true
	[[ -s $gomod ]] || return 1
	log "building $* $tag from the Go module $mod@$tag"
	{
		echo "module csi-fastblk.local/$repo"
		echo
		echo "go $(sed -n 's/^go //p' "$gomod")"
		echo
		echo "require $mod $tag"
		echo
		sidecar_replaces "$gomod" "$tag"
	} >"$dir/go.mod"
	{
		echo "//go:build tools"
		echo
		echo "// Package sidecar records the commands built from $mod."
		echo "package sidecar"
		echo
		echo "import ("
		for c in "$@"; do echo "	_ \"$mod/cmd/$c\""; done
		echo ")"
	} >"$dir/tools.go"
	# go mod tidy sees every build tag, so it records the extra's imports too.
	[[ -z $extra ]] || { mkdir -p "$dir/$extra" && cp "$ROOT/hack/k8s/$extra/main.go" "$dir/$extra/"; }
	rm -f "$dir/go.sum"
	(cd "$dir" && GOFLAGS=-mod=mod go mod tidy) || die "go mod tidy of the wrapper module $dir"
	for c in "$@"; do
		(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$tag" \
			-o "$K8S_BIN/sidecars/$c-$tag" "$mod/cmd/$c") || die "building $c $tag from $mod"
	done
	if [[ -n $extra ]]; then
		(cd "$dir" && CGO_ENABLED=0 go build -trimpath -tags "$extra" -ldflags "-s -w" \
			-o "$K8S_BIN/sidecars/$extra-$tag" "./$extra") || die "building $extra against $mod $tag"
	fi
	mark "$id"
}

# sidecars puts each sidecar's static binary in $K8S_BIN/sidecars as
# <command>-<tag>, built from its Go module (external-provisioner/v6,
# external-snapshotter/v8, external-snapshot-metadata, external-resizer at
# $RESIZER_TAG) through a wrapper module, with the SIDECAR_EXTRA commands;
# the builds of different modules run in parallel.
sidecars() {
	local ref repo tag cmd key pids=() fail=0 p
	declare -A cmds=()
	while read -r ref repo tag cmd; do
		[[ -n $tag ]] || die "no tag for $ref"
		cmds[$repo $tag]+=" $cmd"
	done < <(sidecar_list)
	for key in "${!cmds[@]}"; do
		# shellcheck disable=SC2086 # a list of commands
		(sidecar_build $key ${cmds[$key]} || die "the Go module proxy does not serve $key") &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
	((fail == 0)) || die "building the CSI sidecars failed"
	while read -r ref repo tag cmd; do
		[[ -x $K8S_BIN/sidecars/$cmd-$tag ]] || die "$cmd $tag missing from $K8S_BIN/sidecars"
	done < <(sidecar_list)
}

# oci_image REF ROOTFS entrypoint|cmd ARGS... writes $K8S_CACHE/images/<name>-<tag>.oci.tar,
# an OCI layout with one layer, as hack/image/build.sh assembles the plugin's.
oci_image() {
	local ref=$1 rootfs=$2 kind=$3 name tag layout out
	shift 3
	name=${ref%:*}; tag=${ref##*:}
	out=$K8S_CACHE/images/${name##*/}-$tag.oci.tar
	layout=$(mktemp -d)/oci
	mkdir -p "$rootfs"/{etc,tmp,dev,proc,sys}
	chmod 1777 "$rootfs/tmp"
	[[ -e $rootfs/etc/passwd ]] || printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$rootfs/etc/passwd"
	[[ -e $rootfs/etc/group ]] || printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
	local ep=() a
	for a in "$@"; do ep+=("--config.$kind" "$a"); done
	umoci init --layout "$layout" >/dev/null
	umoci new --image "$layout:$tag" >/dev/null
	umoci insert --rootless --image "$layout:$tag" --history.created_by hack/k8s/install.sh "$rootfs" / >/dev/null
	umoci config --image "$layout:$tag" --os linux --architecture amd64 "${ep[@]}" \
		--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--history.created_by "umoci config" >/dev/null
	umoci gc --layout "$layout"
	chmod -R a+rX "$layout"
	tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner -cf "$out.tmp" .
	mv "$out.tmp" "$out"
	rm -rf "$(dirname "$layout")"
	echo "$ref $out" >"$out.ref"
}

# busybox_root DIR puts Debian's static busybox and a link for each of its
# applets into DIR/bin: the files of the busybox image, and the shell and
# tools of the test images built on it.
busybox_root() {
	local app
	mkdir -p "$1/bin" "$1/usr/bin" "$1/sbin" "$1/usr/sbin"
	install -m 0755 /bin/busybox "$1/bin/busybox"
	for app in $(/bin/busybox --list); do
		[[ $app == busybox ]] || ln -s busybox "$1/bin/$app"
	done
}

# images assembles the sidecar, sandbox and test images.
images() {
	local ref repo tag cmd root
	root=$(mktemp -d)
	if [[ ! -s $K8S_CACHE/images/pause-$PAUSE_TAG.oci.tar ]]; then
		rm -rf "$root/fs" && mkdir -p "$root/fs"
		(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$root/fs/pause" ./hack/k8s/pause)
		oci_image "$PAUSE_IMAGE" "$root/fs" entrypoint /pause
	fi
	if [[ ! -s $K8S_CACHE/images/busybox-$BUSYBOX_TAG.oci.tar ]]; then
		rm -rf "$root/fs" && busybox_root "$root/fs"
		oci_image "$BUSYBOX_IMAGE" "$root/fs" cmd sh
	fi
	while read -r ref repo tag cmd; do
		# Rebuilt when the binary is newer (a module build replaced it).
		[[ $K8S_CACHE/images/${ref##*/}-$tag.oci.tar -nt $K8S_BIN/sidecars/$cmd-$tag ]] && continue
		rm -rf "$root/fs" && mkdir -p "$root/fs"
		install -m 0755 "$K8S_BIN/sidecars/$cmd-$tag" "$root/fs/$cmd"
		oci_image "$ref:$tag" "$root/fs" entrypoint "/$cmd"
	done < <(sidecar_list)
	# The changed-block test's backup client, on the busybox image's files
	# (its pod's shell prints the client's output and exit code).
	local lister out=$K8S_CACHE/images/${LISTER_IMAGE##*/}
	out=${out/:/-}.oci.tar
	tag=$(sidecar_list | awk '$2 == "external-snapshot-metadata" {print $3}')
	lister=$K8S_BIN/sidecars/snapshotlister-$tag
	if [[ ! -s $out || $lister -nt $out ]]; then
		rm -rf "$root/fs" && busybox_root "$root/fs"
		install -m 0755 "$lister" "$root/fs/bin/snapshot-metadata-lister"
		oci_image "$LISTER_IMAGE" "$root/fs" cmd sh
	fi
	rm -rf "$root"
}

# e2e builds, in kube's wrapper module and Go build cache, the external
# storage e2e suite alone (storage-e2e.test: hack/k8s/storagesuite, Kubernetes'
# storage suites and e2e framework, not the rest of test/e2e) with go test -c,
# the ginkgo CLI of the ginkgo version it links (conformance.sh runs the
# suite's specs in parallel through it), and agnhost (test/images/agnhost),
# which the suites' pods run. The step test_images then assembles the agnhost
# image (the static binary on the busybox image's files) and the other test
# images of the storage suites.
e2e() {
	local id="e2e-$KUBE_VERSION" dir=$K8S_CACHE/src/kube-$KUBE_VERSION ver=${KUBE_VERSION#v} b
	local suite=$ROOT/hack/k8s/storagesuite/suite_test.go
	kube
	local bins=(storage-e2e.test ginkgo agnhost) missing=0
	for b in "${bins[@]}"; do [[ -x $K8S_BIN/$b ]] || missing=1; done
	if ! stamp "$id" || ! cmp -s "$suite" "$dir/storagesuite/suite_test.go" || ((missing)); then
		log "building ${bins[*]} of Kubernetes $KUBE_VERSION"
		mkdir -p "$dir/storagesuite"
		cp "$suite" "$dir/storagesuite/suite_test.go"
		rm -f "$dir/agnhost.go"
		printf '%s\n' "//go:build tools" "" "package kube" "" "import (" \
			'	_ "github.com/onsi/ginkgo/v2/ginkgo"' '	_ "k8s.io/kubernetes/test/images/agnhost"' ")" >"$dir/e2etools.go"
		(cd "$dir" && go mod tidy)
		local pkg=k8s.io/component-base/version major=${ver%%.*} minor
		minor=${ver#*.}; minor=${minor%%.*}
		local ld="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		(cd "$dir" && CGO_ENABLED=0 go test -c -trimpath -tags k8se2e -ldflags "$ld" \
			-o "$K8S_BIN/storage-e2e.test" ./storagesuite)
		(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$K8S_BIN/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
		(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$K8S_BIN/agnhost" k8s.io/kubernetes/test/images/agnhost)
		mark "$id"
	fi
}

# gnu_coreutils DIR copies the programs of Debian's coreutils package into
# DIR/usr/bin, dash to DIR/bin/sh, and every shared library they load (ldd)
# to its own path under DIR.
gnu_coreutils() {
	local f lib
	declare -A libs=()
	rm -f "$1/bin/sh"
	install -m 0755 /bin/dash "$1/bin/sh"
	while read -r f; do
		[[ -f $f && -x $f && ! -L $f ]] || continue
		install -m 0755 "$f" "$1/usr/bin/${f##*/}"
	done < <(dpkg -L coreutils | grep -E '/s?bin/[^/]+$')
	for f in "$1/bin/sh" "$1"/usr/bin/*; do
		for lib in $(ldd "$f" | grep -oE '/[^ ]+\.so[^ ]*'); do libs[$lib]=1; done
	done
	for lib in "${!libs[@]}"; do
		mkdir -p "$1$(dirname "$lib")"
		cp -L "$lib" "$1$lib"
	done
}

# test_images assembles the images of the storage suites' pods that are not
# the busybox image, under the references of Kubernetes' manifest.go:
#   - agnhost: the static binary built by e2e on the busybox image's files;
#   - glibc-dns-testing ($GLIBC_IMAGE): the multiVolume specs' pods, which
#     write with GNU dd's oflag=nocache (busybox's dd refuses it): the busybox
#     image's files with Debian's dash as /bin/sh (Debian's busybox shell runs
#     its own applets before PATH) and GNU coreutils in /usr/bin, which comes
#     first in the image's PATH, with the libraries they load (glibc);
#   - nginx ($NGINX_IMAGE): only the exec spec ("should allow exec of files
#     on the volume") runs it, with its own command: /bin/sh writing a script
#     onto the volume and running it. The image is the busybox image's files
#     with nginx's default command replaced by busybox's httpd serving
#     /usr/share/nginx/html on port 80. Imported under the original name:
#     KUBE_TEST_REPO_LIST (test/utils/image/manifest.go) remaps whole
#     registries, not single images, so a name of our own would mean
#     renaming busybox and agnhost with it for nothing.
# A reference missing here makes the node's containerd try the registry,
# which the cluster's sealed network cannot reach: the pod then waits in
# ImagePullBackOff until its spec times out.
test_images() {
	local root
	root=$(mktemp -d)
	if [[ ! -s $K8S_CACHE/images/agnhost-$AGNHOST_TAG.oci.tar || $K8S_BIN/agnhost -nt $K8S_CACHE/images/agnhost-$AGNHOST_TAG.oci.tar ]]; then
		rm -rf "$root/fs" && busybox_root "$root/fs"
		install -m 0755 "$K8S_BIN/agnhost" "$root/fs/agnhost"
		oci_image "$AGNHOST_IMAGE" "$root/fs" entrypoint /agnhost
	fi
	if [[ ! -s $K8S_CACHE/images/glibc-dns-testing-$GLIBC_TAG.oci.tar ]]; then
		rm -rf "$root/fs" && busybox_root "$root/fs"
		gnu_coreutils "$root/fs"
		oci_image "$GLIBC_IMAGE" "$root/fs" cmd sh
	fi
	if [[ ! -s $K8S_CACHE/images/nginx-$NGINX_TAG.oci.tar ]]; then
		rm -rf "$root/fs" && busybox_root "$root/fs"
		mkdir -p "$root/fs/usr/share/nginx/html"
		echo "csi-fastblk test image (busybox httpd)" >"$root/fs/usr/share/nginx/html/index.html"
		oci_image "$NGINX_IMAGE" "$root/fs" cmd httpd -f -p 80 -h /usr/share/nginx/html
	fi
	rm -rf "$root"
}

# promtool is Prometheus' rule checker, from the machine's Debian release's
# prometheus package (unpacked into the cache; nothing is installed): the
# cluster tests evaluate the chart's alert expressions with it against the
# plugins' real metrics (test/k8s TestBackendInPlainSight).
promtool() {
	local dir=$K8S_CACHE/src/prometheus deb
	[[ -x $K8S_BIN/promtool ]] && return 0
	log "fetching promtool (Debian's prometheus package)"
	mkdir -p "$dir" && rm -rf "${dir:?}"/*
	(cd "$dir" && { apt-get download -qq -o APT::Sandbox::User=root prometheus 2>/dev/null ||
		{ apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root prometheus; }; })
	deb=$(ls -t "$dir"/prometheus_*.deb | head -n1)
	dpkg-deb -x "$deb" "$dir/root"
	install -m 0755 "$dir/root/usr/bin/promtool" "$K8S_BIN/promtool"
	rm -rf "$dir"
	"$K8S_BIN/promtool" --version >/dev/null || die "promtool from $deb does not run"
}

# helm builds the pinned helm exactly as hack/chart does (its own cache).
helm() {
	(
		# shellcheck source=hack/chart/lib.sh
		. "$ROOT/hack/chart/lib.sh"
		ensure_helm
		ln -sfn "$HELM" "$K8S_BIN/helm"
	)
}

# main runs the steps asked for (default: all) holding $K8S_CACHE/install.lock,
# so that a second install, such as make e2e-k8s while the prebuild of make
# test (prebuild.sh) still runs, waits for the first and then finds its
# results cached.
main() {
	local steps=("$@") t0=$SECONDS
	((${#steps[@]})) || steps=(packages etcd kube helm promtool sidecars images e2e test_images)
	exec 9>"$K8S_CACHE/install.lock"
	if ! flock -n 9; then
		log "waiting for the install already running (make test's prebuild logs to $PREBUILD_LOG)"
		flock 9
		log "it ended after $((SECONDS - t0)) s"
	fi
	for s in "${steps[@]}"; do "$s"; done
}
main "$@"
