package dataplane

import (
	"math"
	"math/big"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// FuzzPlanFor decodes a fuzzed ublksrv_io_desc and plans it for each
// target kind. Properties: nothing panics; a plan either fails the request
// with a negative errno or is one of the backing operations of planFor's
// table; a plan that moves or frees data covers exactly the descriptor's
// sectors (no wrap of the offset or length, a byte count that fits the
// int32 result the kernel gets); the null target never touches the file.
func FuzzPlanFor(f *testing.F) {
	f.Add(uint32(uapi.IOOpRead), uint32(8), uint64(0))
	f.Add(uint32(uapi.IOOpWrite|uapi.IOFlagFUA), uint32(2048), uint64(1<<21))
	f.Add(uint32(uapi.IOOpFlush), uint32(0), uint64(0))
	f.Add(uint32(uapi.IOOpDiscard), uint32(16), uint64(8))
	f.Add(uint32(uapi.IOOpWriteZeroes|uapi.IOFlagNoUnmap), uint32(16), uint64(2))
	f.Add(uint32(uapi.IOOpWriteSame), uint32(1), uint64(1))
	f.Add(uint32(0xff), uint32(1), uint64(1))
	f.Add(uint32(uapi.IOOpRead), uint32(1<<23), uint64(0))   // 4 GiB: wraps the 32-bit length to 0
	f.Add(uint32(uapi.IOOpWrite), uint32(1<<22), uint64(0))  // 2 GiB: no int32 result
	f.Add(uint32(uapi.IOOpRead), uint32(8), uint64(1)<<55)   // offset beyond int64
	f.Add(uint32(uapi.IOOpRead), uint32(8), uint64(1)<<54-1) // last sectors of the int64 range
	f.Fuzz(func(t *testing.T, opFlags, nrSectors uint32, startSector uint64) {
		r := decodeDesc(opFlags, nrSectors, startSector)
		for _, kind := range []TargetKind{TargetFile, TargetNull} {
			p := planFor(r, Target{Kind: kind})
			if p.act == actFail {
				if p.errno >= 0 {
					t.Fatalf("desc %#x/%d/%d: failed with errno %d", opFlags, nrSectors, startSector, p.errno)
				}
				continue
			}
			if p.errno != 0 || p.act > actComplete {
				t.Fatalf("desc %#x/%d/%d: plan %+v", opFlags, nrSectors, startSector, p)
			}
			if kind == TargetNull && p.act != actComplete {
				t.Fatalf("null target plans %+v", p)
			}
			op := opFlags & 0xff
			if op == uapi.IOOpFlush {
				continue
			}
			off := new(big.Int).Lsh(new(big.Int).SetUint64(startSector), 9)
			n := new(big.Int).Lsh(big.NewInt(int64(nrSectors)), 9)
			end := new(big.Int).Add(off, n)
			if off.Cmp(big.NewInt(r.off)) != 0 || n.Cmp(big.NewInt(int64(r.len))) != 0 ||
				end.Cmp(big.NewInt(math.MaxInt64)) > 0 || int64(fullResult(r)) < 0 {
				t.Fatalf("desc op %d, %d sectors at %d: planned %+v for %d bytes at %d (result %d)",
					op, nrSectors, startSector, p, r.len, r.off, fullResult(r))
			}
			if p.act == actFallocate && p.mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
				t.Fatalf("fallocate without KEEP_SIZE: %+v", p)
			}
		}
	})
}
