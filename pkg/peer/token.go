package peer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Who a peer is comes from a projected service-account token, not from its
// certificate: the kubelet of a node mints tokens only for the pods it
// runs (the NodeRestriction admission plugin), and a token bound to a pod
// carries that pod's name and uid and its node's name, which the API
// server vouches for in a TokenReview. So a stolen plugin credential
// speaks for its own node only. The certificate (tls.go) still encrypts
// and keeps strangers out of the handshake, but the CA that signs it is no
// authority on nodes.
//
// A client sends its token and the node it speaks for with every call; the
// server reviews the token and checks that it is the plugin's service
// account, that its node claim names that node, and that its pod is a
// plugin pod of the installation on that node whose address is the one the
// call came from. The server then sends its own token in its response
// headers, and the client checks it the same way against the node it
// meant and the address it dialed, before it takes the answer.
//
// A token is a bearer credential: whoever it is shown to could show it
// again. Binding it to its pod's address is what keeps a peer (or the
// wrong server) that has seen a token from using it from anywhere else.

// Metadata keys of the peer calls.
const (
	mdAuthorization = "authorization"      // client: "Bearer <token>"
	mdNode          = "fastblk-peer-node"  // client: the node it speaks for; server: the node it answers for
	mdServerToken   = "fastblk-peer-token" // server: its own token
	mdClaim         = "fastblk-peer-claim" // client, ReadData: the claim the data is for, <namespace>/<name>
	extraNode       = "authentication.kubernetes.io/node-name"
	extraPodName    = "authentication.kubernetes.io/pod-name"
	extraPodUID     = "authentication.kubernetes.io/pod-uid"
	saUserPrefix    = "system:serviceaccount:"
	maxTokenLen     = 16 << 10
)

// How long a review and a pod are taken as they were: a token is reviewed
// again after reviewTTL (or its expiry, if sooner), so that a deleted pod's
// token stops working within it; a pod the resolver's watch has not seen
// is read from the API server, and that read is kept for podTTL.
var (
	reviewTTL = time.Minute
	podTTL    = 30 * time.Second
	// reviewTimeout bounds one TokenReview.
	reviewTimeout = 30 * time.Second
)

// maxCached bounds each cache; past it the cache starts afresh.
const maxCached = 4096

