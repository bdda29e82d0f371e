package peer

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer/peertest"
)

// forgedToken is a token no one issued that passes every check short of
// its signature: n1's plugin token's claims with a jti of its own.
func forgedToken(i int) string {
	tok := pluginToken("n1")
	tok.UID = fmt.Sprintf("uid-forged-%d", i)
	return peertest.JWT(tok)
}

// TestTokenShapeCheckedBeforeReview: a token that cannot be a projected
// token of the installation's plugin for the node it speaks for, by what
// it says of itself (its shape, expiry, audience, service account and
// node, read without its signature), is refused without a TokenReview.
// Before, each cost one.
func TestTokenShapeCheckedBeforeReview(t *testing.T) {
	api, auth := tokenAPI(t)
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	valid := strings.Split(tokenOf("n1"), ".")
	with := func(change func(*peertest.Token)) string {
		tok := pluginToken("n1")
		change(&tok)
		return peertest.JWT(tok)
	}
	for _, tc := range []struct {
		name, token string
		want        codes.Code
		says        string
	}{
		{"junk", "0123456789abcdef0123456789abcdef", codes.Unauthenticated, "not a JWT"},
		{"two parts", valid[0] + "." + valid[1], codes.Unauthenticated, "not a JWT"},
		{"not base64", "!!." + valid[1] + "." + valid[2], codes.Unauthenticated, "not a JWT"},
		{"no signature", valid[0] + "." + valid[1] + ".", codes.Unauthenticated, "not a JWT"},
		{"unsigned", enc(`{"alg":"none"}`) + "." + valid[1] + "." + valid[2], codes.Unauthenticated, "not a JWT"},
		{"claims not JSON", valid[0] + "." + enc("exp") + "." + valid[2], codes.Unauthenticated, "not a JWT"},
		{"no expiry", valid[0] + "." + enc(`{"aud":["`+testAudience+`"]}`) + "." + valid[2], codes.Unauthenticated, "expired"},
		{"expired", with(func(t *peertest.Token) { t.Exp = time.Now().Add(-time.Second) }), codes.Unauthenticated, "expired"},
		{"another audience", with(func(t *peertest.Token) { t.Audience = "https://kubernetes.default.svc" }), codes.Unauthenticated,
			"not for the audience " + testAudience},
		{"no pod", valid[0] + "." + enc(`{"aud":"`+testAudience+`","exp":4102444800}`) + "." + valid[2], codes.Unauthenticated, "names no pod"},
		{"another namespace", with(func(t *peertest.Token) { t.Namespace = "default" }), codes.PermissionDenied,
			"the token is of system:serviceaccount:default:csi-fastblk-node"},
		{"another service account", with(func(t *peertest.Token) { t.ServiceAccount = "default" }), codes.PermissionDenied,
			"the token is of system:serviceaccount:csi-fastblk:default"},
		{"another node", tokenOf("n2"), codes.PermissionDenied, "the token is of node n2, not n1"},
		{"too long", strings.Repeat("a", maxTokenLen+1), codes.Unauthenticated, "no token"},
	} {
		_, err := auth.Verify(context.Background(), tc.token, "n1", net.IPv4(10, 0, 0, 1))
		if code := authCode(err); code != tc.want || !strings.Contains(fmt.Sprint(err), tc.says) {
			t.Errorf("%s: %v (%v); want %v saying %q", tc.name, err, code, tc.want, tc.says)
		}
	}
	if got := api.Calls("create", "tokenreviews"); got != 0 {
		t.Errorf("%d TokenReviews for tokens refused by their shape, want none", got)
	}
	if _, err := auth.Verify(context.Background(), tokenOf("n1"), "n1", nil); err != nil {
		t.Errorf("n1's token: %v", err)
	}
}

// TestTokenRefusalRemembered: a token the API server refused is refused
// again without a review for refusedTTL (past reviewTTL, which bounds an
// accepted review), never past its expiry.
func TestTokenRefusalRemembered(t *testing.T) {
	api, auth := tokenAPI(t)
	var mu sync.Mutex
	now := time.Now()
	auth.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	later := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	forged := forgedToken(0)
	verify := func() {
		t.Helper()
		if _, err := auth.Verify(context.Background(), forged, "n1", nil); authCode(err) != codes.Unauthenticated {
			t.Fatalf("a forged token: %v, want Unauthenticated", err)
		}
	}
	reviews := func() int { return api.Calls("create", "tokenreviews") }
	verify()
	verify()
	later(reviewTTL + time.Second)
	verify()
	if got := reviews(); got != 1 {
		t.Errorf("a refused token asked again after %v: %d reviews, want 1", reviewTTL+time.Second, got)
	}
	later(refusedTTL)
	verify()
	if got := reviews(); got != 2 {
		t.Errorf("a refused token asked after %v: %d reviews, want 2", refusedTTL+reviewTTL, got)
	}
}

