package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/fsstat"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/mountinfo"
)

const (
	hDataLoss = csi.VolumeHealthErrorType_DATA_LOSS
	hInacc    = csi.VolumeHealthErrorType_INACCESSIBLE
	hDegraded = csi.VolumeHealthErrorType_DEGRADED
)

// want is one expected entry: its status, reason, and words its message
// must contain.
type want struct {
	status csi.VolumeHealthErrorType
	reason string
	words  []string
}

func checkEntries(t *testing.T, got []*volumeEntry, wants ...want) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range got {
		key := e.GetStatus().String() + "/" + e.GetReason()
		if seen[key] {
			t.Errorf("(status, reason) %s repeated", key)
		}
		seen[key] = true
	}
	if len(got) != len(wants) {
		t.Fatalf("got %d entries %v, want %d %v", len(got), got, len(wants), wants)
	}
	for i, w := range wants {
		e := got[i]
		if e.GetStatus() != w.status || e.GetReason() != w.reason {
			t.Errorf("entry %d = %s/%s, want %s/%s", i, e.GetStatus(), e.GetReason(), w.status, w.reason)
		}
		for _, word := range w.words {
			if !strings.Contains(e.GetMessage(), word) {
				t.Errorf("entry %d message %q lacks %q", i, e.GetMessage(), word)
			}
		}
	}
}

const (
	hFile    = "/data/volumes/v1.img"
	hStaging = "/k/staging/v1"
	hTarget  = "/k/pods/p1/v1"
	hLink    = "/dev/fastblk/v1"
	hDev     = "/dev/loop3"
)

// stagedVolume is a volume staged for mount access and published at hTarget.
func stagedVolume(block bool) blockdev.Volume {
	return blockdev.Volume{ID: "v1", SizeBytes: 1 << 20, Node: blockdev.NodeState{
		StagingPath: hStaging, Block: block, FsType: "ext4", Device: hLink,
		Targets: map[string]blockdev.Publish{hTarget: {}},
	}}
}

// healthyFacts is what the node sees of stagedVolume when all is well.
func healthyFacts() nodeFacts {
	rw := []string{"rw", "relatime"}
	return nodeFacts{
		file:    fileFacts{path: hFile, size: 1 << 20},
		backend: "loop",
		device:  &blockdev.Device{VolumeID: "v1", Path: hDev, Link: hLink},
		devNum:  "7:3",
		link:    hDev,
		mounts: map[string]mountinfo.MountInfo{
			hStaging: {MountPoint: hStaging, Major: 7, Minor: 3, Source: hDev, FsType: "ext4", MountOptions: rw, SuperOptions: []string{"rw"}},
			hTarget:  {MountPoint: hTarget, Major: 7, Minor: 3, Source: hDev, FsType: "ext4", MountOptions: rw, SuperOptions: []string{"rw"}},
		},
	}
}

