package k8s

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// TestControllerExpansionOnOtherNode: the chart advertises controller
// expansion, so the external-resizer's one leader calls
// ControllerExpandVolume on its own node's plugin for every volume. A
// volume in use on the other node grows online all the same: the leader's
// plugin forwards the call over the peer channel, the volume's plugin
// answers it (its log says so), and NodeExpandVolume grows the
// filesystem the pod sees. Before the peer channel this call failed with
// FailedPrecondition, which is why controller expansion was off.
func TestControllerExpansionOnOtherNode(t *testing.T) {
	c := requireChart(t)
	_, leaderNode := c.resizerLeader(t)
	other := nodes[0]
	if other == leaderNode {
		other = nodes[1]
	}
	claim, name := "grow-peer", "grow-peer"
	c.apply(t, pvc(claim, "1Gi", ""))
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "pvc", claim, "--ignore-not-found", "--wait=true", "--timeout=120s")
	})
	c.startPod(t, pod{name: name, claim: claim, node: other, script: "sleep 3600"})
	c.waitPodPhase(t, name, "Running", 2*time.Minute)
	if n := c.volumeNode(t, claim); n != other {
		t.Fatalf("volume on %s, want %s", n, other)
	}
	before := c.dfSize(t, name)
	c.k(t, "-n", testNS, "patch", "pvc", claim, "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	eventually(t, 3*time.Minute, "PVC "+claim+" at 2Gi", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "pvc", claim, "-o", "jsonpath={.status.capacity.storage} {.status.conditions}")
		return strings.HasPrefix(out, "2Gi "), out
	})
	eventually(t, time.Minute, "the pod to see the grown filesystem", func() (bool, string) {
		now := c.dfSize(t, name)
		return now > before+(800<<20), fmt.Sprintf("df size %d, was %d", now, before)
	})
	handle := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", claim))
	pods, _ := c.pluginPods(t)
	leaderLog := c.containerLog(t, pods[leaderNode])
	if !strings.Contains(leaderLog, "forwarding to the volume's node") || !strings.Contains(leaderLog, handle) {
		t.Errorf("the leader's plugin on %s did not log forwarding %s:\n%s", leaderNode, handle, grepLines(leaderLog, "forward"))
	}
	ownerLog := c.containerLog(t, pods[other])
	if !strings.Contains(ownerLog, `"/fastblk.peer.v1.Peer/ExpandVolume"`) || !strings.Contains(ownerLog, "volume expanded") {
		t.Errorf("the plugin on %s did not serve the forwarded expansion:\n%s", other, grepLines(ownerLog, "expand"))
	}
}

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

// TestPeerRefusesStrangers: each node's plugin serves the peer channel on
// its pod address, and refuses, before any call reaches it, a client
// without a certificate, with one of another CA, with an expired one of
// the installation's CA, and with a valid one naming another namespace or
// another service account. A client with the installation's identity
// gets the plugin's own answer (an ID that is not its volume's refused),
// which proves the refusals are the plugin's and not the network's.
func TestPeerRefusesStrangers(t *testing.T) {
	c := requireChart(t)
	secret := c.k(t, "-n", pluginNS, "get", "secret", release+"-peer-ca", "-o", "jsonpath={.data.ca\\.crt} {.data.ca\\.key}")
	crt, key, _ := strings.Cut(strings.TrimSpace(secret), " ")
	crtPEM, err1 := base64.StdEncoding.DecodeString(crt)
	keyPEM, err2 := base64.StdEncoding.DecodeString(key)
	if err1 != nil || err2 != nil {
		t.Fatalf("peer CA secret: %v %v", err1, err2)
	}
	ca, err := peer.ParseCA(crtPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	other, err := peer.NewCA("another installation", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := c.pluginPods(t)
	target, from := nodes[1], nodes[0]
	ip := c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", pods[target])
	addr := net.JoinHostPort(ip, "9815")
	self := peer.Identity{Namespace: pluginNS, ServiceAccount: release + "-node", Node: from}
	now := time.Now()
	// Every client trusts the installation's CA for the server's
	// certificate, so that what is refused is the certificate it shows.
	creds, err := peer.NewCredentials(ca, self, nil)
	if err != nil {
		t.Fatal(err)
	}
	config := func(issuer *peer.CA, id peer.Identity, from, to time.Time) *tls.Config {
		cfg := creds.ClientConfig(target)
		cert, err := issuer.Issue(id, from, to)
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		return cfg
	}
	valid := func(ca *peer.CA, id peer.Identity) *tls.Config {
		return config(ca, id, now.Add(-time.Minute), now.Add(time.Hour))
	}
	noCert := valid(ca, self)
	noCert.GetClientCertificate = nil
	calls := func() int {
		return strings.Count(c.containerLog(t, pods[target]), `"/fastblk.peer.v1.Peer/ModifyVolume"`)
	}
	before := calls()
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no certificate", noCert},
		{"another CA", valid(other, self)},
		{"expired", config(ca, self, now.Add(-48*time.Hour), now.Add(-24*time.Hour))},
		{"another namespace", valid(ca, peer.Identity{Namespace: testNS, ServiceAccount: self.ServiceAccount, Node: from})},
		{"another service account", valid(ca, peer.Identity{Namespace: pluginNS, ServiceAccount: "default", Node: from})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := peerCall(t, from, addr, tc.cfg)
			if status.Code(err) != codes.Unavailable {
				t.Errorf("call: %v, want Unavailable (handshake refused)", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	if n := calls(); n != before {
		t.Errorf("the plugin on %s logged %d peer calls from refused clients", target, n-before)
	}
	err = peerCall(t, from, addr, valid(ca, self))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not a volume ID of node "+target) {
		t.Errorf("call with the installation's identity: %v, want the plugin's InvalidArgument", err)
	}
	if n := calls(); n != before+1 {
		t.Errorf("the plugin on %s logged %d peer calls after the valid one, want 1", target, n-before)
	}
}
