package testgate

import "testing"

func TestRequired(t *testing.T) {
	for _, c := range []struct {
		env, feature string
		want         bool
	}{
		{"", Ublk, false},
		{"root,ublk", Ublk, true},
		{"root, ublk ,zerocopy", ZeroCopy, true},
		{"root,ublk", BatchIO, false},
		{"all", Quiesce, true},
		{"ublkx", Ublk, false},
	} {
		t.Setenv(EnvRequire, c.env)
		if got := Required(c.feature); got != c.want {
			t.Errorf("%s=%q: Required(%q) = %v, want %v", EnvRequire, c.env, c.feature, got, c.want)
		}
	}
}
