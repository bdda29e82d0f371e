package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// containerLog is the plugin container's log of a node pod.
func (c *cluster) containerLog(t *testing.T, podName string) string {
	t.Helper()
	out, err := c.kubectl("-n", pluginNS, "logs", podName, "-c", "csi-fastblk")
	if err != nil {
		t.Fatalf("logs of %s: %v", podName, err)
	}
	return out
}

// dialFromNode connects to addr from inside node's network namespace (made
// by hack/k8s/cluster.sh as fbk-k8s-<node>): where a process of that
// node outside the installation stands.
func dialFromNode(t *testing.T, node, addr string) net.Conn {
	t.Helper()
	conn, err := dialInNetns("/run/netns/fbk-k8s-"+node, addr)
	if err != nil {
		t.Fatalf("connect to %s from %s: %v", addr, node, err)
	}
	return conn
}

// peerCall calls the peer service at addr from node's network namespace
// with the TLS configuration cfg.
func peerCall(t *testing.T, node, addr string, cfg *tls.Config) error {
	t.Helper()
	conn := dialFromNode(t, node, addr)
	used := false
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			if used {
				return nil, fmt.Errorf("one connection only")
			}
			used = true
			return conn, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cc.Invoke(ctx, "/fastblk.peer.v1.Peer/ModifyVolume", &csi.ControllerModifyVolumeRequest{VolumeId: "not-a-volume"},
		new(csi.ControllerModifyVolumeResponse))
}

// dialFromPod connects to addr from inside the network namespace of the
// host's process pid (a plugin's): from its pod's address.
func dialFromPod(t *testing.T, pid int, addr string) net.Conn {
	t.Helper()
	conn, err := dialInNetns(fmt.Sprintf("/proc/%d/ns/net", pid), addr)
	if err != nil {
		t.Fatalf("connect to %s from the network of process %d: %v", addr, pid, err)
	}
	return conn
}