func TestNodeVolumeHealth(t *testing.T) {
	roSuper := func(f *nodeFacts) {
		m := f.mounts[hStaging]
		m.SuperOptions = []string{"ro", "errors=remount-ro"}
		f.mounts[hStaging] = m
	}
	for _, tc := range []struct {
		name  string
		vol   func(*blockdev.Volume)
		facts func(*nodeFacts)
		want  []want
	}{
		{name: "healthy mount"},
		{name: "healthy block", vol: func(v *blockdev.Volume) { v.Node.Block = true },
			facts: func(f *nodeFacts) { delete(f.mounts, hStaging) }},
		{name: "not staged", vol: func(v *blockdev.Volume) { v.Node = blockdev.NodeState{} }, facts: func(f *nodeFacts) { f.device = nil }},
		{name: "asked about a staging path it is not staged at", vol: func(v *blockdev.Volume) { v.Node = blockdev.NodeState{} },
			facts: func(f *nodeFacts) { f.staging = "/k/other" },
			want:  []want{{hInacc, reasonNotStaged, []string{"not staged", "/k/other"}}}},
		{name: "staged elsewhere", facts: func(f *nodeFacts) { f.staging = "/k/other" },
			want: []want{{hInacc, reasonNotStaged, []string{hStaging, "/k/other"}}}},
		{name: "asked about an unpublished target", facts: func(f *nodeFacts) { f.target = "/k/pods/p2/v1" },
			want: []want{{hInacc, reasonNotPublished, []string{"/k/pods/p2/v1"}}}},
		{name: "backing file missing", facts: func(f *nodeFacts) { f.file.err = &fs.PathError{Op: "stat", Path: hFile, Err: fs.ErrNotExist} },
			want: []want{{hDataLoss, reasonFileMissing, []string{hFile}}}},
		{name: "backing file unreadable", facts: func(f *nodeFacts) { f.file.err = fs.ErrPermission },
			want: []want{{hInacc, reasonFileUnreadable, []string{hFile, "permission denied"}}}},
		{name: "backing file truncated", facts: func(f *nodeFacts) { f.file.size = 4096 },
			want: []want{{hDataLoss, reasonFileTruncated, []string{hFile, "4096", "1048576"}}}},
		{name: "backing file larger than the record", facts: func(f *nodeFacts) { f.file.size = 2 << 20 },
			want: []want{{hDegraded, reasonSizeMismatch, []string{hFile, "2097152", "1048576"}}}},
		{name: "backend does not list", facts: func(f *nodeFacts) { f.device, f.listErr = nil, errors.New("server gone") },
			want: []want{{hInacc, reasonBackendDown, []string{"loop", "server gone"}}}},
		{name: "device held: its state lost, record and kernel disagree", facts: func(f *nodeFacts) {
			f.device, f.held = nil, errors.New("volume v1: device 3 has 2097152 bytes, the volume 1048576: the volume's record and its device disagree")
		},
			want: []want{{hInacc, reasonDeviceHeld, []string{hStaging, "held", "device 3 has 2097152 bytes", "operator"}}}},
		{name: "device held, unserved devices failing their i/o", facts: func(f *nodeFacts) {
			f.device, f.held = nil, fmt.Errorf("volume v1: no device is recorded with the volume; ublk devices that no record names fail their i/o: /dev/ublkb3 since 2026-12-07T12:00:00Z (%w)", blockdev.ErrFailingIO)
		},
			want: []want{{hInacc, reasonDeviceFailing, []string{hStaging, "EIO", "/dev/ublkb3", "restart the plugin"}}}},
		{name: "device gone", facts: func(f *nodeFacts) { f.device = nil },
			want: []want{{hInacc, reasonDeviceMissing, []string{hStaging, hLink}}}},
		{name: "device recovering", facts: func(f *nodeFacts) { f.state = "recovering" },
			want: []want{{hDegraded, reasonDeviceState, []string{hDev, "recovering"}}}},
		{name: "device dead", facts: func(f *nodeFacts) { f.state = "dead" },
			want: []want{{hInacc, reasonDeviceState, []string{hDev, "dead"}}}},
		{name: "link missing", facts: func(f *nodeFacts) { f.link, f.linkErr = "", fs.ErrNotExist },
			want: []want{{hInacc, reasonLinkBroken, []string{hLink, "not exist"}}}},
		{name: "link points elsewhere", facts: func(f *nodeFacts) { f.link = "/dev/loop9" },
			want: []want{{hInacc, reasonLinkBroken, []string{hLink, "/dev/loop9", hDev}}}},
		{name: "no link recorded", vol: func(v *blockdev.Volume) { v.Node.Device = hDev }, facts: func(f *nodeFacts) { f.link = "" }},
		{name: "staging unmounted", facts: func(f *nodeFacts) { delete(f.mounts, hStaging) },
			want: []want{{hInacc, reasonStagingUnmount, []string{hStaging}}}},
		{name: "staging holds another device", facts: func(f *nodeFacts) {
			m := f.mounts[hStaging]
			m.Minor, m.Source = 4, "/dev/loop4"
			f.mounts[hStaging] = m
		}, want: []want{{hInacc, reasonStagingWrongDev, []string{hStaging, "/dev/loop4", "7:4", "7:3"}}}},
		{name: "filesystem read-only after errors", facts: roSuper,
			want: []want{{hDegraded, reasonFilesystemRO, []string{hStaging, "errors=remount-ro"}}}},
		{name: "read-only filesystem staged without targets", vol: func(v *blockdev.Volume) { v.Node.Targets = nil },
			facts: roSuper, want: []want{{hDegraded, reasonFilesystemRO, []string{hStaging}}}},
		{name: "read-only filesystem published read-only only", facts: roSuper,
			vol: func(v *blockdev.Volume) { v.Node.Targets[hTarget] = blockdev.Publish{ReadOnly: true} }},
		{name: "filesystem errors recorded", facts: func(f *nodeFacts) {
			f.fsErrors = fsstat.ErrorRecord{Count: 2, LastFunc: "ext4_lookup", LastTime: time.Unix(1700000000, 0).UTC()}
		}, want: []want{{hDegraded, reasonFilesystemErr, []string{hStaging, hDev, "2 error", "ext4_lookup", "2023-11-14T22:13:20Z", "e2fsck"}}}},
		{name: "read-only after errors, both reported", facts: func(f *nodeFacts) { roSuper(f); f.fsErrors.Count = 1 },
			want: []want{{hDegraded, reasonFilesystemRO, nil}, {hDegraded, reasonFilesystemErr, nil}}},
		{name: "targets unmounted, one entry", vol: func(v *blockdev.Volume) { v.Node.Targets["/k/pods/p0/v1"] = blockdev.Publish{} },
			facts: func(f *nodeFacts) { delete(f.mounts, hTarget) },
			want:  []want{{hInacc, reasonTargetUnmount, []string{"/k/pods/p0/v1, " + hTarget}}}},
		{name: "several faults at once", facts: func(f *nodeFacts) { f.file.size = 0; delete(f.mounts, hStaging) },
			want: []want{{hDataLoss, reasonFileTruncated, nil}, {hInacc, reasonStagingUnmount, nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, f := stagedVolume(false), healthyFacts()
			if tc.vol != nil {
				tc.vol(&v)
			}
			if tc.facts != nil {
				tc.facts(&f)
			}
			checkEntries(t, nodeVolumeHealth(v, f), tc.want...)
		})
	}
}

func TestStorageHealth(t *testing.T) {
	const (
		sDegraded = csi.StorageHealthErrorType_STORAGE_DEGRADED
		sUnreach  = csi.StorageHealthErrorType_STORAGE_UNREACHABLE
	)
	type w struct {
		status csi.StorageHealthErrorType
		reason string
	}
	ok := fsstat.Stats{TotalBytes: 1000, AvailableBytes: 500}
	for _, tc := range []struct {
		name string
		f    storageFacts
		want []w
	}{
		{"healthy", storageFacts{stats: ok}, nil},
		{"exactly at the threshold", storageFacts{stats: fsstat.Stats{TotalBytes: 1000, AvailableBytes: 50}}, nil},
		{"low space", storageFacts{stats: fsstat.Stats{TotalBytes: 1000, AvailableBytes: 49}}, []w{{sDegraded, reasonLowSpace}}},
		{"data directory gone", storageFacts{statErr: fs.ErrNotExist}, []w{{sUnreach, reasonDataDirGone}}},
		{"read-only", storageFacts{stats: fsstat.Stats{TotalBytes: 1000, AvailableBytes: 500, ReadOnly: true}},
			[]w{{sDegraded, reasonDataDirRO}}},
		{"probe fails", storageFacts{stats: ok, probeErr: errors.New("EIO")}, []w{{sDegraded, reasonDataDirNoWrite}}},
		{"backend down", storageFacts{stats: ok, listErr: errors.New("gone")}, []w{{sUnreach, reasonBackendDown}}},
		{"everything", storageFacts{stats: fsstat.Stats{TotalBytes: 1000, ReadOnly: true}, listErr: errors.New("gone")},
			[]w{{sDegraded, reasonDataDirRO}, {sDegraded, reasonLowSpace}, {sUnreach, reasonBackendDown}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.dir, tc.f.backend = "/data", "loop"
			got := storageHealth(tc.f)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i, e := range got {
				if e.GetStatus() != tc.want[i].status || e.GetReason() != tc.want[i].reason || !strings.Contains(e.GetMessage(), "/data") && e.GetReason() != reasonBackendDown {
					t.Errorf("entry %d = %v, want %v naming /data", i, e, tc.want[i])
				}
			}
		})
	}
}

// healthCmd runs a command the test needs to break things behind the
// driver's back.
func healthCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (n *testNode) nodeHealth(id string) []*volumeEntry {
	n.t.Helper()
	resp, err := n.node.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		n.t.Fatalf("NodeGetVolumeHealth(%s): %v", id, err)
	}
	if resp.GetVolumeHealth().GetVolumeId() != id {
		n.t.Fatalf("health for %q, want %q", resp.GetVolumeHealth().GetVolumeId(), id)
	}
	return resp.GetVolumeHealth().GetHealthStatuses()
}

