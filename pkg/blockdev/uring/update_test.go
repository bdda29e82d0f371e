package uring

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUpdateFiles proves that a sparse file table takes, serves and clears
// files slot by slot on a live ring: what a server thread does as devices
// come and go.
func TestUpdateFiles(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 8, Flags: QueueFlags})
	if err := r.RegisterFilesSparse(16); err != nil {
		t.Fatal(err)
	}
	f := directFile(t, 1<<20)
	want := bytes.Repeat([]byte{0x5a}, 4096)
	buf := newBuffers(t, 1, 4096)
	copy(buf.Slot(0), want)
	if _, err := f.WriteAt(buf.Slot(0), 8192); err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateFiles(9, []int32{int32(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	clear(buf.Slot(0))
	sqe := r.GetSQE()
	sqe.PrepRead(9, buf.Slot(0), 8192)
	sqe.Flags |= IOSQE_FIXED_FILE
	if c := waitOne(t, r); c.Res != 4096 || !bytes.Equal(buf.Slot(0), want) {
		t.Fatalf("read through fixed file 9: res %d, data match %v", c.Res, bytes.Equal(buf.Slot(0), want))
	}
	if err := r.UpdateFiles(9, []int32{-1}); err != nil {
		t.Fatal(err)
	}
	sqe = r.GetSQE()
	sqe.PrepRead(9, buf.Slot(0), 8192)
	sqe.Flags |= IOSQE_FIXED_FILE
	if c := waitOne(t, r); c.Res != -int32(unix.EBADF) {
		t.Fatalf("read through cleared slot 9: res %d, want -EBADF", c.Res)
	}
	if err := r.UpdateFiles(16, []int32{int32(f.Fd())}); err == nil {
		t.Fatal("update past the table's end succeeded")
	}
}

// TestUpdateBuffers proves that slots of a sparse buffer table can be
// filled with buffers and cleared again while the ring runs.
func TestUpdateBuffers(t *testing.T) {
	lockThread(t)
	r := newRing(t, Config{Entries: 8, Flags: QueueFlags})
	if err := r.RegisterBuffersSparse(64); err != nil {
		t.Fatal(err)
	}
	f := directFile(t, 1<<20)
	bufs := newBuffers(t, 2, 4096)
	copy(bufs.Slot(0), bytes.Repeat([]byte{0xa5}, 4096))
	if err := r.UpdateBuffers(40, bufs.Slots()); err != nil {
		t.Fatal(err)
	}
	sqe := r.GetSQE()
	sqe.PrepWriteFixed(int32(f.Fd()), bufs.Slot(0), 0, 40)
	if c := waitOne(t, r); c.Res != 4096 {
		t.Fatalf("write from fixed buffer 40: res %d", c.Res)
	}
	sqe = r.GetSQE()
	sqe.PrepReadFixed(int32(f.Fd()), bufs.Slot(1), 0, 41)
	if c := waitOne(t, r); c.Res != 4096 || !bytes.Equal(bufs.Slot(0), bufs.Slot(1)) {
		t.Fatalf("read into fixed buffer 41: res %d, data match %v", c.Res, bytes.Equal(bufs.Slot(0), bufs.Slot(1)))
	}
	if err := r.UpdateBuffers(40, make([][]byte, 2)); err != nil {
		t.Fatal(err)
	}
	sqe = r.GetSQE()
	sqe.PrepReadFixed(int32(f.Fd()), bufs.Slot(1), 0, 41)
	if c := waitOne(t, r); c.Res >= 0 {
		t.Fatalf("read into cleared fixed buffer 41: res %d, want an error", c.Res)
	}
}
