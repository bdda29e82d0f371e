package backendtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// NewBackend builds a backend for the data directory dataDir.
type NewBackend func(t *testing.T, dataDir string) blockdev.Backend

const (
	volSize   = 16 << 20
	grownSize = 32 << 20
	waitFor   = 10 * time.Second
)

// suite is the state the ordered cases share.
type suite struct {
	dataDir string
	newB    NewBackend
	b       blockdev.Backend
	devs    map[string]blockdev.Device // by volume name
}

// Run runs the conformance suite against backends made by newBackend.
func Run(t *testing.T, newBackend NewBackend) {
	testgate.RequireRoot(t)
	dataDir := t.TempDir()
	s := &suite{dataDir: dataDir, newB: newBackend, b: newBackend(t, dataDir), devs: map[string]blockdev.Device{}}
	t.Cleanup(s.detachAll(t))
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"attach", s.attach},
		{"attach-idempotent", s.attachIdempotent},
		{"attach-invalid", s.attachInvalid},
		{"direct-io", s.directIO},
		{"read-only", s.readOnly},
		{"resize", s.resize},
		{"resize-unknown", s.resizeUnknown},
		{"list", s.list},
		{"list-other-data-dir", s.listOther},
		{"readopt", s.readopt},
		{"detach-busy", s.detachBusy},
		{"detach", s.detach},
		{"detach-unknown", s.detachUnknown},
	} {
		if !t.Run(c.name, c.fn) {
			t.FailNow() // later cases build on earlier ones
		}
	}
}

// volume makes a sparse volume file for name and returns its attach request.
func (s *suite) volume(t *testing.T, name string, size int64) blockdev.AttachRequest {
	t.Helper()
	id := blockdev.VolumeID(name)
	file := filepath.Join(s.dataDir, "volumes", id+".img")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		testfs.Sparse(t, file, size)
	}
	return blockdev.AttachRequest{VolumeID: id, File: file, SizeBytes: size}
}

func (s *suite) mustAttach(t *testing.T, name string, req blockdev.AttachRequest) blockdev.Device {
	t.Helper()
	d, err := s.b.Attach(context.Background(), req)
	if err != nil {
		t.Fatalf("Attach(%s): %v", name, err)
	}
	s.devs[name] = d
	return d
}

func (s *suite) detachAll(t *testing.T) func() {
	return func() {
		for name, d := range s.devs {
			if err := s.b.Detach(context.Background(), d.VolumeID); err != nil {
				t.Errorf("cleanup: detach %s: %v", name, err)
			}
		}
	}
}

func (s *suite) attach(t *testing.T) {
	req := s.volume(t, "vol-a", volSize)
	d := s.mustAttach(t, "vol-a", req)
	checkDevice(t, s.b, d, req.VolumeID, volSize)
}

func (s *suite) attachIdempotent(t *testing.T) {
	first := s.devs["vol-a"]
	again := s.mustAttach(t, "vol-a", s.volume(t, "vol-a", volSize))
	if again.Path != first.Path || again.Link != first.Link {
		t.Fatalf("second Attach gave %s (%s), first %s (%s)", again.Path, again.Link, first.Path, first.Link)
	}
}

func (s *suite) attachInvalid(t *testing.T) {
	for _, id := range []string{"", "../../etc/passwd", "vol-a", blockdev.SnapshotID("x")} {
		req := blockdev.AttachRequest{VolumeID: id, File: "/etc/passwd", SizeBytes: volSize}
		if d, err := s.b.Attach(context.Background(), req); err == nil {
			t.Errorf("Attach(%q) = %+v, want an error", id, d)
			s.b.Detach(context.Background(), id)
		}
	}
}

// checkDevice checks a freshly attached device's description.
func checkDevice(t *testing.T, b blockdev.Backend, d blockdev.Device, id string, size int64) {
	t.Helper()
	if d.VolumeID != id || d.Backend != b.Name() || d.SizeBytes != size {
		t.Errorf("device %+v: want volume %s, backend %s, %d bytes", d, id, b.Name(), size)
	}
	fi, err := os.Stat(d.Path)
	if err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		t.Errorf("device path %s: %v, mode %v; want a block device", d.Path, err, fi)
	}
	if target, err := os.Readlink(d.Link); err != nil || target != d.Path {
		t.Errorf("link %s -> %q (%v), want %s", d.Link, target, err, d.Path)
	}
}