func (n *testNode) controllerHealth(id string) []*volumeEntry {
	n.t.Helper()
	resp, err := n.ctrl.ControllerGetVolumeHealth(context.Background(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		n.t.Fatalf("ControllerGetVolumeHealth(%s): %v", id, err)
	}
	return resp.GetVolumeHealth().GetHealthStatuses()
}

// listedHealth returns the IDs ControllerListVolumeHealth reports, one
// entry per page to exercise the token.
func (n *testNode) listedHealth() []string {
	n.t.Helper()
	var ids []string
	token := ""
	for {
		resp, err := n.ctrl.ControllerListVolumeHealth(context.Background(),
			&csi.ControllerListVolumeHealthRequest{MaxEntries: 1, StartingToken: token})
		if err != nil {
			n.t.Fatalf("ControllerListVolumeHealth: %v", err)
		}
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolumeId())
		}
		if token = resp.GetNextToken(); token == "" {
			return ids
		}
	}
}

// TestVolumeHealthSeesRealFaults stages real volumes, proves they report
// healthy, then breaks them for real: read-only remount and unmounts behind
// the driver's back, a truncated backing file, a hijacked device link and
// a detached device.
func TestVolumeHealthSeesRealFaults(t *testing.T) {
	requireRoot(t)
	n := newTestNode(t, t.TempDir())
	ctx := context.Background()
	fsID := n.create("health-fs", 32<<20, nil)
	target := n.stage(fsID, mountCap("ext4", snw), false)
	blkID := n.create("health-blk", 16<<20, nil)
	n.stage(blkID, blockCap(snw), false)
	staging := filepath.Join(n.dir, "staging-"+fsID)

	t.Run("healthy", func(t *testing.T) {
		for _, id := range []string{fsID, blkID} {
			checkEntries(t, n.nodeHealth(id))
			checkEntries(t, n.controllerHealth(id))
		}
		if ids := n.listedHealth(); len(ids) != 0 {
			t.Fatalf("abnormal volumes listed: %v", ids)
		}
	})
	t.Run("requests", func(t *testing.T) {
		_, err := n.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "nope"})
		_, cerr := n.ctrl.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: "nope"})
		_, perr := n.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: fsID, StagingTargetPath: "rel/x"})
		_, lerr := n.ctrl.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: "9"})
		for _, c := range []struct {
			err  error
			code codes.Code
		}{{err, codes.NotFound}, {cerr, codes.NotFound}, {perr, codes.InvalidArgument}, {lerr, codes.Aborted}} {
			if status.Code(c.err) != c.code {
				t.Errorf("got %v, want %s", c.err, c.code)
			}
		}
		resp, err := n.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: fsID,
			StagingTargetPath: "/elsewhere", VolumePublishPath: target})
		if err != nil {
			t.Fatal(err)
		}
		checkEntries(t, resp.GetVolumeHealth().GetHealthStatuses(), want{hInacc, reasonNotStaged, []string{staging, "/elsewhere"}})
	})
	t.Run("filesystem remounted read-only", func(t *testing.T) {
		healthCmd(t, "mount", "-o", "remount,ro", staging)
		checkEntries(t, n.nodeHealth(fsID), want{hDegraded, reasonFilesystemRO, []string{staging, "ext4"}})
		healthCmd(t, "mount", "-o", "remount,rw", staging)
		checkEntries(t, n.nodeHealth(fsID))
	})
	t.Run("backing file truncated", func(t *testing.T) {
		file := n.d.store.VolumeFile(storeVolumeID(blkID))
		if err := os.Truncate(file, 8<<20); err != nil {
			t.Fatal(err)
		}
		w := want{hDataLoss, reasonFileTruncated, []string{file, fmt.Sprint(8 << 20)}}
		checkEntries(t, n.nodeHealth(blkID), w)
		checkEntries(t, n.controllerHealth(blkID), w)
		if ids := n.listedHealth(); len(ids) != 1 || ids[0] != blkID {
			t.Fatalf("listed %v, want [%s]", ids, blkID)
		}
		if err := os.Truncate(file, 16<<20); err != nil {
			t.Fatal(err)
		}
		checkEntries(t, n.controllerHealth(blkID))
	})
	t.Run("device link hijacked", func(t *testing.T) {
		v, _ := n.d.store.Volume(storeVolumeID(blkID))
		dev, err := filepath.EvalSymlinks(v.Node.Device)
		if err != nil {
			t.Fatal(err)
		}
		relink(t, v.Node.Device, "/dev/null")
		checkEntries(t, n.nodeHealth(blkID), want{hInacc, reasonLinkBroken, []string{v.Node.Device, "/dev/null", dev}})
		relink(t, v.Node.Device, dev)
		checkEntries(t, n.nodeHealth(blkID))
	})
	t.Run("device detached", func(t *testing.T) {
		if err := n.backend.Detach(ctx, storeVolumeID(blkID)); err != nil {
			t.Fatal(err)
		}
		checkEntries(t, n.nodeHealth(blkID), want{hInacc, reasonDeviceMissing, []string{"loop"}})
		if err := n.d.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		checkEntries(t, n.nodeHealth(blkID))
	})
	t.Run("filesystem error recorded", func(t *testing.T) {
		mounts, err := mountinfo.MountsAt(staging)
		if err != nil || mounts[staging].FsType != "ext4" {
			t.Fatalf("staging mount: %v, %v", mounts, err)
		}
		dev := filepath.Base(mounts[staging].Source)
		err = os.WriteFile("/sys/fs/ext4/"+dev+"/trigger_fs_error", []byte("health test"), 0)
		if errors.Is(err, os.ErrNotExist) { // a kernel without the attribute
			testgate.Skip(t, testgate.Ext4Error, "cannot inject an ext4 error: %v", err)
		}
		if err != nil {
			t.Fatalf("inject an ext4 error: %v", err)
		}
		// ext4 records the error from a work item; poll for it.
		w := want{hDegraded, reasonFilesystemErr, []string{staging, dev, "1 error", "e2fsck"}}
		for deadline := time.Now().Add(10 * time.Second); ; <-time.After(10 * time.Millisecond) {
			if got := n.nodeHealth(fsID); len(got) > 0 || time.Now().After(deadline) {
				checkEntries(t, got, w)
				break
			}
		}
	})
	t.Run("staging and target unmounted", func(t *testing.T) {
		healthCmd(t, "umount", staging)
		checkEntries(t, n.nodeHealth(fsID), want{hInacc, reasonStagingUnmount, []string{staging}})
		healthCmd(t, "umount", target)
		checkEntries(t, n.nodeHealth(fsID), want{hInacc, reasonStagingUnmount, []string{staging}},
			want{hInacc, reasonTargetUnmount, []string{target}})
	})
}

