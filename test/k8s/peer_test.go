package k8s

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

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
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, its network namespace changed,
		// ends with this goroutine instead of returning to the runtime.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/fbk-k8s-" + node)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		ch <- result{conn, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect to %s from %s: %v", addr, node, r.err)
	}
	return r.conn
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
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked, as in dialFromNode.
		runtime.LockOSThread()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		ch <- result{conn, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect to %s from the network of process %d: %v", addr, pid, r.err)
	}
	return r.conn
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
	var kv []string
	if token != "" {
		kv = append(kv, "authorization", "Bearer "+token)
	}
	kv = append(kv, "fastblk-peer-node", node)
	if claim != "" {
		kv = append(kv, "fastblk-peer-claim", claim)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...), cancel
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
