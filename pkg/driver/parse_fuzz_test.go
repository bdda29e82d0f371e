package driver

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// Fuzz targets for everything the driver parses from CSI requests. Each
// states the property it checks; all of them check that nothing panics.
// hack/fuzz.sh runs each for a short while; the seeds here and under
// testdata/fuzz run with every `go test`.

// paramsOf decodes fuzz input into a parameter map: "k=v" pairs separated
// by newlines (a pair without "=" has an empty value).
func paramsOf(s string) map[string]string {
	if s == "" {
		return nil
	}
	p := map[string]string{}
	for _, kv := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(kv, "=")
		p[k] = v
	}
	return p
}

// FuzzParseMaxIOSize: an accepted maxIOSize is a multiple of 4 KiB from
// 4 KiB to the backends' limit, and its plain byte count and (where exact)
// its Ki and Mi forms parse back to it.
func FuzzParseMaxIOSize(f *testing.F) {
	for _, s := range []string{"4096", "512Ki", "1Mi", "128Ki", "4Ki", "0", "-4Ki", "1Gi", "512k", "4097", "08Ki", "+4Ki", " 4Ki", "9223372036854775807Ki"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseMaxIOSize(s)
		if err != nil {
			if n != 0 {
				t.Fatalf("ParseMaxIOSize(%q) = %d with error %v", s, n, err)
			}
			return
		}
		if n < 4096 || n > backend.MaxIOBytesLimit || n%4096 != 0 {
			t.Fatalf("ParseMaxIOSize(%q) = %d, outside the multiples of 4Ki in 4Ki..%d", s, n, backend.MaxIOBytesLimit)
		}
		forms := []string{strconv.Itoa(n), strconv.Itoa(n>>10) + "Ki"}
		if n%(1<<20) == 0 {
			forms = append(forms, strconv.Itoa(n>>20)+"Mi")
		}
		for _, form := range forms {
			if m, err := ParseMaxIOSize(form); err != nil || m != n {
				t.Fatalf("ParseMaxIOSize(%q) = %d; its form %q parses to %d, %v", s, n, form, m, err)
			}
		}
	})
}

// FuzzParseBandwidth: an accepted bandwidth lies in 0..2^50 and its byte
// count parses back to it.
func FuzzParseBandwidth(f *testing.F) {
	for _, s := range []string{"0", "200Mi", "1G", "1k", "1125899906842624", "1125899906842625", "1048576Gi", "-1", "1.5Gi", "Mi", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBandwidth(s)
		if err != nil {
			return
		}
		if n < 0 || n > 1<<50 {
			t.Fatalf("ParseBandwidth(%q) = %d, outside 0..2^50", s, n)
		}
		if m, err := ParseBandwidth(strconv.FormatInt(n, 10)); err != nil || m != n {
			t.Fatalf("ParseBandwidth(%q) = %d; %d parses to %d, %v", s, n, n, m, err)
		}
	})
}

// FuzzStorageClassParams: parameters checkParams accepts give tuning and
// limits in range, and those format back into parameters that parse to the
// same values.
func FuzzStorageClassParams(f *testing.F) {
	for _, s := range []string{
		"", "queues=4\nqueueDepth=128\nmaxIOSize=512Ki", "csi.storage.k8s.io/fstype=xfs",
		"maxIOPS=1000\nmaxBandwidth=200Mi", "queueDepth=3", "queues=0", "queues=4097", "fstype=ext4",
		"csi.storage.k8s.io/pvc/name=x", "maxIOPS=100000001", "maxIOSize=1Gi", "queues=+1", "csi.storage.k8s.io/fstype=btrfs",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := paramsOf(s)
		if checkParams(p) != nil {
			return
		}
		tun, err := tuningFromParams(p)
		if err != nil {
			t.Fatalf("checkParams accepted %q, tuningFromParams refused it: %v", p, err)
		}
		lim, err := limitsFromParams(p)
		if err != nil {
			t.Fatalf("checkParams accepted %q, limitsFromParams refused it: %v", p, err)
		}
		if tun.Queues < 0 || tun.Queues > 4096 || tun.QueueDepth < 0 || tun.QueueDepth > 4096 ||
			tun.QueueDepth&(tun.QueueDepth-1) != 0 || tun.MaxIOBytes%4096 != 0 || tun.MaxIOBytes > backend.MaxIOBytesLimit {
			t.Fatalf("params %q gave tuning %+v out of range", p, tun)
		}
		if lim.IOPS < 0 || lim.IOPS > maxIOPSLimit || lim.BytesPerSecond < 0 || lim.BytesPerSecond > 1<<50 {
			t.Fatalf("params %q gave limits %+v out of range", p, lim)
		}
		if fs, ok := p[ParamFsType]; ok && !supportedFsTypes[fs] {
			t.Fatalf("params %q: fstype %q accepted", p, fs)
		}
		again := map[string]string{}
		for key, v := range map[string]int{ParamQueues: tun.Queues, ParamQueueDepth: tun.QueueDepth, ParamMaxIOSize: tun.MaxIOBytes} {
			if v != 0 {
				again[key] = strconv.Itoa(v)
			}
		}
		again[ParamMaxIOPS] = strconv.FormatInt(lim.IOPS, 10)
		again[ParamMaxBandwidth] = strconv.FormatInt(lim.BytesPerSecond, 10)
		tun2, err := tuningFromParams(again)
		if err != nil || tun2 != tun {
			t.Fatalf("tuning %+v formats to %q, which parses to %+v, %v", tun, again, tun2, err)
		}
		if lim2, err := limitsFromParams(again); err != nil || lim2 != lim {
			t.Fatalf("limits %+v format to %q, which parse to %+v, %v", lim, again, lim2, err)
		}
	})
}

