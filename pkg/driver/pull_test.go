package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// writeExtents writes data at each [offset, length) of extents into the
// volume id's file on n (not in use: no device).
func (n *testNode) writeExtents(id string, extents [][2]int64) {
	n.t.Helper()
	for i, e := range extents {
		testfs.WriteAt(n.t, n.d.store.VolumeFile(storeVolumeID(id)), e[0], int(e[1]), byte(i+1))
	}
}

// source makes on n a volume of size bytes with data at extents and a
// snapshot of it, and returns their IDs.
func (n *testNode) source(size int64, extents [][2]int64) (vol, snap string) {
	n.t.Helper()
	vol = n.create("pvc-src", size, nil)
	n.writeExtents(vol, extents)
	return vol, n.snapshot("snap-src", vol)
}

func (n *testNode) snapshot(name, vol string) string {
	n.t.Helper()
	resp, err := n.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
	if err != nil {
		n.t.Fatalf("snapshot %s of %s: %v", name, vol, err)
	}
	return resp.GetSnapshot().GetSnapshotId()
}

// file is the data file of n's volume or snapshot id.
func (n *testNode) file(id string) string {
	storeID, _ := splitID(id)
	if blockdev.IsSnapshotID(storeID) {
		st, _ := n.d.store.of(storeID)
		return filepath.Join(st.Dir(), "snapshots", storeID+blockdev.ImageSuffix)
	}
	return n.d.store.VolumeFile(storeID)
}

func fileSum(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// dataFiles lists what n's data directory holds below volumes/,
// snapshots/ and meta/.
func (n *testNode) dataFiles() string {
	var names []string
	for _, sub := range []string{"volumes", "snapshots", "meta"} {
		filepath.WalkDir(filepath.Join(n.d.store.def.Dir(), sub), func(p string, _ fs.DirEntry, _ error) error {
			names = append(names, p)
			return nil
		})
	}
	return strings.Join(names, "\n")
}

// createFrom asks n for the volume name of size bytes from src with the
// class parameters params, within timeout.
func (n *testNode) createFrom(name string, size int64, src *csi.VolumeContentSource, params map[string]string, timeout time.Duration) (*csi.Volume, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, VolumeContentSource: src})
	return resp.GetVolume(), err
}

// createPulled is createFrom retried while it answers Aborted (a copy
// still running), as the external-provisioner retries, until timeout.
func (n *testNode) createPulled(name string, size int64, src *csi.VolumeContentSource, params map[string]string, timeout time.Duration) (*csi.Volume, error) {
	end := time.Now().Add(timeout)
	for {
		v, err := n.createFrom(name, size, src, params, time.Until(end))
		if status.Code(err) != codes.Aborted || time.Now().After(end) {
			return v, err
		}
	}
}