// TokenFile returns a source of the token in file, read afresh each time:
// the kubelet replaces a projected token well before it expires.
func TokenFile(file string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("peer token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
}

// Authenticator checks the tokens of peers through the API server.
type Authenticator struct {
	API            dynamic.Interface
	Namespace      string            // the installation's
	ServiceAccount string            // the plugin's
	Audience       string            // the peer channel's token audience
	Labels         map[string]string // every plugin pod has these
	Now            func() time.Time  // nil: time.Now
	// Pods returns the installation's pod of a name as a watch of them
	// last saw it, or nil (PodResolver.Pod). Without it every pod is
	// read from the API server.
	Pods func(name string) *corev1.Pod
	// Controller is the controller's service account ("": none): its
	// pod's token is taken too, from a pod with ControllerLabels, and
	// the server lets it make only the controller's calls (Tokens).
	Controller       string
	ControllerLabels map[string]string
	// Reviews is the client TokenReviews are asked through, with a
	// client-side rate limit of its own (ReviewQPS); nil: API.
	Reviews dynamic.Interface
	// ReviewsPerPeer and ReviewBurst bound the reviews the tokens from
	// one address may cost (reviews.go); zero: 1 a second, 5 at once.
	ReviewsPerPeer rate.Limit
	ReviewBurst    int

	asking   singleflight.Group // reviews being asked, by token hash
	mu       sync.Mutex
	reviews  map[[32]byte]review   // accepted
	refused  map[[32]byte]review   // refused by the API server, apart so that they evict no accepted one
	inflight map[[32]byte]struct{} // being asked
	limiters map[string]*rate.Limiter
	pods     map[string]cachedPod // by uid
}

// review is what a TokenReview said of a token, and until when it holds.
type review struct {
	node, pod, uid string
	sa             string // the token's service account
	err            error
	until          time.Time
}

type cachedPod struct {
	p     *corev1.Pod
	until time.Time
}

// ErrUnauthenticated is the class of a token that does not say who the
// peer is: none, unreadable, refused by the API server (expired, of
// another audience, of a deleted pod).
var ErrUnauthenticated = errors.New("peer not authenticated")

// ErrNotThatPlugin is the class of a valid token of someone other than
// the plugin of the node it is used for.
var ErrNotThatPlugin = errors.New("not the plugin of that node")

// Verify returns the identity of the plugin pod whose token is token,
// which must speak for node and be used from its pod's address from (nil
// skips that check: only for a token not received over the network). The
// error wraps ErrUnauthenticated or ErrNotThatPlugin, or is Unavailable
// when the API server cannot say.
func (a *Authenticator) Verify(ctx context.Context, token, node string, from net.IP) (Identity, error) {
	if token == "" || len(token) > maxTokenLen {
		return Identity{}, fmt.Errorf("%w: no token", ErrUnauthenticated)
	}
	if !validName(node) {
		return Identity{}, fmt.Errorf("%w: no valid node named (%q)", ErrUnauthenticated, node)
	}
	if err := a.precheck(token, node); err != nil {
		return Identity{}, err
	}
	r, err := a.review(ctx, token, from)
	if err != nil {
		return Identity{}, err
	}
	if r.err != nil {
		return Identity{}, r.err
	}
	if r.node != node {
		return Identity{}, fmt.Errorf("%w: the token is of node %s, not %s", ErrNotThatPlugin, r.node, node)
	}
	p, err := a.pod(ctx, r.pod, r.uid)
	if err != nil {
		return Identity{}, err
	}
	labels, what := a.Labels, "a plugin pod"
	if r.sa == a.Controller {
		labels, what = a.ControllerLabels, "the controller's pod"
	}
	switch {
	case p.Spec.NodeName != node:
		return Identity{}, fmt.Errorf("%w: pod %s runs on node %q, not %s", ErrNotThatPlugin, r.pod, p.Spec.NodeName, node)
	case p.Spec.ServiceAccountName != r.sa:
		return Identity{}, fmt.Errorf("%w: pod %s runs as %q", ErrNotThatPlugin, r.pod, p.Spec.ServiceAccountName)
	}
	for k, v := range labels {
		if p.Labels[k] != v {
			return Identity{}, fmt.Errorf("%w: pod %s is not %s of the installation (label %s)", ErrNotThatPlugin, r.pod, what, k)
		}
	}
	if from != nil && !slices.ContainsFunc(p.Status.PodIPs, func(ip corev1.PodIP) bool {
		return net.ParseIP(ip.IP).Equal(from)
	}) {
		return Identity{}, fmt.Errorf("%w: the token of pod %s is used from %s, not its address", ErrNotThatPlugin, r.pod, from)
	}
	return Identity{Namespace: a.Namespace, ServiceAccount: r.sa, Node: node, Pod: r.pod}, nil
}

func (a *Authenticator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// review returns the API server's review of token, which came from
// address from: an acceptance cached until the earlier of reviewTTL and
// the token's expiry, a refusal until the earlier of refusedTTL and the
// expiry, so that a peer repeating a bad token costs one review. Calls
// that find no review wait for the one asked for their token, so a peer
// opening many streams at once costs one review too. A review not cached
// nor being asked takes a place of its address's limit (allowReview).
// Only a failure to ask is an error of its own.
func (a *Authenticator) review(ctx context.Context, token string, from net.IP) (review, error) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	if r, ok := a.cached(key, now); ok {
		a.mu.Unlock()
		return r, nil
	}
	if _, joining := a.inflight[key]; !joining {
		if err := a.allowReview(from); err != nil {
			a.mu.Unlock()
			return review{}, err
		}
		if a.inflight == nil {
			a.inflight = map[[32]byte]struct{}{}
		}
		a.inflight[key] = struct{}{}
	}
	a.mu.Unlock()
	asked := a.asking.DoChan(string(key[:]), func() (any, error) {
		a.mu.Lock()
		r, ok := a.cached(key, now)
		if ok { // asked and answered since this call looked
			delete(a.inflight, key)
		}
		a.mu.Unlock()
		if ok {
			return r, nil
		}
		// The review serves every call waiting for it, so no one
		// caller's end cuts it short.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		r, err := a.ask(ctx, token)
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.inflight, key)
		if err != nil {
			return review{}, err
		}
		cache, ttl := &a.reviews, reviewTTL
		if r.err != nil {
			cache, ttl = &a.refused, refusedTTL
		}
		r.until = now.Add(ttl)
		if c, err := readClaims(token); err == nil && time.Unix(c.Exp, 0).Before(r.until) {
			r.until = time.Unix(c.Exp, 0)
		}
		if *cache == nil || len(*cache) >= maxCached {
			*cache = make(map[[32]byte]review)
		}
		(*cache)[key] = r
		return r, nil
	})
	select {
	case res := <-asked:
		return res.Val.(review), res.Err
	case <-ctx.Done():
		return review{}, status.FromContextError(ctx.Err()).Err()
	}
}