func relink(t *testing.T, link, to string) {
	t.Helper()
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(to, link); err != nil {
		t.Fatal(err)
	}
}

// TestStorageHealthSeesRealFaults runs the driver on a small tmpfs data
// directory, fills it past the threshold and remounts it read-only.
func TestStorageHealthSeesRealFaults(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	healthCmd(t, "mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", data)
	t.Cleanup(func() { healthCmd(t, "umount", data) })
	n := newTestNode(t, dir)
	check := func(reasons ...string) {
		t.Helper()
		resp, err := n.node.NodeGetStorageHealth(context.Background(), &csi.NodeGetStorageHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range resp.GetBackendHealth() {
			got = append(got, e.GetReason())
			if !strings.Contains(e.GetMessage(), data) {
				t.Errorf("message %q does not name %s", e.GetMessage(), data)
			}
		}
		if strings.Join(got, ",") != strings.Join(reasons, ",") {
			t.Fatalf("storage health %v, want %v", resp.GetBackendHealth(), reasons)
		}
	}
	check()
	fill := filepath.Join(data, "fill")
	if err := os.WriteFile(fill, make([]byte, 31<<18), 0o600); err != nil { // 7.75 MiB of 8
		t.Fatal(err)
	}
	check(reasonLowSpace)
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	healthCmd(t, "mount", "-o", "remount,ro", data)
	check(reasonDataDirRO)
	healthCmd(t, "mount", "-o", "remount,rw", data)
	check()
}
