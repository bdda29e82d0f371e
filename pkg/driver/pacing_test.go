package driver

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
)

// watchedGovernor gives n a Governor with budget that counts how often it
// looks at n's devices: only a paced copy starts its control loop.
func watchedGovernor(n *testNode, budget float64) *atomic.Int64 {
	var looks atomic.Int64
	n.d.copies = copypace.New(copypace.Config{Budget: budget, Devices: func(ctx context.Context) ([]string, error) {
		looks.Add(1)
		return n.d.attachedDevices(ctx)
	}})
	return &looks
}

// lookedAt waits (up to 10 s) until looks is above was.
func lookedAt(looks *atomic.Int64, was int64) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if looks.Load() > was {
			return true
		}
	}
	return false
}

// TestCopiesPacedByTheirNodes: every background copy asks its node's
// Governor (pkg/blockdev/copypace): a restore and a clone from a source of
// this node (the store's copy), and a pull from another node on both ends
// (the sender's stream, the point-in-time copy of a cloned volume, the
// receiver's writes); the data comes out exact. With pacing off
// (--copy-budget=0) no Governor looks at anything.
func TestCopiesPacedByTheirNodes(t *testing.T) {
	requireRoot(t)
	n1, n2, _ := peerNodesWith(t, "loop")
	vol, snap := n1.source(16<<20, [][2]int64{{0, 1 << 20}, {8 << 20, 2 << 20}})
	want := fileSum(t, n1.file(snap))
	for _, tc := range []struct {
		name  string
		n     *testNode
		src   *csi.VolumeContentSource
		paced []*testNode // the nodes whose Governors pace the copy
	}{
		{"restore, local", n1, snapshotSource(snap), []*testNode{n1}},
		{"clone, local", n1, volumeSource(vol), []*testNode{n1}},
		{"restore, pulled", n2, snapshotSource(snap), []*testNode{n1, n2}},
		{"clone, pulled", n2, volumeSource(vol), []*testNode{n1, n2}},
	} {
		// A new Governor for each copy: its control loop starts with
		// the copy's Pacer and looks at the devices first. (One left
		// running by the copy before may end before it looks again,
		// when this copy is short.)
		looks := make([]*atomic.Int64, len(tc.paced))
		for i, n := range tc.paced {
			looks[i] = watchedGovernor(n, 0)
		}
		v, err := tc.n.createPulled("pvc-"+tc.name[:5]+"-"+tc.n.d.cfg.NodeID, 16<<20, tc.src, nil, time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if fileSum(t, tc.n.file(v.GetVolumeId())) != want {
			t.Errorf("%s: the data differs from the source's", tc.name)
		}
		for i, l := range looks {
			if !lookedAt(l, 0) {
				t.Errorf("%s: the Governor of %s never looked at the devices: the copy was not paced", tc.name, tc.paced[i].d.cfg.NodeID)
			}
		}
	}

	off1, off2 := watchedGovernor(n1, -1), watchedGovernor(n2, -1)
	for _, c := range []struct {
		n   *testNode
		src *csi.VolumeContentSource
	}{{n1, snapshotSource(snap)}, {n2, volumeSource(vol)}} {
		if _, err := c.n.createPulled("pvc-off-"+c.n.d.cfg.NodeID, 16<<20, c.src, nil, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if off1.Load()+off2.Load() != 0 {
		t.Errorf("with pacing off the Governors looked at the devices %d and %d times", off1.Load(), off2.Load())
	}
}