// TestPullSnapshotAcrossNodes: a restore on n2 of n1's snapshot pulls its
// data over the peer channel: the new volume is n2's, of the snapshot's
// size, with the same bytes, and takes no more disk than the snapshot
// (holes stay holes); a repeated call answers the same without a copy;
// the snapshot is unchanged. Before, n2 answered ResourceExhausted.
func TestPullSnapshotAcrossNodes(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	_, snap := n1.source(64<<20, [][2]int64{{0, 64 << 10}, {5 << 20, 3 << 20}, {60 << 20, 1 << 20}})
	before := fileSum(t, n1.file(snap))

	for i := range 2 {
		v, err := n2.createFrom("pvc-restore", 64<<20, snapshotSource(snap), nil, time.Minute)
		if err != nil {
			t.Fatalf("restore %d of n1's snapshot on n2: %v", i, err)
		}
		if !strings.HasSuffix(v.GetVolumeId(), "-n2") || v.GetCapacityBytes() != 64<<20 ||
			v.GetContentSource().GetSnapshot().GetSnapshotId() != snap || v.GetAccessibleTopology()[0].GetSegments()[TopologyKey] != "n2" {
			t.Fatalf("restore %d: %v", i, v)
		}
		if got := fileSum(t, n2.file(v.GetVolumeId())); got != before {
			t.Fatalf("restore %d: the data differs from the snapshot's", i)
		}
	}
	id := n2.d.publicID(blockdev.VolumeID("pvc-restore"))
	if b, sb := testfs.Allocated(t, n2.file(id)), testfs.Allocated(t, n1.file(snap)); b > sb || b > 5<<20 {
		t.Errorf("the restored volume takes %d bytes of disk, the snapshot %d: holes were filled", b, sb)
	}
	got, err := n2.ctrl.ControllerGetVolume(context.Background(), &csi.ControllerGetVolumeRequest{VolumeId: id})
	if err != nil || got.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId() != snap {
		t.Errorf("ControllerGetVolume of the restored volume: %v, %v; want its source %s", got, err, snap)
	}
	if fileSum(t, n1.file(snap)) != before {
		t.Error("the source snapshot changed")
	}
	if _, err := n2.createFrom("pvc-restore", 64<<20, snapshotSource(snap), map[string]string{ParamPreallocation: "full"}, time.Minute); status.Code(err) != codes.AlreadyExists {
		t.Errorf("restore again with other parameters: %v, want AlreadyExists", err)
	}
	if _, err := n2.createFrom("pvc-small", 32<<20, snapshotSource(snap), nil, time.Minute); status.Code(err) != codes.OutOfRange {
		t.Errorf("restore into a volume smaller than the snapshot: %v, want OutOfRange", err)
	}
	full, err := n2.createFrom("pvc-full", 64<<20, snapshotSource(snap), map[string]string{ParamPreallocation: "full"}, time.Minute)
	if err != nil || fileSum(t, n2.file(full.GetVolumeId())) != before || testfs.Allocated(t, n2.file(full.GetVolumeId())) < 64<<20 {
		t.Errorf("a preallocated restore: %v, %v; want the snapshot's data in a file allocated all through", full, err)
	}
	_, err = n2.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-limited", CapacityRange: &csi.CapacityRange{LimitBytes: 32 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}, VolumeContentSource: snapshotSource(snap)})
	if status.Code(err) != codes.OutOfRange {
		t.Errorf("restore with a limit below the snapshot's size: %v, want OutOfRange", err)
	}
}

// TestPullCloneAcrossNodes: a clone on n2 of n1's volume pulls a
// point-in-time copy n1 takes for it; nothing of that copy is left on n1
// and n1's volume is unchanged.
func TestPullCloneAcrossNodes(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	vol := n1.create("pvc-src", 32<<20, nil)
	n1.writeExtents(vol, [][2]int64{{1 << 20, 2 << 20}, {31 << 20, 1 << 20}})
	before, files := fileSum(t, n1.file(vol)), n1.dataFiles()

	v, err := n2.createFrom("pvc-clone", 32<<20, volumeSource(vol), map[string]string{ParamTransferRate: "0"}, time.Minute)
	if err != nil {
		t.Fatalf("clone of n1's volume on n2: %v", err)
	}
	if v.GetCapacityBytes() != 32<<20 || v.GetContentSource().GetVolume().GetVolumeId() != vol {
		t.Fatalf("clone: %v", v)
	}
	if fileSum(t, n2.file(v.GetVolumeId())) != before || fileSum(t, n1.file(vol)) != before {
		t.Error("the clone differs from its source, or the source changed")
	}
	if now := n1.dataFiles(); now != files {
		t.Errorf("n1's data directory changed:\n%s\nwas\n%s", now, files)
	}
}

// flipBits is n1's server corrupting the frames of data it sends after
// they were checksummed.
func flipBits() grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, flipStream{ss})
	})
}

type flipStream struct{ grpc.ServerStream }

func (s flipStream) SendMsg(m any) error {
	if f, ok := m.(*peer.Frame); ok && f.Type == peer.FrameData {
		c := *f
		c.Data = bytes.Clone(f.Data)
		c.Data[len(c.Data)/2] ^= 0x10
		m = &c
	}
	return s.ServerStream.SendMsg(m)
}

// TestPullCorruptFails: a frame of data that does not match its checksum
// fails the restore with DataLoss, and nothing of the volume stays on n2.
func TestPullCorruptFails(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop", flipBits())
	_, snap := n1.source(8<<20, [][2]int64{{0, 1 << 20}})
	files := n2.dataFiles()
	_, err := n2.createFrom("pvc-restore", 8<<20, snapshotSource(snap), nil, time.Minute)
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "CRC-32C") {
		t.Fatalf("restore through a corrupting peer: %v, want DataLoss", err)
	}
	if now := n2.dataFiles(); now != files {
		t.Errorf("n2 kept something of the failed volume:\n%s", now)
	}
}

