package driver

import (
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/filecopy"
)

// A clone on another node pulls a point-in-time copy of this node's
// volume (copyForPeer), which holds the volume (a freeze if it is in use)
// while it is made and takes as much disk as the volume's data while it
// is open. So at most one copy of a volume exists at a time:
//   - a stream for a volume whose copy is being made or sent is refused
//     with Unavailable, which the requester's provisioner retries. It is
//     not given that copy: its point in time may be older than its
//     request. Nor does it wait: it would hold a stream's place for
//     nothing.
//   - the copy that a failed stream sent is kept, open and unlinked, for
//     keepCopy; the retry of the same pull (the same target from the same
//     node) gets it instead of a new freeze and copy, so its point in time
//     is that of the first try, as if that try had succeeded. Any other
//     request drops it and makes its own.
//   - the copy that a stream sent in full goes at once.

// keepCopy is how long the copy of a failed stream waits for its retry
// (the provisioner's back-off reaches 5 minutes).
var keepCopy = 5 * time.Minute

// peerCopies are the copies of this node's volumes for peers, by the
// volume's store ID.
type peerCopies struct {
	mu sync.Mutex
	m  map[string]*peerCopy
}

type peerCopy struct {
	node, target string   // the pull it is for
	f            *os.File // the copy, once made
	size         int64
	busy         bool        // being made or sent
	expire       *time.Timer // drops it, while kept for a retry
}

// open returns the copy of the volume id for the pull of target by node:
// the one kept for that pull, or a new one by copyOf. The stream gets a file
// of its own to close; the copy stays here until sent reports the
// stream's end.
func (cs *peerCopies) open(id, node, target string, copyOf func() (*os.File, int64, error)) (*os.File, int64, error) {
	cs.mu.Lock()
	c := cs.m[id]
	switch {
	case c != nil && c.busy:
		cs.mu.Unlock()
		return nil, 0, status.Errorf(codes.Unavailable, "a copy of volume %s is being made or sent for %s on node %s, and a volume has one copy at a time: retry later",
			id, c.target, c.node)
	case c != nil && c.node == node && c.target == target:
		defer cs.mu.Unlock()
		c.expire.Stop()
		f, err := filecopy.Dup(c.f)
		if err != nil {
			cs.drop(id, c)
			return nil, 0, err
		}
		c.busy = true
		klog.InfoS("sending again the copy a failed stream sent", "volumeID", id, "for", target, "peer", node)
		return f, c.size, nil
	case c != nil:
		c.expire.Stop()
		cs.drop(id, c)
	}
	c = &peerCopy{node: node, target: target, busy: true}
	if cs.m == nil {
		cs.m = map[string]*peerCopy{}
	}
	cs.m[id] = c
	cs.mu.Unlock()

	f, size, err := copyOf()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if err != nil {
		delete(cs.m, id)
		return nil, 0, err
	}
	c.f, c.size = f, size
	g, err := filecopy.Dup(f)
	if err != nil {
		cs.drop(id, c)
		return nil, 0, err
	}
	return g, size, nil
}

// sent records the end of the stream of the copy of id: a copy sent in
// full goes, one whose stream failed (err) is kept for keepCopy.
func (cs *peerCopies) sent(id string, err error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[id]
	if c == nil || !c.busy || c.f == nil {
		return
	}
	c.busy = false
	if err == nil {
		cs.drop(id, c)
		return
	}
	c.expire = time.AfterFunc(keepCopy, func() {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.m[id] == c && !c.busy {
			cs.drop(id, c)
		}
	})
}

// drop closes the copy c of id and forgets it. The caller holds cs.mu.
func (cs *peerCopies) drop(id string, c *peerCopy) {
	if c.f != nil {
		c.f.Close()
	}
	if cs.m[id] == c {
		delete(cs.m, id)
	}
}