// FuzzMutableParams: mutable parameters (a VolumeAttributesClass) that
// checkMutableParams accepts are rate limits only, parse, and once merged
// into a volume's parameters are what the volume's limits are read from.
func FuzzMutableParams(f *testing.F) {
	for _, s := range []string{"", "maxIOPS=500", "maxBandwidth=1Gi", "maxIOPS=", "maxIOPS=0\nmaxBandwidth=0", "queues=2", "maxIOPS=-1", "maxBandwidth=1Ti"} {
		f.Add(s, "maxIOPS=100\nqueues=2")
	}
	f.Fuzz(func(t *testing.T, s, base string) {
		p := paramsOf(s)
		if checkMutableParams(p) != nil {
			return
		}
		for k := range p {
			if k != ParamMaxIOPS && k != ParamMaxBandwidth {
				t.Fatalf("mutable parameter %q accepted", k)
			}
		}
		want, err := limitsFromParams(p)
		if err != nil {
			t.Fatalf("checkMutableParams accepted %q, limitsFromParams refused it: %v", p, err)
		}
		v := blockdev.Volume{Params: paramsOf(base)}.WithMutableParams(p)
		eff := v.EffectiveParams()
		for k, val := range p {
			if got, ok := eff[k]; val != "" && (!ok || got != val) {
				t.Fatalf("mutable %s=%q: effective parameters have %q", k, val, got)
			}
		}
		if base == "" {
			if got, err := limitsOf(v); err == nil && got != want && !hasEmpty(p) {
				t.Fatalf("volume with mutable %q has limits %+v, want %+v", p, got, want)
			}
		}
	})
}

func hasEmpty(p map[string]string) bool {
	for _, v := range p {
		if v == "" {
			return true
		}
	}
	return false
}

// FuzzSizeFor: a capacity range is either refused with InvalidArgument or
// OutOfRange, or gives a positive multiple of 4 KiB that meets the
// required bytes and stays within the limit.
func FuzzSizeFor(f *testing.F) {
	for _, c := range [][2]int64{{0, 0}, {1, 0}, {4096, 4096}, {1 << 30, 0}, {0, 100}, {5000, 8191}, {-1, 0}, {10, 5},
		{1<<63 - 1, 0}, {1<<63 - 4096, 1<<63 - 1}, {1<<63 - 4095, 0}} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, req, lim int64) {
		size, err := sizeFor(&csi.CapacityRange{RequiredBytes: req, LimitBytes: lim})
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.OutOfRange {
				t.Fatalf("sizeFor(%d, %d): code %v (%v), want InvalidArgument or OutOfRange", req, lim, c, err)
			}
			return
		}
		if size <= 0 || size%sizeAlign != 0 || size < req || (lim > 0 && size > lim) {
			t.Fatalf("sizeFor(required %d, limit %d) = %d", req, lim, size)
		}
	})
}

// fuzzDriver is a driver on the loop backend over a fresh data directory,
// for fuzzing requests through the services' real entry points. Nothing
// here attaches a device.
func fuzzDriver(f *testing.F) (*Driver, string) {
	f.Helper()
	// One log line per created volume would cost more than the request.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	f.Cleanup(func() { klog.LogToStderr(true) })
	// In /dev/shm where there is one: the store's fsyncs cost more on a
	// disk than the rest of a request.
	dir, err := os.MkdirTemp("/dev/shm", "fastblk-fuzz-")
	if err != nil {
		dir = f.TempDir()
	} else {
		f.Cleanup(func() { os.RemoveAll(dir) })
	}
	store, err := store.Open(store.Config{Dir: filepath.Join(dir, "data"), OverProvisionRatio: 1})
	if err != nil {
		f.Fatal(err)
	}
	b, err := backend.New("loop", backend.Config{DataDir: filepath.Join(dir, "data"), DevDir: filepath.Join(dir, "dev")})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { b.Close() })
	d, err := New(Config{Name: "fastblk.csi.io", NodeID: "n1"}, store, b)
	if err != nil {
		f.Fatal(err)
	}
	return d, dir
}