// TestTokenReviewsLimitedPerPeer: the tokens of one address that need a
// review get at most ReviewBurst at once and ReviewsPerPeer a second;
// beyond, Unavailable without a review, while another address gets
// reviews of its own and tokens already reviewed are served from the
// cache. Before, every token of the flood cost a review.
func TestTokenReviewsLimitedPerPeer(t *testing.T) {
	api, auth := tokenAPI(t)
	var mu sync.Mutex
	now := time.Now()
	auth.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ctx := context.Background()
	flooder, other := net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 2) // the plugin pods' address, and another
	if _, err := auth.Verify(ctx, tokenOf("n1"), "n1", flooder); err != nil {
		t.Fatal(err) // reviewed, then cached
	}
	limited := 0
	for i := range 20 {
		_, err := auth.Verify(ctx, forgedToken(i), "n1", flooder)
		switch {
		case status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "token reviews"):
			limited++
		case authCode(err) != codes.Unauthenticated:
			t.Fatalf("forged token %d: %v", i, err)
		}
	}
	reviews := api.Calls("create", "tokenreviews")
	if want := defaultReviewBurst - 1; reviews-1 != want || limited != 20-want {
		t.Errorf("20 forged tokens from one address: %d reviewed, %d refused for the limit; want %d and %d", reviews-1, limited, want, 20-want)
	}
	if _, err := auth.Verify(ctx, tokenOf("n1"), "n1", flooder); err != nil {
		t.Errorf("the flooder's reviewed token: %v", err)
	}
	if _, err := auth.Verify(ctx, forgedToken(100), "n1", other); authCode(err) != codes.Unauthenticated {
		t.Errorf("a forged token from another address: %v, want its review's refusal", err)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if _, err := auth.Verify(ctx, forgedToken(101), "n1", flooder); authCode(err) != codes.Unauthenticated {
		t.Errorf("a forged token from the flooder a second later: %v, want its review's refusal", err)
	}
}

// TestTokenReviewsDoNotEvictEachOther: a flood of refused tokens (from
// many addresses, past the cache's bound) does not cost the accepted
// reviews their place: a peer's token is not reviewed again within its
// review's life.
func TestTokenReviewsDoNotEvictEachOther(t *testing.T) {
	api, auth := tokenAPI(t)
	ctx := context.Background()
	if _, err := auth.Verify(ctx, tokenOf("n1"), "n1", nil); err != nil {
		t.Fatal(err)
	}
	const n = maxCached + 100
	for i := range n {
		if _, err := auth.Verify(ctx, forgedToken(i), "n1", net.IPv4(10, 1, byte(i>>8), byte(i))); authCode(err) != codes.Unauthenticated {
			t.Fatalf("forged token %d: %v", i, err)
		}
	}
	if _, err := auth.Verify(ctx, tokenOf("n1"), "n1", nil); err != nil {
		t.Fatal(err)
	}
	if got := api.Calls("create", "tokenreviews"); got != n+1 {
		t.Errorf("%d reviews, want %d: n1's token reviewed again after %d refusals", got, n+1, n)
	}
}

// TestTokenReviewsOwnClient: TokenReviews go to the Authenticator's
// Reviews client (its own client-side rate limit), the other reads to
// API.
func TestTokenReviewsOwnClient(t *testing.T) {
	api, auth := tokenAPI(t)
	reviewer := peertest.New()
	reviewer.Mint(pluginToken("n1"))
	auth.Reviews = reviewer.Client
	if _, err := auth.Verify(context.Background(), tokenOf("n1"), "n1", nil); err != nil {
		t.Fatal(err)
	}
	if a, r := api.Calls("create", "tokenreviews"), reviewer.Calls("create", "tokenreviews"); a != 0 || r != 1 {
		t.Errorf("reviews through the plugin's client %d, through its own %d; want 0 and 1", a, r)
	}
}

// TestHeaderListBounded: the peer server takes a call's headers up to
// maxHeaderList (32 KiB; gRPC's default is 16 MiB), and refuses more
// before any check of the call runs.
func TestHeaderListBounded(t *testing.T) {
	_, auth := tokenAPI(t)
	h := &recorder{}
	c := tokenPair(t, auth, h, tokenOf("n1"), "n1")
	call := func(pad int) error {
		ctx := metadata.AppendToOutgoingContext(callCtx(t), "x-pad", strings.Repeat("p", pad))
		_, err := c.ModifyVolume(ctx, "n2", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n2"})
		return err
	}
	if err := call(8 << 10); err != nil {
		t.Fatalf("a call with 8 KiB of headers: %v", err)
	}
	if err := call(40 << 10); err == nil || h.count() != 1 {
		t.Errorf("a call with 40 KiB of headers: %v, %d calls handled; want it refused and 1 handled", err, h.count())
	}
}
