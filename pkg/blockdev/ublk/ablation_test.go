//go:build ablation

package ublk

import (
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"
)

// TestAblationsServeCorrectly proves that every benchmark ablation still
// serves correct data (so that the ablation table measures a working
// server, not a broken one): a shared thread with one technique switched
// off serves a copy-mode device under concurrent load and, where the
// driver has it, a zero-copy device beside it.
func TestAblationsServeCorrectly(t *testing.T) {
	requireUblk(t)
	c := openTestCtl(t)
	for _, name := range AblationNames() {
		t.Run(name, func(t *testing.T) {
			ab, err := ParseAblation(name)
			if err != nil {
				t.Fatal(err)
			}
			cfg := ThreadConfig{Ablation: ab, CPU: -1}
			th, err := dataplane.NewThread(0, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := th.Close(); err != nil {
					t.Errorf("close server thread: %v", err)
				}
			})
			const size = 64 << 20 // checkParallel's span
			for i := range 2 {
				var flags uint64
				if i == 1 {
					if features(t, c)&FlagAutoBufReg == 0 {
						break
					}
					flags = FlagAutoBufReg
				}
				f, _ := backingFile(t, size)
				d := addTestDev(t, c, 2, 32, 512<<10, flags, size)
				_, path := startQueuesOn(t, d, FileTarget(int(f.Fd())), QueueOptions{FixedBuffers: true}, []*dataplane.Thread{th})
				if i == 0 {
					checkParallel(t, path) // copy mode, many in flight
				} else {
					checkReadWrite(t, path, f) // zero copy
				}
			}
		})
	}
}