// cached is the review of the token key that holds at now, if any. The
// caller holds a.mu.
func (a *Authenticator) cached(key [32]byte, now time.Time) (review, bool) {
	for _, m := range []map[[32]byte]review{a.reviews, a.refused} {
		if r, ok := m[key]; ok && now.Before(r.until) {
			return r, true
		}
	}
	return review{}, false
}

// ask sends a TokenReview of token for the audience and reads its answer.
func (a *Authenticator) ask(ctx context.Context, token string) (review, error) {
	api := a.Reviews
	if api == nil {
		api = a.API
	}
	tr, err := kubeapi.Create(ctx, api, kubeapi.TokenReviews, "", &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{a.Audience}},
	})
	if err != nil {
		return review{}, status.Errorf(codes.Unavailable, "review a peer's token: %v", err)
	}
	st := tr.Status
	refuse := func(format string, args ...any) (review, error) {
		return review{err: fmt.Errorf(format, args...)}, nil
	}
	switch {
	case !st.Authenticated:
		return refuse("%w: the API server refused the token: %s", ErrUnauthenticated, st.Error)
	case !slices.Contains(st.Audiences, a.Audience):
		return refuse("%w: the token is not for the audience %s", ErrUnauthenticated, a.Audience)
	}
	sa, ok := strings.CutPrefix(st.User.Username, saUserPrefix+a.Namespace+":")
	if !ok || (sa != a.ServiceAccount && (a.Controller == "" || sa != a.Controller)) {
		return refuse("%w: the token is of %s, not of the plugin's service account", ErrNotThatPlugin, st.User.Username)
	}
	one := func(k string) string {
		if v := st.User.Extra[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	r := review{sa: sa, node: one(extraNode), pod: one(extraPodName), uid: one(extraPodUID)}
	if !validName(r.node) || !validName(r.pod) || r.uid == "" {
		return refuse("%w: the token is not bound to a pod and its node (a projected token is)", ErrNotThatPlugin)
	}
	return r, nil
}

// pod returns the pod name of the installation's namespace if its uid is
// uid: as the watch saw it, or else read from the API server and kept for
// podTTL (a pod the watch has not brought yet).
func (a *Authenticator) pod(ctx context.Context, name, uid string) (*corev1.Pod, error) {
	if a.Pods != nil {
		if p := a.Pods(name); p != nil && string(p.UID) == uid {
			return p, nil
		}
	}
	now := a.now()
	a.mu.Lock()
	c, ok := a.pods[uid]
	a.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.p, nil
	}
	p, err := kubeapi.Get[corev1.Pod](ctx, a.API, kubeapi.Pods, a.Namespace, name)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: pod %s/%s of the token does not exist", ErrNotThatPlugin, a.Namespace, name)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "get the pod of a peer's token: %v", err)
	}
	if string(p.UID) != uid {
		return nil, fmt.Errorf("%w: pod %s/%s is not the token's (uid %s)", ErrNotThatPlugin, a.Namespace, name, uid)
	}
	a.mu.Lock()
	if a.pods == nil || len(a.pods) >= maxCached {
		a.pods = make(map[string]cachedPod)
	}
	a.pods[uid] = cachedPod{p: p, until: now.Add(podTTL)}
	a.mu.Unlock()
	return p, nil
}

// authCode is the gRPC code of an authentication error: Unauthenticated
// for a token that says nothing, PermissionDenied for one of someone
// else, and the API server's trouble as it is (Unavailable).
func authCode(err error) codes.Code {
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, ErrNotThatPlugin):
		return codes.PermissionDenied
	}
	return status.Code(err)
}