// TestPullInterrupted: n1's plugin killed in the middle of a copy fails
// it (Unavailable, nothing left on n2); the provisioner's retries, once n1
// is back, copy it afresh. Calls that end before the copy get Aborted with
// the progress.
func TestPullInterrupted(t *testing.T) {
	requireRoot(t)
	n1, n2, srv := peerNodesWith(t, "loop")
	_, snap := n1.source(16<<20, [][2]int64{{0, 8 << 20}})
	params := map[string]string{ParamTransferRate: "4Mi"} // 2 s
	files := n2.dataFiles()

	_, err := n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, 700*time.Millisecond)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "bytes of data received") {
		t.Fatalf("a call shorter than the copy: %v, want Aborted with the progress", err)
	}
	srv.kill()
	var last error
	for range 50 { // until the copy has failed
		if _, last = n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, 100*time.Millisecond); status.Code(last) != codes.Aborted {
			break
		}
	}
	if status.Code(last) != codes.Unavailable {
		t.Fatalf("a retry after n1 was killed: %v, want Unavailable", last)
	}
	if now := n2.dataFiles(); now != files {
		t.Errorf("n2 kept something of the interrupted copy:\n%s", now)
	}
	srv.start()
	var v *csi.Volume
	for range 30 {
		if v, last = n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, time.Second); status.Code(last) != codes.Aborted {
			break
		}
	}
	if last != nil {
		t.Fatalf("retries after n1 came back: %v", last)
	}
	if fileSum(t, n2.file(v.GetVolumeId())) != fileSum(t, n1.file(snap)) {
		t.Error("the copy made after the interruption differs from the snapshot")
	}
}

// TestPullFirstCallAnswersEarly: the call that starts a copy answers
// Aborted with the progress after firstPullWait even when its own deadline
// is far (the provisioner's is an hour), so that the claim shows progress
// early; the retry waits for the copy. Before, the first call waited up to
// five minutes and a copy shorter than that left no event on the claim.
func TestPullFirstCallAnswersEarly(t *testing.T) {
	requireRoot(t)
	defer func(w time.Duration) { firstPullWait = w }(firstPullWait)
	firstPullWait = 300 * time.Millisecond
	n1, n2, _ := peerNodesWith(t, "loop")
	_, snap := n1.source(16<<20, [][2]int64{{0, 8 << 20}})
	params := map[string]string{ParamTransferRate: "4Mi"} // 2 s

	// The copy takes 2 s: a first call that waited for it would succeed.
	_, err := n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, time.Hour)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "bytes of data received") {
		t.Fatalf("the first call: %v, want Aborted with the progress", err)
	}
	v, err := n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, time.Hour)
	if err != nil {
		t.Fatalf("the retry, which waits for the copy: %v", err)
	}
	if fileSum(t, n2.file(v.GetVolumeId())) != fileSum(t, n1.file(snap)) {
		t.Error("the restored volume differs from the snapshot")
	}
}

// TestPullDeleteCancels: DeleteVolume of a volume whose copy is in flight
// cancels the copy and leaves nothing; a create after that starts afresh.
func TestPullDeleteCancels(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	_, snap := n1.source(16<<20, [][2]int64{{0, 8 << 20}})
	files := n2.dataFiles()
	params := map[string]string{ParamTransferRate: "1Mi"}
	if _, err := n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, 500*time.Millisecond); status.Code(err) != codes.Aborted {
		t.Fatalf("create: %v, want Aborted", err)
	}
	start := time.Now()
	id := n2.d.publicID(blockdev.VolumeID("pvc-restore"))
	if _, err := n2.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete during the copy: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("delete took %v: the copy ran on", took)
	}
	if now := n2.dataFiles(); now != files || len(n2.d.pullStatus()) != 0 {
		t.Errorf("after the delete n2 has copies %v, files:\n%s", n2.d.pullStatus(), now)
	}
	if _, err := n2.createFrom("pvc-restore", 16<<20, snapshotSource(snap), params, 300*time.Millisecond); status.Code(err) != codes.Aborted {
		t.Errorf("create after the delete: %v, want Aborted (a new copy)", err)
	}
}

