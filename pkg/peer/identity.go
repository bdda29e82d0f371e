package peer

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// identityHost is the host of every identity URI, so that a certificate
// of the peer CA made for anything else is never taken for a peer.
const identityHost = "peer.fastblk.csi.io"

// Identity is who a peer is: a plugin of the installation in Namespace,
// running as ServiceAccount, on Node. A certificate's identity is taken
// as the installation's (its CA is on every node); the node of a call is
// the one its token proves (token.go), which also names the plugin's Pod.
type Identity struct {
	Namespace, ServiceAccount, Node string
	Pod                             string // the plugin pod, for an identity proved by a token
}

// URI is the identity as a certificate's URI SAN:
// fastblk://peer.fastblk.csi.io/ns/<namespace>/sa/<service account>/node/<node>.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: "fastblk", Host: identityHost,
		Path: "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount + "/node/" + id.Node}
}

func (id Identity) String() string {
	if id.Pod != "" {
		return fmt.Sprintf("%s/%s on node %s (pod %s)", id.Namespace, id.ServiceAccount, id.Node, id.Pod)
	}
	return fmt.Sprintf("%s/%s on node %s", id.Namespace, id.ServiceAccount, id.Node)
}

// validName reports whether s is a Kubernetes object name as the API
// server allows for namespaces, service accounts and nodes (a DNS-1123
// subdomain: dot-separated labels of lowercase alphanumerics and '-' that
// start and end alphanumeric, at most 253 bytes). No such name is "." or
// "..", or holds a '/'.
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || !alnum(label[0]) || !alnum(label[len(label)-1]) {
			return false
		}
		for i := 0; i < len(label); i++ {
			if !alnum(label[i]) && label[i] != '-' {
				return false
			}
		}
	}
	return true
}

func alnum(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

// Check returns an error unless every field of id is a valid name.
func (id Identity) Check() error {
	for _, f := range []struct{ what, v string }{{"namespace", id.Namespace}, {"service account", id.ServiceAccount}, {"node", id.Node}} {
		if !validName(f.v) {
			return fmt.Errorf("identity: invalid %s %q", f.what, f.v)
		}
	}
	return nil
}

// ParseIdentity reads an identity URI as URI makes it.
func ParseIdentity(u *url.URL) (Identity, error) {
	if u == nil || u.Scheme != "fastblk" || u.Host != identityHost || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Identity{}, errors.New("not a peer identity URI")
	}
	f := strings.Split(u.Path, "/")
	if len(f) != 7 || f[0] != "" || f[1] != "ns" || f[3] != "sa" || f[5] != "node" {
		return Identity{}, fmt.Errorf("peer identity URI %q: want /ns/<namespace>/sa/<service account>/node/<node>", u.Path)
	}
	id := Identity{Namespace: f[2], ServiceAccount: f[4], Node: f[6]}
	if err := id.Check(); err != nil {
		return Identity{}, err
	}
	return id, nil
}
