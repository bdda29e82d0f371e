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
