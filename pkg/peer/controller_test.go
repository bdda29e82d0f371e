package peer

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

var controllerLabels = map[string]string{"app": "fastblk-controller"}

// controllerPod's projected token is controllerToken: the controller's
// pod on n3, account csi-fastblk-controller.
var (
	controllerPod = peertest.Token{Audience: testAudience, Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-controller",
		Node: "n3", Pod: "controller", UID: "uid-controller"}
	controllerToken = peertest.JWT(controllerPod)
)

// controllerAPI is tokenAPI with the controller's pod and its token, the
// authenticator taking it as the controller.
func controllerAPI(t *testing.T) (*peertest.API, *Authenticator) {
	t.Helper()
	api, auth := tokenAPI(t)
	api.Mint(controllerPod)
	api.Put(t, peertest.Pod("csi-fastblk", "controller", "uid-controller", "n3", "csi-fastblk-controller", "127.0.0.1", controllerLabels))
	auth.Controller, auth.ControllerLabels = "csi-fastblk-controller", controllerLabels
	return api, auth
}

// TestTokenControllerMakesOnlyItsCalls: with a controller account set, a
// node's plugin (a stolen node's) may no longer change or grow another
// node's volumes, and the controller's pod makes those calls and nothing
// else: no handoff, no data; a pod of the controller's account without
// its labels, or a server that answers with the controller's token, is
// not taken for it.
func TestTokenControllerMakesOnlyItsCalls(t *testing.T) {
	modify := func(c *Client) error {
		_, err := c.ModifyVolume(callCtx(t), "n2", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n2"})
		return err
	}
	expand := func(c *Client) error {
		_, err := c.ExpandVolume(callCtx(t), "n2", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n2",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
		return err
	}
	handoff := func(c *Client) error {
		_, err := c.CreateVolume(callCtx(t), "n2", &csi.CreateVolumeRequest{Name: "pvc-1"})
		return err
	}
	for _, tc := range []struct {
		name, token, node string
		call              func(*Client) error
		notController     bool // the controller's pod lost its labels
		want              codes.Code
		says              string
	}{
		{name: "controller modifies", token: controllerToken, node: "n3", call: modify, want: codes.OK},
		{name: "controller expands", token: controllerToken, node: "n3", call: expand, want: codes.OK},
		{name: "controller hands off", token: controllerToken, node: "n3", call: handoff, want: codes.PermissionDenied,
			says: "it may only change and grow volumes"},
		{name: "node modifies", token: tokenOf("n1"), node: "n1", call: modify, want: codes.PermissionDenied, says: "only the controller changes and grows volumes"},
		{name: "node expands", token: tokenOf("n1"), node: "n1", call: expand, want: codes.PermissionDenied, says: "only the controller changes and grows volumes"},
		{name: "node hands off", token: tokenOf("n1"), node: "n1", call: handoff, want: codes.OK},
		{name: "controller's token as another node", token: controllerToken, node: "n1", call: modify, want: codes.PermissionDenied,
			says: "the token is of node n3, not n1"},
		{name: "controller's account, not its pod", token: controllerToken, node: "n3", call: modify, notController: true,
			want: codes.PermissionDenied, says: "is not the controller's pod of the installation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, auth := controllerAPI(t)
			if tc.notController {
				api.Put(t, peertest.Pod("csi-fastblk", "controller", "uid-controller", "n3", "csi-fastblk-controller", "127.0.0.1", nil))
			}
			h := &recorder{}
			err := tc.call(tokenPair(t, auth, h, tc.token, tc.node))
			if status.Code(err) != tc.want || (tc.says != "" && !strings.Contains(err.Error(), tc.says)) {
				t.Fatalf("call: %v; want %v saying %q", err, tc.want, tc.says)
			}
			if tc.want != codes.OK {
				if h.count() != 0 {
					t.Error("the handler ran for a refused call")
				}
				return
			}
			if got := h.callers[0]; tc.token == controllerToken && (got.ServiceAccount != "csi-fastblk-controller" || got.Pod != "controller") {
				t.Errorf("the server knows the caller as %v, want the controller's pod", got)
			}
		})
	}
	t.Run("server with the controller's token", func(t *testing.T) {
		_, auth := controllerAPI(t)
		ca := newCA(t)
		addr := serve(t, newCreds(t, ca, n2), &recorder{}, (&Tokens{Self: fixed(controllerToken), Node: "n2", Auth: auth}).ServerOptions()...)
		c := NewClient(newCreds(t, ca, n1), Static{"n2": {Node: "n2", Addr: addr}}).WithTokens(&Tokens{Self: fixed(tokenOf("n1")), Node: "n1", Auth: auth})
		if err := handoff(c); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "its answer is not taken") {
			t.Fatalf("answer of a server with the controller's token: %v; want Unavailable, not taken", err)
		}
	})
}
