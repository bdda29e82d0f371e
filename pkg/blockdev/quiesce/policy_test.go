package quiesce

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

type holder struct{ held []string }

func (h *holder) HoldIO(ctx context.Context, id string) (func() error, error) {
	h.held = append(h.held, id)
	return func() error { return nil }, nil
}

// TestFor proves the choice of hold: none for a volume not staged, a freeze
// for a mounted one, the backend's hold for a raw block one where the
// backend has one, a flush where the data directory reflinks, and
// ErrInconsistent where it does not.
func TestFor(t *testing.T) {
	mounted := blockdev.Volume{ID: "v1", Node: blockdev.NodeState{StagingPath: "/staging", Device: "/dev/x"}}
	raw := mounted
	raw.Node.Block = true
	reflinks := func(ok bool) func() (bool, error) { return func() (bool, error) { return ok, nil } }
	for _, c := range []struct {
		name    string
		v       blockdev.Volume
		holder  blockdev.IOHolder
		reflink bool
		how     string
		err     error
	}{
		{"not staged", blockdev.Volume{ID: "v1"}, nil, false, "", nil},
		{"mounted", mounted, nil, false, "filesystem frozen", nil},
		{"mounted, backend holds", mounted, &holder{}, false, "filesystem frozen, device i/o held", nil},
		{"raw block, backend holds", raw, &holder{}, false, "device i/o held", nil},
		{"raw block, reflink", raw, nil, true, "device flushed", nil},
		{"raw block, no reflink", raw, nil, false, "", ErrInconsistent},
	} {
		t.Run(c.name, func(t *testing.T) {
			hold, how, err := For(c.v, t.TempDir(), c.holder, reflinks(c.reflink))
			if how != c.how || !errors.Is(err, c.err) || (hold == nil) != (c.how == "") {
				t.Fatalf("For = hold %v, %q, %v; want %q, %v", hold != nil, how, err, c.how, c.err)
			}
		})
	}
	h := &holder{}
	hold, _, _ := For(raw, t.TempDir(), h, reflinks(false))
	if release, err := hold(context.Background()); err != nil || release() != nil || len(h.held) != 1 || h.held[0] != "v1" {
		t.Fatalf("the backend's hold ran for %v (%v), want v1 once", h.held, err)
	}
}

// TestForMountedHoldsTheDeviceToo: a mounted volume whose backend can hold
// its device's I/O is frozen, then its device held (a freeze stops the
// filesystem's writers, not a writer with the device open, and does not
// wait for such a writer's requests in flight), and released the other
// way round: the device's I/O resumes while the filesystem is still
// frozen, then it thaws.
func TestForMountedHoldsTheDeviceToo(t *testing.T) {
	ctx := context.Background()
	dir := testfs.MountImage(t, 64<<20, "mkfs.ext4", "-q", "-F")
	v := blockdev.Volume{ID: blockdev.VolumeID("pvc-mounted"), Node: blockdev.NodeState{StagingPath: dir, Device: deviceOf(t, dir)}}
	frozen := func() bool {
		thaw, err := FreezeFS(ctx, dir)
		if err == nil {
			thaw()
		}
		return errors.Is(err, blockdev.ErrBusy)
	}
	var events []string
	h := holderFunc(func(ctx context.Context, id string) (func() error, error) {
		events = append(events, fmt.Sprintf("hold, frozen %t", frozen()))
		return func() error {
			events = append(events, fmt.Sprintf("resume, frozen %t", frozen()))
			return nil
		}, nil
	})
	hold, how, err := For(v, t.TempDir(), h, func() (bool, error) { return false, nil })
	if err != nil || how != "filesystem frozen, device i/o held" {
		t.Fatalf("For = %q, %v; want the freeze and the device's hold", how, err)
	}
	release, err := hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	want := []string{"hold, frozen true", "resume, frozen true"}
	if !slices.Equal(events, want) || frozen() {
		t.Fatalf("events %q, frozen after the release %t; want %q, then thawed", events, frozen(), want)
	}
}

// holderFunc is a blockdev.IOHolder.
type holderFunc func(ctx context.Context, id string) (func() error, error)

func (f holderFunc) HoldIO(ctx context.Context, id string) (func() error, error) { return f(ctx, id) }

// deviceOf is the block device node of the filesystem mounted at dir.
func deviceOf(t *testing.T, dir string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(uevent), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			return "/dev/" + name
		}
	}
	t.Fatalf("no DEVNAME for the device of %s", dir)
	return ""
}
