package quiesce

import (
	"context"
	"errors"
	"testing"

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
		{"mounted", mounted, &holder{}, false, "filesystem frozen", nil},
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
