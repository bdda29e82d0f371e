package peer

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseIdentity: what a peer's certificate says of itself is read by
// ParseIdentity alone. An accepted URI names valid names only (no '/',
// nothing that could become a path) and makes the same URI again.
func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{n1.URI().String(), "fastblk://peer.fastblk.csi.io/ns/a/sa/b/node/c",
		"fastblk://peer.fastblk.csi.io/ns/../sa/b/node/c", "fastblk://peer.fastblk.csi.io/ns/a/sa/b/node/c/d",
		"fastblk://other/ns/a/sa/b/node/c", "spiffe://peer.fastblk.csi.io/ns/a/sa/b/node/c", "fastblk://peer.fastblk.csi.io/ns/a%2Fb/sa/b/node/c",
		"fastblk://u@peer.fastblk.csi.io/ns/a/sa/b/node/c", "fastblk://peer.fastblk.csi.io/ns/a/sa/b/node/c?x=1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		id, err := ParseIdentity(u)
		if err != nil {
			return
		}
		for _, name := range []string{id.Namespace, id.ServiceAccount, id.Node} {
			if !validName(name) || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
				t.Fatalf("ParseIdentity(%q) accepted the name %q", s, name)
			}
		}
		back, err := ParseIdentity(id.URI())
		if err != nil || back != id {
			t.Fatalf("ParseIdentity(%q) = %v, whose URI %s reads back as %v, %v", s, id, id.URI(), back, err)
		}
	})
}