// clientCodes are the codes a request the driver refuses may carry: the
// caller's mistake or the node's state, never Internal or Unknown.
var clientCodes = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.OutOfRange: true, codes.NotFound: true, codes.AlreadyExists: true,
	codes.ResourceExhausted: true, codes.FailedPrecondition: true,
}

// FuzzCreateVolume sends CreateVolume requests built from fuzz input to a
// driver on a temporary data directory: each is refused with a client
// error code, or creates a volume whose ID is well formed, whose size
// meets the range, whose files lie in the data directory, and which
// ControllerModifyVolume with the same mutable parameters and
// DeleteVolume then accept.
func FuzzCreateVolume(f *testing.F) {
	f.Add("pvc-1", int64(1<<20), int64(0), "queues=2\nmaxIOPS=100", "maxBandwidth=10Mi", "", false, int32(1), "")
	f.Add("pvc-2", int64(0), int64(8192), "csi.storage.k8s.io/fstype=xfs", "", "xfs", false, int32(7), "")
	f.Add("../../etc/passwd", int64(4096), int64(0), "", "", "", true, int32(1), "")
	f.Add("pvc-3", int64(4096), int64(0), "", "", "", false, int32(1), "s0123456789abcdef0123456789abcdef")
	f.Add("pvc-4", int64(1<<63-1), int64(0), "", "", "ext4", false, int32(1), "")
	f.Add("\xff", int64(1), int64(1), "queueDepth=7", "queues=1", "btrfs", false, int32(5), "../x")
	d, dir := fuzzDriver(f)
	ctrl := &Controller{d: d}
	data := filepath.Join(dir, "data")
	f.Fuzz(func(t *testing.T, name string, req, lim int64, params, mutable, fsType string, block bool, mode int32, snapshot string) {
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_Mode(mode)}}
		if block {
			c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		} else {
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}}
		}
		r := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: req, LimitBytes: lim},
			VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: paramsOf(params), MutableParameters: paramsOf(mutable)}
		if snapshot != "" {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshot}}}
		}
		ctx := context.Background()
		resp, err := ctrl.CreateVolume(ctx, r)
		if err != nil {
			if !clientCodes[status.Code(err)] {
				t.Fatalf("CreateVolume(%q): code %v: %v", name, status.Code(err), err)
			}
			return
		}
		v := resp.GetVolume()
		id := v.GetVolumeId()
		if id != d.publicID(blockdev.VolumeID(name)) {
			t.Fatalf("CreateVolume(%q) returned id %q", name, id)
		}
		size := v.GetCapacityBytes()
		if size <= 0 || size%sizeAlign != 0 || size < req || (lim > 0 && size > lim) {
			t.Fatalf("CreateVolume(%q, required %d, limit %d) made %d bytes", name, req, lim, size)
		}
		if _, err := os.Stat(filepath.Join(data, "volumes", storeVolumeID(id)+".img")); err != nil {
			t.Fatalf("volume %s has no data file in the data directory: %v", id, err)
		}
		if _, err := ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: paramsOf(mutable)}); err != nil {
			t.Fatalf("ControllerModifyVolume(%s) with the parameters it was created with: %v", id, err)
		}
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume(%s): %v", id, err)
		}
		if n := len(d.store.Volumes()); n != 0 {
			t.Fatalf("%d volumes left after DeleteVolume", n)
		}
	})
}

