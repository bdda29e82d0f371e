package peer

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

const testAudience = "peer.fastblk.csi.io/csi-fastblk"

var plugin = map[string]string{"app": "fastblk"}

// pluginToken is what the API server knows of the projected token of the
// plugin pod on node; tokenOf is that token.
func pluginToken(node string) peertest.Token {
	return peertest.Token{Audience: testAudience, Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node",
		Node: node, Pod: "plugin-" + node, UID: "uid-" + node}
}

func tokenOf(node string) string { return peertest.JWT(pluginToken(node)) }

// tokenAPI is an API server that knows a plugin pod on each of n1, n2 and
// n3 (all at 127.0.0.1) and their projected tokens (tokenOf), and the
// authenticator of the installation against it.
func tokenAPI(t *testing.T) (*peertest.API, *Authenticator) {
	t.Helper()
	api := peertest.New()
	for _, n := range []string{"n1", "n2", "n3"} {
		api.Mint(pluginToken(n))
		api.Put(t, pluginPod(n, "uid-"+n, "127.0.0.1", plugin))
	}
	auth := &Authenticator{API: api.Client, Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node", Audience: testAudience, Labels: plugin}
	return api, auth
}

// pluginPod is the plugin pod plugin-<node>.
func pluginPod(node, uid, ip string, labels map[string]string) *corev1.Pod {
	return peertest.Pod("csi-fastblk", "plugin-"+node, uid, node, "csi-fastblk-node", ip, labels)
}

func fixed(token string) func() (string, error) { return func() (string, error) { return token, nil } }

// tokenPair serves h as n2's plugin with n2's token, and returns a client
// of n1's that sends token as node.
func tokenPair(t *testing.T, auth *Authenticator, h Handler, token, node string) *Client {
	t.Helper()
	ca := newCA(t)
	addr := serve(t, newCreds(t, ca, n2), h, (&Tokens{Self: fixed(tokenOf("n2")), Node: "n2", Auth: auth}).ServerOptions()...)
	return NewClient(newCreds(t, ca, n1), Static{"n2": {Node: "n2", Addr: addr}}).WithTokens(&Tokens{Self: fixed(token), Node: node, Auth: auth})
}

// TestTokenProvesTheNode: a call with the projected token of n1's plugin
// pod, made as n1 from that pod's address, is served, and the server
// knows its caller as that pod on n1; every other token, or n1's token
// used for another node or from elsewhere, is refused before the call
// runs: one that says nothing (none, expired, another audience) with
// Unauthenticated, one of someone else with PermissionDenied.
func TestTokenProvesTheNode(t *testing.T) {
	old, api, other := pluginToken("n1"), pluginToken("n1"), pluginToken("n1")
	old.Expired = true
	api.Audience = "https://kubernetes.default.svc"
	other.ServiceAccount, other.Pod, other.UID = "default", "app", "uid-app"
	forged := pluginToken("n1")
	forged.UID = "uid-forged" // a JWT the API server never issued
	for _, tc := range []struct {
		name, token, node string
		change            func(*testing.T, *peertest.API)
		want              codes.Code
		says              string
	}{
		{name: "own node", token: tokenOf("n1"), node: "n1", want: codes.OK},
		{name: "n1's token as n2", token: tokenOf("n1"), node: "n2", want: codes.PermissionDenied, says: "the token is of node n1, not n2"},
		{name: "n1's token as n3", token: tokenOf("n1"), node: "n3", want: codes.PermissionDenied, says: "the token is of node n1, not n3"},
		{name: "no token", token: "", node: "n1", want: codes.Unauthenticated, says: "no token"},
		{name: "junk", token: "forged", node: "n1", want: codes.Unauthenticated, says: "not a JWT"},
		{name: "unknown token", token: peertest.JWT(forged), node: "n1", want: codes.Unauthenticated, says: "invalid bearer token"},
		{name: "expired", token: peertest.JWT(old), node: "n1", want: codes.Unauthenticated, says: "expired",
			change: func(t *testing.T, a *peertest.API) { a.Mint(old) }},
		{name: "another audience", token: peertest.JWT(api), node: "n1", want: codes.Unauthenticated, says: "not for the audience " + testAudience,
			change: func(t *testing.T, a *peertest.API) { a.Mint(api) }},
		{name: "another service account", token: peertest.JWT(other), node: "n1", want: codes.PermissionDenied, says: "system:serviceaccount:csi-fastblk:default",
			change: func(t *testing.T, a *peertest.API) { a.Mint(other) }},
		{name: "pod replaced", token: tokenOf("n1"), node: "n1", want: codes.PermissionDenied, says: "is not the token's",
			change: func(t *testing.T, a *peertest.API) {
				a.Put(t, pluginPod("n1", "uid-new", "127.0.0.1", plugin))
			}},
		{name: "pod deleted", token: tokenOf("n1"), node: "n1", want: codes.PermissionDenied, says: "does not exist",
			change: func(t *testing.T, a *peertest.API) { a.Remove(t, pluginPod("n1", "uid-n1", "127.0.0.1", plugin)) }},
		{name: "not a plugin pod", token: tokenOf("n1"), node: "n1", want: codes.PermissionDenied, says: "not a plugin pod",
			change: func(t *testing.T, a *peertest.API) {
				a.Put(t, pluginPod("n1", "uid-n1", "127.0.0.1", nil))
			}},
		{name: "from another address", token: tokenOf("n1"), node: "n1", want: codes.PermissionDenied, says: "not its address",
			change: func(t *testing.T, a *peertest.API) {
				a.Put(t, pluginPod("n1", "uid-n1", "10.1.2.3", plugin))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, auth := tokenAPI(t)
			if tc.change != nil {
				tc.change(t, api) // before any call
			}
			h := &recorder{}
			c := tokenPair(t, auth, h, tc.token, tc.node)
			_, err := c.ModifyVolume(callCtx(t), "n2", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n2"})
			if status.Code(err) != tc.want || (tc.says != "" && !strings.Contains(err.Error(), tc.says)) {
				t.Fatalf("call: %v; want %v saying %q", err, tc.want, tc.says)
			}
			if tc.want != codes.OK {
				if h.count() != 0 {
					t.Errorf("the handler ran for a refused call")
				}
				return
			}
			if got := h.callers[0]; got.Node != "n1" || got.Pod != "plugin-n1" {
				t.Errorf("the server knows the caller as %v, want plugin-n1 on n1", got)
			}
		})
	}
}

// TestTokenProvesTheServer: the client takes an answer, unary or a
// stream's data, only from the plugin pod of the node it meant: a server
// with the token of another node's plugin (a stale address, or a stolen
// node answering for another), or with none, is not believed.
func TestTokenProvesTheServer(t *testing.T) {
	src, _ := sparseSource(t, 1<<20, [][2]int64{{0, 4096}})
	for _, tc := range []struct {
		name   string
		server *Tokens // nil: no token at all
	}{
		{"another node's token", &Tokens{Self: fixed(tokenOf("n3")), Node: "n3"}},
		{"another node's token, naming the node meant", &Tokens{Self: fixed(tokenOf("n3")), Node: "n2"}},
		{"no token", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, auth := tokenAPI(t)
			ca := newCA(t)
			var opts []grpc.ServerOption
			if tc.server != nil {
				tc.server.Auth = auth
				opts = tc.server.ServerOptions()
			}
			// It also answers snapshot metadata (for s1-n1).
			h := &metadataRecorder{recorder: recorder{files: map[string]string{"s1-n2": src}}, pages: 2}
			addr := serve(t, newCreds(t, ca, n2), h, opts...)
			c := NewClient(newCreds(t, ca, n1), Static{"n2": {Node: "n2", Addr: addr}}).
				WithTokens(&Tokens{Self: fixed(tokenOf("n1")), Node: "n1", Auth: auth})
			_, err := c.ExpandVolume(callCtx(t), "n2", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n2", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
			if status.Code(err) != codes.Unavailable {
				t.Errorf("ExpandVolume: %v; want Unavailable (the answer not taken)", err)
			}
			sink := newFileSink(t)
			if _, err := c.ReadData(callCtx(t), "n2", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n2", Target: "pvc-x"}, sink, time.Minute); status.Code(err) != codes.Unavailable {
				t.Errorf("ReadData: %v; want Unavailable", err)
			}
			if sink.progress.Load() != 0 {
				t.Errorf("%d bytes of data taken from a server that did not prove its node", sink.progress.Load())
			}
			taken := 0
			err = c.GetMetadataAllocated(callCtx(t), "n2", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1-n1"},
				func(*csi.GetMetadataAllocatedResponse) error { taken++; return nil })
			if err == nil || taken != 0 {
				t.Errorf("GetMetadataAllocated: %v, %d answers taken; want an error and none", err, taken)
			}
		})
	}
}

// TestTokenReadDataClaim: a stream's caller is the node its token proves,
// and the claim the data is for reaches the server's Handler.
func TestTokenReadDataClaim(t *testing.T) {
	src, _ := sparseSource(t, 1<<20, [][2]int64{{0, 4096}})
	_, auth := tokenAPI(t)
	h := &recorder{files: map[string]string{"s1-n2": src}}
	c := tokenPair(t, auth, h, tokenOf("n1"), "n1")
	if _, err := c.ReadData(callCtx(t), "n2", &ReadRequest{Kind: SourceSnapshot, ID: "s1-n2", Target: "pvc-x", Claim: "shop/data"}, newFileSink(t), time.Minute); err != nil {
		t.Fatalf("ReadData: %v", err)
	}
	if r := h.calls[0].(*ReadRequest); r.Claim != "shop/data" || h.callers[0].Node != "n1" || h.callers[0].Pod != "plugin-n1" {
		t.Errorf("the server got %+v from %v; want the claim shop/data from plugin-n1 on n1", r, h.callers[0])
	}
}

// TestTokenReviewsCached: a token is reviewed once while its review
// holds, again after reviewTTL, and its review is never taken past its
// own expiry.
func TestTokenReviewsCached(t *testing.T) {
	api, auth := tokenAPI(t)
	var mu sync.Mutex
	now := time.Now()
	auth.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c := tokenPair(t, auth, &recorder{}, tokenOf("n1"), "n1")
	call := func() {
		t.Helper()
		if _, err := c.ModifyVolume(callCtx(t), "n2", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n2"}); err != nil {
			t.Fatal(err)
		}
	}
	reviews := func() int { return api.Calls("create", "tokenreviews") }
	call()
	call()
	call()
	if got := reviews(); got != 2 { // the client's token at the server, the server's at the client
		t.Errorf("3 calls: %d reviews, want 2", got)
	}
	mu.Lock()
	now = now.Add(reviewTTL + time.Second)
	mu.Unlock()
	call()
	if got := reviews(); got != 4 {
		t.Errorf("after the reviews' lifetime: %d reviews, want 4", got)
	}

	short := pluginToken("n1")
	short.Exp = now.Add(10 * time.Second)
	soon := api.Mint(short)
	ctx := context.Background()
	if _, err := auth.Verify(ctx, soon, "n1", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	before := reviews()
	if _, err := auth.Verify(ctx, soon, "n1", nil); authCode(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Errorf("a token past its expiry, its review cached: %v; want Unauthenticated (expired)", err)
	}
	if reviews() != before {
		t.Error("a token past its expiry was reviewed")
	}
}

// TestTokenPodFromWatch: with the resolver's watch of the plugin pods the
// server checks a caller's pod from it and reads no pod from the API
// server; a pod the watch does not have (yet) is read.
func TestTokenPodFromWatch(t *testing.T) {
	api, auth := tokenAPI(t)
	auth.Pods = startResolver(t, api, func(n string) string { return n }).Pod
	ctx := context.Background()
	if id, err := auth.Verify(ctx, tokenOf("n1"), "n1", nil); err != nil || id.Pod != "plugin-n1" {
		t.Fatalf("Verify: %v, %v", id, err)
	}
	if got := api.Calls("get", "pods"); got != 0 {
		t.Errorf("%d GETs of pods with the watch, want none", got)
	}
	auth.Pods = func(string) *corev1.Pod { return nil }
	if _, err := auth.Verify(ctx, tokenOf("n2"), "n2", nil); err != nil {
		t.Fatal(err)
	}
	if got := api.Calls("get", "pods"); got != 1 {
		t.Errorf("%d GETs of a pod the watch lacks, want 1", got)
	}
}

// TestTokenReviewedOnceWhenCallsArrive: many calls with one token that
// arrive together (a peer opening its streams) cost one TokenReview, not
// one each: the calls wait for the first review instead of each asking
// the API server, whose client-side limit would otherwise space them.
func TestTokenReviewedOnceWhenCallsArrive(t *testing.T) {
	api, auth := tokenAPI(t)
	api.Client.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		time.Sleep(50 * time.Millisecond) // an API server's round trip
		return false, nil, nil            // the review itself is peertest's
	})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := auth.Verify(context.Background(), tokenOf("n1"), "n1", nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := api.Calls("create", "tokenreviews"); got != 1 {
		t.Errorf("50 calls arriving together: %d reviews, want 1", got)
	}
}
