package ublk

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/loop"
)

// TestDifferentialHarnessAgreesWithItself runs the differential test's
// requests on two loop devices (direct I/O, 4 KiB blocks) of a 1 MiB and a
// 3 GiB file: the oracle against itself must find no difference, at queue
// depth 1 and in batches of 32, so that a difference the VM test reports is
// the server's, not the harness's (an order-dependent batch, a range drawn
// out of the device).
func TestDifferentialHarnessAgreesWithItself(t *testing.T) {
	testgate.RequireLoop(t)
	for _, size := range []int64{1 << 20, 3 << 30} {
		dir := t.TempDir()
		var pair [2]*os.File
		var files [2]string
		for i := range pair {
			files[i] = testfs.Sparse(t, filepath.Join(dir, string(rune('a'+i))+".img"), size)
			d, err := loop.Attach(files[i], loop.Options{DirectIO: true, BlockSize: 4096})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { loop.Detach(d.Path, 0) })
			if pair[i], err = os.OpenFile(d.Path, os.O_RDWR|unix.O_DIRECT, 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pair[i].Close() })
		}
		lim, err := readLimits(pair[0].Name(), size)
		if err != nil {
			t.Fatal(err)
		}
		for _, qd := range []int{1, 32} {
			tally, err := compareDevices(pair, lim, qd, 64, rand.New(rand.NewPCG(diffFixedSeed, uint64(qd))))
			if err != nil {
				t.Fatalf("%d-byte devices at depth %d: %v", size, qd, err)
			}
			t.Logf("%d-byte devices at depth %d agree: %v", size, qd, tally)
		}
		if err := sameImages(files[0], files[1], size); err != nil {
			t.Fatal(err)
		}
	}
}
