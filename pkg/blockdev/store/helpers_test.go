package store

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustCreate(t testing.TB, s *Store, spec VolumeSpec) blockdev.Volume {
	t.Helper()
	v, err := s.CreateVolume(context.Background(), spec)
	if err != nil {
		t.Fatalf("CreateVolume(%q): %v", spec.Name, err)
	}
	return v
}

func mustSnapshot(t *testing.T, s *Store, name, src string) blockdev.Snapshot {
	t.Helper()
	snap, err := s.CreateSnapshot(context.Background(), name, src, nil)
	if err != nil {
		t.Fatalf("CreateSnapshot(%q): %v", name, err)
	}
	return snap
}

func recordJSON(t *testing.T, r record) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