// peerConn is a gRPC connection to the peer service at addr over conn,
// with the TLS configuration cfg.
func peerConn(t *testing.T, conn net.Conn, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	used := false
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			if used {
				return nil, fmt.Errorf("one connection only")
			}
			used = true
			return conn, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// asNode is the context of a peer call that shows token and speaks for
// node (pkg/peer's metadata; token "" sends none), and for a stream the
// claim its data is for.
func asNode(token, node, claim string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	return withPeerMD(ctx, token, node, claim), cancel
}

// withPeerMD is ctx with the metadata of asNode.
func withPeerMD(ctx context.Context, token, node, claim string) context.Context {
	var kv []string
	if token != "" {
		kv = append(kv, "authorization", "Bearer "+token)
	}
	kv = append(kv, "fastblk-peer-node", node)
	if claim != "" {
		kv = append(kv, "fastblk-peer-claim", claim)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// peerModify calls ModifyVolume of id with params on cc as node with token.
func peerModify(cc *grpc.ClientConn, token, node, id string, params map[string]string) error {
	ctx, cancel := asNode(token, node, "")
	defer cancel()
	return cc.Invoke(ctx, "/fastblk.peer.v1.Peer/ModifyVolume", &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params},
		new(csi.ControllerModifyVolumeResponse))
}

// peerRead asks on cc, as node with token, for the data of the volume id
// for claim, and returns how the stream ends before any data.
func peerRead(cc *grpc.ClientConn, token, node, id, claim string) error {
	ctx, cancel := asNode(token, node, claim)
	defer cancel()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/fastblk.peer.v1.Peer/ReadData", grpc.CallContentSubtype("fastblk-xfer-v1"))
	if err != nil {
		return err
	}
	if err := st.SendMsg(&peer.ReadRequest{Kind: peer.SourceVolume, ID: id, Target: "pvc-e2e"}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	for {
		var f peer.Frame
		if err := st.RecvMsg(&f); err != nil {
			return err
		}
		if f.Type != peer.FrameWait {
			return fmt.Errorf("the stream sent a %q frame", f.Type)
		}
	}
}

// dataStream opens a ReadData stream of req on cc, ctx carrying the
// caller's metadata (withPeerMD), as a plugin's pull does, and returns it
// once its first frame came; err is how the stream ended before any (a
// refusal).
func dataStream(ctx context.Context, cc *grpc.ClientConn, req *peer.ReadRequest) (grpc.ClientStream, error) {
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/fastblk.peer.v1.Peer/ReadData", grpc.CallContentSubtype("fastblk-xfer-v1"))
	if err == nil {
		err = st.SendMsg(req)
	}
	if err == nil {
		err = st.CloseSend()
	}
	if err == nil {
		err = st.RecvMsg(new(peer.Frame))
	}
	return st, err
}

// flood is one peer's flood of data streams (TestPeerFlood): n streams
// opened at once, spread over a few connections; each accepted stream is
// read to its end and then opened again, so that the flood keeps the
// places it got until stop.
type flood struct {
	Accepted int                // of the first n streams
	Refused  map[codes.Code]int // the others, by code
	Refusal  string             // one refusal's message
	Answered time.Duration      // from the first opening until every stream was accepted or refused
	Slowest  time.Duration      // the longest a refusal took

	held     atomic.Int64 // streams open now
	reopened atomic.Int64 // streams accepted again after one ended
	mu       sync.Mutex
	ended    map[string]int // how the flood's streams ended before stop ("sent in full" or a code)
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	conns    []*grpc.ClientConn
}

// startFlood opens n streams of req on conns at once, ctx's metadata
// (withPeerMD) naming the caller, the ith with the target req.Target-i;
// it returns once each was accepted or refused, the accepted ones held
// (hold) until stop.
func startFlood(md func(context.Context) context.Context, conns []*grpc.ClientConn, req peer.ReadRequest, n int) *flood {
	ctx, cancel := context.WithCancel(context.Background())
	ctx = md(ctx)
	f := &flood{Refused: map[codes.Code]int{}, ended: map[string]int{}, cancel: cancel, conns: conns}
	var answered sync.WaitGroup
	start := time.Now()
	for i := range n {
		answered.Add(1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			cc, r := conns[i%len(conns)], req
			r.Target = fmt.Sprintf("%s-%d", req.Target, i)
			opened := time.Now()
			st, err := dataStream(ctx, cc, &r)
			f.mu.Lock()
			if err != nil {
				f.Refused[status.Code(err)]++
				f.Refusal = status.Convert(err).Message()
				f.Slowest = max(f.Slowest, time.Since(opened))
			} else {
				f.Accepted++
			}
			f.mu.Unlock()
			answered.Done()
			if err == nil {
				f.hold(ctx, cc, &r, st)
			}
		}()
	}
	answered.Wait()
	f.Answered = time.Since(start)
	return f
}

// hold reads st to its end, then opens a stream of req on cc again (every
// 100 ms until one is accepted) and reads that, until ctx ends.
func (f *flood) hold(ctx context.Context, cc *grpc.ClientConn, req *peer.ReadRequest, st grpc.ClientStream) {
	for {
		f.held.Add(1)
		var err error
		for err == nil {
			err = st.RecvMsg(new(peer.Frame))
		}
		f.held.Add(-1)
		if ctx.Err() != nil {
			return
		}
		how := "sent in full"
		if !errors.Is(err, io.EOF) {
			how = status.Code(err).String()
		}
		f.mu.Lock()
		f.ended[how]++
		f.mu.Unlock()
		for {
			if st, err = dataStream(ctx, cc, req); err == nil {
				f.reopened.Add(1)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// stop ends every stream and connection of the flood.
func (f *flood) stop() {
	f.cancel()
	f.wg.Wait()
	for _, cc := range f.conns {
		cc.Close()
	}
}

// Ended is how the flood's streams ended before stop.
func (f *flood) Ended() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.ended)
}

// procStats is what a process holds: threads, resident memory, open
// descriptors (of them sockets, and those open on one file), and the CPU
// time it has used.
type procStats struct {
	Threads              int
	RSSKiB               int64
	FDs, Sockets, OnFile int
	CPU                  time.Duration
}

func (s procStats) String() string {
	return fmt.Sprintf("%d threads, RSS %.1f MiB, %d fds (%d sockets)", s.Threads, float64(s.RSSKiB)/1024, s.FDs, s.Sockets)
}

// readProcStats reads process pid's procStats from /proc; OnFile counts
// the descriptors whose path ends in onFile ("" for none).
func readProcStats(pid int, onFile string) (procStats, error) {
	var s procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if f := strings.Fields(v); len(f) > 0 {
			switch k {
			case "Threads":
				s.Threads, _ = strconv.Atoi(f[0])
			case "VmRSS":
				s.RSSKiB, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return s, err
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		s.FDs++
		switch {
		case strings.HasPrefix(link, "socket:"):
			s.Sockets++
		case onFile != "" && strings.HasSuffix(link, onFile):
			s.OnFile++
		}
	}
	// utime and stime, the 14th and 15th fields, in clock ticks (USER_HZ,
	// 100 on Linux); the 2nd (the command) may hold spaces.
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	i := bytes.LastIndexByte(b, ')')
	if f := strings.Fields(string(b[i+1:])); i >= 0 && len(f) > 12 {
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		s.CPU = time.Duration(ut+st) * time.Second / 100
	}
	return s, nil
}

// sampleProc reads pid's procStats (onFile as readProcStats) every
// 200 ms until the returned stop, which gives the most of each field
// seen, and the least OnFile.
func sampleProc(pid int, onFile string) (stop func() (most procStats, leastOnFile int)) {
	type result struct {
		most  procStats
		least int
	}
	done, out := make(chan struct{}), make(chan result, 1)
	go func() {
		r := result{least: -1}
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if s, err := readProcStats(pid, onFile); err == nil {
				m := &r.most
				m.Threads, m.RSSKiB, m.FDs = max(m.Threads, s.Threads), max(m.RSSKiB, s.RSSKiB), max(m.FDs, s.FDs)
				m.Sockets, m.OnFile, m.CPU = max(m.Sockets, s.Sockets), max(m.OnFile, s.OnFile), max(m.CPU, s.CPU)
				if r.least < 0 || s.OnFile < r.least {
					r.least = s.OnFile
				}
			}
			select {
			case <-done:
				out <- r
				return
			case <-tick.C:
			}
		}
	}()
	return func() (procStats, int) {
		close(done)
		r := <-out
		return r.most, r.least
	}
}
