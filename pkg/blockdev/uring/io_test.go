package uring

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

const blk = 4096

func TestReadWrite(t *testing.T) {
	lockThread(t)
	cases := []struct {
		name  string
		fixed bool // registered file and buffers
		dsync bool
	}{
		{"plain", false, false},
		{"plain fua", false, true},
		{"fixed", true, false},
		{"fixed fua", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lockThread(t)
			f := directFile(t, 16*blk)
			r := newRing(t, Config{Entries: 8, Flags: QueueFlags})
			bufs := newBuffers(t, 2, blk)
			fd := int32(f.Fd())
			if c.fixed {
				if err := r.RegisterFiles([]int32{fd}); err != nil {
					t.Fatal(err)
				}
				if err := r.RegisterBuffers(bufs.Slots()); err != nil {
					t.Fatal(err)
				}
				fd = 0
			}
			w, rd := bufs.Slot(0), bufs.Slot(1)
			for i := range w {
				w[i] = byte(i*7 + 3)
			}
			s := r.GetSQE()
			if c.fixed {
				s.PrepWriteFixed(fd, w, 3*blk, 0)
				s.Flags |= IOSQE_FIXED_FILE
			} else {
				s.PrepWrite(fd, w, 3*blk)
			}
			if c.dsync {
				s.OpFlags = unix.RWF_DSYNC
			}
			if cq := waitOne(t, r); cq.Res != blk {
				t.Fatalf("write res %d", cq.Res)
			}
			s = r.GetSQE()
			if c.fixed {
				s.PrepReadFixed(fd, rd, 3*blk, 1)
				s.Flags |= IOSQE_FIXED_FILE
			} else {
				s.PrepRead(fd, rd, 3*blk)
			}
			if cq := waitOne(t, r); cq.Res != blk {
				t.Fatalf("read res %d", cq.Res)
			}
			if !bytes.Equal(w, rd) {
				t.Fatal("read back differs from written data")
			}
			// Read back through the page cache: f is O_DIRECT, and a Go
			// heap buffer need not meet the device's DIO alignment.
			all, err := os.ReadFile(f.Name())
			if err != nil || !bytes.Equal(all[3*blk:4*blk], w) {
				t.Fatalf("buffered read sees other data (err %v)", err)
			}
		})
	}
}

func TestFsyncFallocate(t *testing.T) {
	lockThread(t)
	f := directFile(t, 0)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	fd := int32(f.Fd())
	steps := []struct {
		name string
		prep func(*SQE)
		size int64 // st_size afterwards, -1 to skip
	}{
		{"allocate 1MiB", func(s *SQE) { s.PrepFallocate(fd, 0, 0, 1<<20) }, 1 << 20},
		{"punch hole", func(s *SQE) {
			s.PrepFallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 1<<19)
		}, 1 << 20},
		{"fdatasync", func(s *SQE) { s.PrepFsync(fd, IORING_FSYNC_DATASYNC) }, -1},
		{"fsync", func(s *SQE) { s.PrepFsync(fd, 0) }, -1},
	}
	// Sequential steps on one SINGLE_ISSUER ring: no t.Run, whose
	// goroutine would run on another thread.
	for _, st := range steps {
		st.prep(r.GetSQE())
		if cq := waitOne(t, r); cq.Res != 0 {
			t.Fatalf("%s: res %d (%v)", st.name, cq.Res, unix.Errno(-cq.Res))
		}
		if st.size < 0 {
			continue
		}
		var sb unix.Stat_t
		if err := unix.Fstat(int(fd), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.Size != st.size {
			t.Errorf("%s: size %d, want %d", st.name, sb.Size, st.size)
		}
	}
	var sb unix.Stat_t
	if err := unix.Fstat(int(fd), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Blocks*512 > 1<<19 {
		t.Errorf("punched file still has %d bytes allocated", sb.Blocks*512)
	}
}

func TestSparseBuffers(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 4, Flags: QueueFlags})
	if err := r.RegisterBuffersSparse(64); err != nil {
		t.Fatal(err)
	}
	f := directFile(t, blk)
	b := newBuffers(t, 1, blk)
	s := r.GetSQE()
	s.PrepReadFixed(int32(f.Fd()), b.Slot(0), 0, 5) // slot 5 is empty
	if cq := waitOne(t, r); cq.Res >= 0 {
		t.Errorf("read into empty sparse slot succeeded: %d", cq.Res)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
}