// TestPeerOpenSourceRefuses: a peer names a snapshot or volume of this node
// by its tagged ID, of the kind it asks for, or is refused before a lock,
// a lookup or a path; nothing in the data directory changes.
func TestPeerOpenSourceRefuses(t *testing.T) {
	requireRoot(t)
	n1 := newTestNodeOn(t, t.TempDir(), "n1")
	vol := n1.create("pvc-own", 1<<20, nil)
	snap := n1.snapshot("snap-own", vol)
	files := n1.dataFiles()
	svc := n1.d.PeerService()
	ctx := context.Background()
	for _, tc := range []struct {
		kind peer.SourceKind
		id   string
	}{
		{peer.SourceSnapshot, vol}, {peer.SourceVolume, snap}, {peer.SourceSnapshot, "../../etc/passwd-n1"},
		{peer.SourceVolume, "../volumes/" + vol}, {peer.SourceSnapshot, snap[:33] + "-n2"}, {peer.SourceSnapshot, snap[:33]},
		{peer.SourceVolume, vol[:33] + "-n1/../x"}, {peer.SourceVolume, strings.ToUpper(vol[:33]) + "-n1"}, {0, vol}, {9, snap},
	} {
		if f, _, err := svc.OpenSource(ctx, &peer.ReadRequest{Kind: tc.kind, ID: tc.id}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("OpenSource(%v, %q): %v, want InvalidArgument", tc.kind, tc.id, err)
			if f != nil {
				f.Close()
			}
		}
	}
	for _, tc := range []struct {
		kind peer.SourceKind
		id   string
	}{{peer.SourceSnapshot, snap}, {peer.SourceVolume, vol}} {
		f, size, err := svc.OpenSource(ctx, &peer.ReadRequest{Kind: tc.kind, ID: tc.id})
		if err != nil || size != 1<<20 {
			t.Errorf("OpenSource(%v, %q): %d bytes, %v", tc.kind, tc.id, size, err)
			continue
		}
		f.Close()
	}
	if now := n1.dataFiles(); now != files {
		t.Errorf("the data directory changed:\n%s\nwas\n%s", now, files)
	}
}

// TestCrossNodeParams: the class's transferRate is bytes per second of
// at least 1Mi (a frame of data must come well within the idle cut), or 0;
// crossNodeSource is pull or handoff.
func TestCrossNodeParams(t *testing.T) {
	for v, ok := range map[string]bool{"0": true, "1Mi": true, "200Mi": true, "1G": true, "1": false, "512Ki": false, "-1": false, "fast": false, "": false} {
		if err := checkParams(map[string]string{ParamTransferRate: v}); (err == nil) != ok {
			t.Errorf("transferRate %q: %v, want accepted %v", v, err, ok)
		}
	}
	for v, ok := range map[string]bool{"pull": true, "handoff": true, "": false, "Pull": false, "copy": false} {
		if err := checkParams(map[string]string{ParamCrossNodeSource: v}); (err == nil) != ok {
			t.Errorf("crossNodeSource %q: %v, want accepted %v", v, err, ok)
		}
	}
}

// TestHandoffAcrossNodes: with crossNodeSource=handoff, n2 has n1 make the
// restore from n1's snapshot and answers with n1's volume and topology
// (so that the scheduler moves the pod to n1); nothing is made on n2 and
// a repeated call gives the same answer. n1 makes volumes for a peer only
// from its own sources.
func TestHandoffAcrossNodes(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	_, snap := n1.source(8<<20, [][2]int64{{0, 1 << 20}})
	files := n2.dataFiles()
	params := map[string]string{ParamCrossNodeSource: "handoff"}
	for i := range 2 {
		v, err := n2.createFrom("pvc-handoff", 8<<20, snapshotSource(snap), params, time.Minute)
		if err != nil {
			t.Fatalf("handoff %d: %v", i, err)
		}
		if !strings.HasSuffix(v.GetVolumeId(), "-n1") || v.GetAccessibleTopology()[0].GetSegments()[TopologyKey] != "n1" ||
			v.GetContentSource().GetSnapshot().GetSnapshotId() != snap {
			t.Fatalf("handoff %d: %v, want n1's volume and topology", i, v)
		}
		if fileSum(t, n1.file(v.GetVolumeId())) != fileSum(t, n1.file(snap)) {
			t.Fatalf("handoff %d: n1's volume differs from the snapshot", i)
		}
	}
	if now := n2.dataFiles(); now != files {
		t.Errorf("n2 made something:\n%s", now)
	}
	svc := n1.d.PeerService()
	for _, src := range []*csi.VolumeContentSource{nil, snapshotSource(blockdev.SnapshotID("x") + "-n2"), volumeSource("../../etc/passwd-n2")} {
		_, err := svc.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-peer", VolumeContentSource: src,
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("", snw)}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("peer CreateVolume from %v: %v, want InvalidArgument", src, err)
		}
	}
}
