package peer

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What a peer's tokens may cost the API server, and the plugin's own
// client of it, is bounded (docs/peer.md, "Bounded reviews"): anyone who
// reaches the peer port may send tokens, and each new one would be a
// TokenReview. So a token is first read for what it says of itself, its
// signature unchecked, and refused when that alone rules it out (precheck:
// only ever a refusal, never an acceptance); a refusal the API server gave
// is remembered for refusedTTL; and the reviews a peer's address may ask
// for are limited (ReviewsPerPeer, ReviewBurst), and go through a client
// of their own (Authenticator.Reviews), so that the plugin's other calls
// keep their client-side limit whatever peers send.

// The defaults of the per-address limit. A plugin's token is reviewed
// about once a minute by each peer it calls (reviewTTL), so one a second
// is far above what a peer needs.
const (
	defaultReviewsPerPeer rate.Limit = 1
	defaultReviewBurst    int        = 5
)

// ReviewQPS and ReviewBurst are the client-side limit the plugin gives the
// client of its peers' TokenReviews, apart from its other calls'.
const (
	ReviewQPS   = 10
	ReviewBurst = 20
)

// refusedTTL is how long a token the API server refused stays refused
// without a review (never past its expiry): longer than an accepted
// review's reviewTTL, which bounds how long a deleted pod's token works.
var refusedTTL = 10 * time.Minute

// tokenClaims are the claims of a projected service account token the
// precheck reads.
type tokenClaims struct {
	Aud audiences `json:"aud"`
	Exp int64     `json:"exp"`
	Nbf int64     `json:"nbf"`
	K8s *struct {
		Namespace      string `json:"namespace"`
		Node           *named `json:"node"`
		Pod            *named `json:"pod"`
		ServiceAccount *named `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

type named struct {
	Name string `json:"name"`
}

// audiences is a JWT's aud: one string or a list of them.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audiences{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

// readClaims reads the claims of a JWT, its signature unchecked: three
// base64url parts, a header that names a signing algorithm, claims that
// are a JSON object.
func readClaims(token string) (tokenClaims, error) {
	var c tokenClaims
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return c, fmt.Errorf("%w: the token is not a JWT", ErrUnauthenticated)
	}
	var header struct {
		Alg string `json:"alg"`
	}
	h, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	p, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	_, err3 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || json.Unmarshal(h, &header) != nil || header.Alg == "" || header.Alg == "none" ||
		json.Unmarshal(p, &c) != nil {
		return c, fmt.Errorf("%w: the token is not a JWT", ErrUnauthenticated)
	}
	return c, nil
}

// precheck refuses a token that cannot be a projected token of the
// plugin's (or the controller's) service account for the audience, live
// now, for node, by what it says of itself.
func (a *Authenticator) precheck(token, node string) error {
	c, err := readClaims(token)
	if err != nil {
		return err
	}
	now := a.now()
	switch exp := time.Unix(c.Exp, 0); {
	case c.Exp == 0 || !now.Before(exp):
		return fmt.Errorf("%w: the token expired (at %v)", ErrUnauthenticated, exp.UTC())
	case c.Nbf != 0 && time.Unix(c.Nbf, 0).After(now.Add(clockSkew)): // the certificates' allowance
		return fmt.Errorf("%w: the token is not valid before %v", ErrUnauthenticated, time.Unix(c.Nbf, 0).UTC())
	case !slices.Contains(c.Aud, a.Audience):
		return fmt.Errorf("%w: the token is not for the audience %s", ErrUnauthenticated, a.Audience)
	case c.K8s == nil || c.K8s.Pod == nil || c.K8s.Node == nil || c.K8s.ServiceAccount == nil:
		return fmt.Errorf("%w: the token names no pod and node (a projected token does)", ErrUnauthenticated)
	case c.K8s.Namespace != a.Namespace || (c.K8s.ServiceAccount.Name != a.ServiceAccount && (a.Controller == "" || c.K8s.ServiceAccount.Name != a.Controller)):
		return fmt.Errorf("%w: the token is of %s%s:%s, not of the plugin's service account", ErrNotThatPlugin, saUserPrefix, c.K8s.Namespace, c.K8s.ServiceAccount.Name)
	case c.K8s.Node.Name != node:
		return fmt.Errorf("%w: the token is of node %s, not %s", ErrNotThatPlugin, c.K8s.Node.Name, node)
	}
	return nil
}

// allowReview takes a place for a review of a token that came from
// address from (nil: not over the network), or says that its limit is
// full. The caller holds a.mu.
func (a *Authenticator) allowReview(from net.IP) error {
	perPeer, burst := a.ReviewsPerPeer, a.ReviewBurst
	if perPeer == 0 {
		perPeer = defaultReviewsPerPeer
	}
	if burst == 0 {
		burst = defaultReviewBurst
	}
	key := from.String()
	l := a.limiters[key]
	if l == nil {
		if a.limiters == nil || len(a.limiters) >= maxCached {
			a.limiters = map[string]*rate.Limiter{}
		}
		l = rate.NewLimiter(perPeer, burst)
		a.limiters[key] = l
	}
	if !l.AllowN(a.now(), 1) {
		return status.Errorf(codes.Unavailable, "the tokens from %s need more token reviews than a peer may ask for (%v a second, %d at once); retry later", key, perPeer, burst)
	}
	return nil
}
