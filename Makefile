SHELL := /bin/bash
# csi-fastblk build and test entry points. Every target installs what it
# needs (hack/install-deps.sh), so a fresh Debian machine with Go can run them.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
PKGS      := ./...

.PHONY: all build static deps run test unit fuzz sanity integration e2e-vm e2e-k8s e2e-k8s-conformance e2e-k8s-long e2e-k8s-down bench bench-engine bench-copy \
        bench-vm bench-scale chart-test chart-readme chart-crds deploy image lint fmt vet clean

all: build

deps:
	@hack/install-deps.sh

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/csi-fastblk ./cmd/csi-fastblk

# A static binary for the VM initramfs and the container image. TAGS adds
# build tags: the benchmarks build it with the ablation switches
# (--ublk-ablate, -tags ablation), which the plugin's binary lacks.
TAGS ?=
static:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/csi-fastblk-static ./cmd/csi-fastblk

# Run the plugin on a local socket with default settings.
run: deps build
	mkdir -p /var/lib/csi-fastblk
	$(BIN)/csi-fastblk serve --endpoint unix:///tmp/csi-fastblk.sock -v=2

# Everything CI runs, the user's path on a real two-node Kubernetes last
# (e2e-k8s builds and caches what it needs on a fresh machine). The
# cluster's Go programs build in the background at idle priority from the
# start (hack/k8s/prebuild.sh); the VM's tests run beside the cluster's
# (e2e-vm+e2e-k8s: the cluster's tests mostly wait, the VM mostly
# computes); the time of each phase prints last.
TEST_PHASES := vet lint unit fuzz sanity integration chart-test e2e-vm e2e-k8s
test: deps
	@hack/k8s/prebuild.sh start
	@MAKE='$(MAKE)' hack/phases.sh $(filter-out e2e-vm e2e-k8s,$(TEST_PHASES)) e2e-vm+e2e-k8s; rc=$$?; hack/k8s/prebuild.sh stop; exit $$rc

vet:
	@test -z "$$(gofmt -l cmd pkg test)" || { gofmt -l cmd pkg test; echo "gofmt needed"; exit 1; }
	$(GO) vet $(PKGS)

# What this machine provides to the tests (internal/testgate): a test that
# would skip for lack of one of these fails instead. Root, loop devices,
# the tools make deps installs, a pids cgroup, task I/O accounting, ext4's
# error trigger, two CPUs, O_DIRECT in $$TMPDIR and provided-buffer rings;
# not CAP_SYS_RESOURCE (this sandbox withholds it) nor ublk (the VM has it,
# hack/vm/guest/lib.sh). The tests build with the failpoints, test hooks and
# ablation switches the plugin's binary lacks (TEST_TAGS; testgate.Failpoint,
# testgate.Ablation). Override on another machine: make FASTBLK_REQUIRE=root unit.
FASTBLK_REQUIRE ?= root,loop,tools,cgroup,ioacct,ext4error,smp,odirect,bufring,failpoint,ablation
export FASTBLK_REQUIRE
TEST_TAGS := failpoint,ablation

# make test's Go builds compile each package once into one build cache: with
# -trimpath and without cgo, as the static binary, the image and the VM's
# test binaries are built, so go vet, staticcheck, the test binaries and the
# plugin binaries the tests build share every compiled dependency. Only the
# race detector needs cgo (unit, and the VM's race step, which builds as
# unit does).
$(TEST_PHASES): export GOFLAGS := $(strip $(shell $(GO) env GOFLAGS) -trimpath)
$(filter-out unit,$(TEST_PHASES)): export CGO_ENABLED := 0

unit:
	$(GO) test -race -count=1 -tags '$(TEST_TAGS)' $$($(GO) list ./... | grep -v /test/)

# Every fuzz target for FUZZTIME (5s) each; a failing input is saved under
# the package's testdata/fuzz/ and becomes a seed of `make unit`.
FUZZTIME ?= 5s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) hack/fuzz.sh

# The binary as operators run it: serve, CSI over its socket, /metrics, status.
integration:
	$(GO) test -count=1 -timeout 10m ./test/plugin/

sanity:
	mkdir -p $(BIN)
	$(GO) test -count=1 -timeout 30m -v ./test/sanity/ 2>&1 | tee $(BIN)/sanity.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|Ran [0-9]+ of' ; test $${PIPESTATUS[0]} -eq 0

# Real-kernel ublk tests in qemu on Debian's 6.12 and 7.3 kernels.
e2e-vm: static
	hack/vm/e2e.sh

# The user's path on a real two-node Kubernetes built from source
# (hack/k8s): installs and builds what it needs (cached in
# /var/cache/csi-fastblk-k8s), starts the cluster, runs test/k8s and then the
# quick subset of Kubernetes' external storage suite (storage-e2e.test, five
# specs: fs and block volumes, snapshot restore, expansion, capacity), prints
# the time of each phase and tears everything down with a leak check.
e2e-k8s:
	hack/k8s/e2e.sh

# e2e-k8s with the whole external storage suite instead of its quick subset:
# every spec test/k8s/conformance/driver.yaml selects, CONFORMANCE_PROCS (4)
# at once, about 35 minutes here; CONFORMANCE_FOCUS and CONFORMANCE_SKIP narrow
# it (hack/k8s/conformance.sh).
e2e-k8s-conformance:
	E2E_K8S_CONFORMANCE=1 hack/k8s/e2e.sh

# The cluster tests that take half an hour, outside make test: the
# plugin's API token renewed by the kubelet while the plugin runs
# (TestAPITokenRenewal, about 35 minutes with the cluster's start).
e2e-k8s-long:
	FASTBLK_K8S_LONG=1 E2E_K8S_SUITE=0 E2E_K8S_RUN='$(or $(E2E_K8S_RUN),TestAPITokenRenewal)' hack/k8s/e2e.sh

# Tear down a cluster left by E2E_K8S_KEEP=1 or an interrupted run.
e2e-k8s-down:
	hack/k8s/cluster.sh down

# Every benchmark, one markdown report (bin/benchmarks.md; UPDATE_DOCS=1
# also writes docs/benchmarks.md). Hours under TCG; not part of test.
bench bench-scale bench-vm: TAGS = ablation
bench: deps build static
	hack/bench/all.sh

bench-engine: build
	hack/bench/engine.sh

bench-copy: deps static
	hack/bench/copy.sh

bench-scale: static
	hack/vm/bench-scale.sh

bench-vm: static
	hack/vm/bench.sh

chart-test:
	hack/chart/test.sh

# Regenerate the values table of charts/csi-fastblk/README.md from
# values.yaml (chart-test fails when it is stale or a value has no comment).
chart-readme:
	$(GO) run ./hack/chart/valuesdoc charts/csi-fastblk

# Put the upstream snapshot.storage.k8s.io CRDs of the chart's
# csi-snapshotter version and the cbt.storage.k8s.io CRD of its
# csi-snapshot-metadata version, unmodified, into charts/csi-fastblk/crds/.
chart-crds:
	hack/chart/snapshot-crds.sh

# Regenerate deploy/ from the chart.
deploy:
	hack/chart/render-deploy.sh

# The plugin's image for amd64 and arm64, named as the chart's default
# (bin/csi-fastblk-image.oci.tar; docs/image.md imports or pushes it).
image:
	VERSION=$(VERSION) hack/image/build.sh

lint:
	hack/lint.sh

clean:
	rm -rf $(BIN)