// FuzzVolumeIDs sends volume and snapshot IDs from fuzz input to every
// RPC that takes one, on an empty data directory: each answers NotFound
// (or success, for the deletes and for unknown IDs where the spec says so)
// or InvalidArgument, and no file appears outside the data directory's
// own layout.
func FuzzVolumeIDs(f *testing.F) {
	for _, id := range []string{"v0123456789abcdef0123456789abcdef", "s0123456789abcdef0123456789abcdef", "", "../..", "v/../../x",
		"V0123456789ABCDEF0123456789ABCDEF", "v0123456789abcdef0123456789abcdeg", "\x00", strings.Repeat("v", 200)} {
		f.Add(id)
	}
	d, dir := fuzzDriver(f)
	ctrl := &Controller{d: d}
	before := listTree(f, dir)
	f.Fuzz(func(t *testing.T, id string) {
		ctx := context.Background()
		calls := []struct {
			name string
			call func() error
		}{
			{"DeleteVolume", func() error { _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); return err }},
			{"DeleteSnapshot", func() error {
				_, err := ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
				return err
			}},
			{"ControllerGetVolume", func() error {
				_, err := ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
				return err
			}},
			{"ControllerModifyVolume", func() error {
				_, err := ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
					MutableParameters: map[string]string{ParamMaxIOPS: "10"}})
				return err
			}},
			{"CreateSnapshot", func() error {
				_, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "snap"})
				return err
			}},
			{"ListSnapshots", func() error {
				_, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: id, SnapshotId: id})
				return err
			}},
		}
		for _, c := range calls {
			if err := c.call(); err != nil && !clientCodes[status.Code(err)] {
				t.Fatalf("%s(%q): code %v: %v", c.name, id, status.Code(err), err)
			}
		}
		if after := listTree(t, dir); after != before {
			t.Fatalf("requests for id %q changed the directory:\nbefore %s\nafter  %s", id, before, after)
		}
	})
}

// FuzzSnapshotName snapshots a volume under names from fuzz input: each
// request is refused with a client error code, or makes a snapshot whose
// ID is the one derived from the name, whose size is the volume's, and
// which DeleteSnapshot removes.
func FuzzSnapshotName(f *testing.F) {
	for _, name := range []string{"snap-1", "", "../../etc", "\xff\xfe", strings.Repeat("s", 129), "a/b", "\x00"} {
		f.Add(name)
	}
	d, _ := fuzzDriver(f)
	ctrl := &Controller{d: d}
	ctx := context.Background()
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "source", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil {
		f.Fatal(err)
	}
	src := vol.GetVolume().GetVolumeId()
	f.Fuzz(func(t *testing.T, name string) {
		resp, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: src, Name: name})
		if err != nil {
			if !clientCodes[status.Code(err)] {
				t.Fatalf("CreateSnapshot(%q): code %v: %v", name, status.Code(err), err)
			}
			return
		}
		sn := resp.GetSnapshot()
		if sn.GetSnapshotId() != d.publicID(blockdev.SnapshotID(name)) || sn.GetSourceVolumeId() != src || sn.GetSizeBytes() != 1<<20 {
			t.Fatalf("CreateSnapshot(%q) = %v", name, sn)
		}
		if _, err := ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
			t.Fatalf("DeleteSnapshot(%s): %v", sn.GetSnapshotId(), err)
		}
	})
}

// FuzzNodePaths sends NodeStage, NodePublish, NodeUnpublish and
// NodeUnstage requests with paths, mount flags and a filesystem type from
// fuzz input, for a volume that does not exist: each is refused with a
// client error code and creates nothing, wherever its paths point.
func FuzzNodePaths(f *testing.F) {
	f.Add("/staging", "/target", "ext4", "ro\nnoexec", false)
	f.Add("relative", "/a/../b", "", "rw", true)
	f.Add("/a//b", "/x\x00y", "xfs", "", false)
	f.Add("/", "/", "btrfs", "bind,rw", true)
	d, dir := fuzzDriver(f)
	node := &Node{d: d}
	id := blockdev.VolumeID("no-such-volume")
	before := listTree(f, dir)
	f.Fuzz(func(t *testing.T, staging, target, fsType, flags string, readonly bool) {
		// Paths the fuzzer makes relative to the test directory, so that
		// anything created by mistake is seen (and cleaned up).
		staging, target = dir+"/"+staging, dir+"/"+target
		var mountFlags []string
		if flags != "" {
			mountFlags = strings.Split(flags, "\n")
		}
		c := &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: mountFlags}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
		ctx := context.Background()
		errs := map[string]error{}
		_, errs["NodeStageVolume"] = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c})
		_, errs["NodePublishVolume"] = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: c, Readonly: readonly})
		_, errs["NodeUnpublishVolume"] = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		_, errs["NodeUnstageVolume"] = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		for rpc, err := range errs {
			if err != nil && !clientCodes[status.Code(err)] {
				t.Fatalf("%s(staging %q, target %q): code %v: %v", rpc, staging, target, status.Code(err), err)
			}
		}
		for _, rpc := range []string{"NodeStageVolume", "NodePublishVolume"} {
			if errs[rpc] == nil {
				t.Fatalf("%s of a volume that does not exist succeeded", rpc)
			}
		}
		if after := listTree(t, dir); after != before {
			t.Fatalf("requests for a missing volume changed the directory:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// listTree returns the paths under dir, one per line.
func listTree(tb testing.TB, dir string) string {
	tb.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p)
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b.String()
}
