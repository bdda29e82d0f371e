package dataplane

import "testing"

// TestRangeAlloc pins the buffer-slot allocator: first fit, and runs given
// back merge with their neighbours so a full table can be handed out again.
func TestRangeAlloc(t *testing.T) {
	a := newRangeAlloc(100)
	x, _ := a.alloc(30)
	y, _ := a.alloc(30)
	z, _ := a.alloc(40)
	if x != 0 || y != 30 || z != 60 {
		t.Fatalf("allocs at %d %d %d, want 0 30 60", x, y, z)
	}
	if _, ok := a.alloc(1); ok {
		t.Fatal("alloc from a full table succeeded")
	}
	a.free(y, 30)
	if s, ok := a.alloc(31); ok {
		t.Fatalf("alloc(31) from a hole of 30 gave %d", s)
	}
	a.free(x, 30)
	a.free(z, 40)
	if s, ok := a.alloc(100); !ok || s != 0 {
		t.Fatalf("after every run came back, alloc(100) = %d, %v", s, ok)
	}
}
