package driver

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// inode identifies the file f is open on.
func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestPeerCopyOnceAtATime: a volume has one copy for peers at a time: a
// second stream while one is made or sent is Unavailable; the retry of a
// failed stream (same target) gets the copy it sent, not a new one; any
// other request, or one after a stream that sent it all, a new one.
func TestPeerCopyOnceAtATime(t *testing.T) {
	requireRoot(t)
	n1 := newTestNodeOn(t, t.TempDir(), "n1")
	vol := n1.create("pvc-src", 4<<20, nil)
	n1.writeExtents(vol, [][2]int64{{0, 1 << 20}})
	svc, ctx := n1.d.PeerService(), context.Background()
	open := func(target string) (*os.File, error) {
		f, _, err := svc.OpenSource(ctx, &peer.ReadRequest{Kind: peer.SourceVolume, ID: vol, Target: target})
		if f != nil {
			t.Cleanup(func() { f.Close() })
		}
		return f, err
	}
	sent := func(target string, err error) {
		svc.SourceSent(ctx, &peer.ReadRequest{Kind: peer.SourceVolume, ID: vol, Target: target}, err)
	}
	a, err := open("pvc-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"pvc-a", "pvc-b"} {
		if _, err := open(target); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "one copy at a time") {
			t.Errorf("a second stream of the volume for %s: %v, want Unavailable", target, err)
		}
	}
	sent("pvc-a", errors.New("cut"))
	again, err := open("pvc-a")
	if err != nil || inode(t, again) != inode(t, a) {
		t.Errorf("the retry after a failed stream: %v, a new copy: %v", err, err == nil && inode(t, again) != inode(t, a))
	}
	sent("pvc-a", errors.New("cut"))
	b, err := open("pvc-b")
	if err != nil || inode(t, b) == inode(t, a) {
		t.Fatalf("another clone's stream: %v, the copy of another: %v", err, err == nil)
	}
	sent("pvc-b", nil)
	b2, err := open("pvc-b")
	if err != nil || inode(t, b2) == inode(t, b) {
		t.Errorf("a stream after one that sent it all: %v, the copy sent: %v", err, err == nil)
	}
	sent("pvc-b", nil)
	n1.d.peerCopies.mu.Lock()
	defer n1.d.peerCopies.mu.Unlock()
	if n := len(n1.d.peerCopies.m); n != 0 {
		t.Errorf("%d copies kept after the last stream sent it all", n)
	}
}
