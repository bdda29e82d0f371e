package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// TestHealState checks the decision that re-adopts a device whose state
// file was set aside: the volume's record (a real backing file, its size,
// the device its link names) against the kernel's view of the device (dev
// info and params, as the device this server creates has them). Only
// where every data-affecting fact agrees is a State returned, and it is
// one the server would write; each disagreement is named.
func TestHealState(t *testing.T) {
	dir := t.TempDir()
	owner := OwnerToken(dir)
	const size = 64 << 20
	file := filepath.Join(dir, "v1.img")
	short := filepath.Join(dir, "short.img")
	for name, n := range map[string]int64{file: size, short: size - 4096} {
		if err := os.WriteFile(name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(name, n); err != nil {
			t.Fatal(err)
		}
	}
	lim := qos.Limits{IOPS: 1000}
	spec := AttachSpec{VolumeID: "v1", File: file, SizeBytes: size, Limits: lim, RecordedDev: "/dev/ublkb3"}
	mine := []string{"v1.json.corrupt-20261203T190000.000000000Z"}
	// dev is device 3 as Server.create makes it for spec, after a kill -9.
	dev := func(change func(*kernelDevice)) []kernelDevice {
		d := kernelDevice{
			info: DevInfo{DevID: 3, NrHWQueues: 2, QueueDepth: 64, MaxIOBufBytes: 128 << 10, State: StateQuiesced,
				Flags: FlagUserRecovery | FlagCmdIoctlEncode, UblksrvFlags: owner},
			params: deviceParams(DeviceConfig{SizeBytes: size}, DevInfo{MaxIOBufBytes: 128 << 10}),
		}
		if change != nil {
			change(&d)
		}
		other := kernelDevice{info: d.info, params: d.params}
		other.info.DevID = 5
		return []kernelDevice{other, d}
	}
	want := State{VolumeID: "v1", DevID: 3, File: file, SizeBytes: size,
		Tuning: Tuning{Queues: 2, Depth: 64, MaxIOBytes: 128 << 10, BufferBytes: 2 * 64 * 128 << 10},
		Limits: lim, Flags: FlagUserRecovery | FlagCmdIoctlEncode, Owner: owner}

	t.Run("agree", func(t *testing.T) {
		for _, state := range []DevState{StateLive, StateQuiesced, StateFailIO} {
			got, err := healState(spec, owner, mine, dev(func(d *kernelDevice) { d.info.State = state }))
			if err != nil || got != want {
				t.Fatalf("state %d: healState = %+v, %v; want %+v", state, got, err, want)
			}
		}
		ro := spec
		ro.ReadOnly = true
		got, err := healState(ro, owner, mine, dev(func(d *kernelDevice) { d.params.Basic.Attrs |= uapi.AttrReadOnly }))
		wantRO := want
		wantRO.ReadOnly = true
		if err != nil || got != wantRO {
			t.Fatalf("read-only: healState = %+v, %v", got, err)
		}
		// A preallocated volume keeps zeroing in place after the heal;
		// before, its WRITE_ZEROES punched holes from then on.
		thick := spec
		thick.KeepAllocated = true
		got, err = healState(thick, owner, mine, dev(nil))
		if err != nil || !got.KeepAllocated || !got.target(os.Stdin).KeepAllocated {
			t.Fatalf("preallocated: healState = %+v, %v; want KeepAllocated", got, err)
		}
		zc, err := healState(spec, owner, mine, dev(func(d *kernelDevice) {
			d.info.Flags |= FlagAutoBufReg
			d.info.MaxIOBufBytes = ZeroCopyMaxIOBytes
		}))
		if err != nil || !zc.Tuning.ZeroCopy || zc.Tuning.BufferBytes != 0 || zc.Tuning.MaxIOBytes != ZeroCopyMaxIOBytes {
			t.Fatalf("zero copy: healState = %+v, %v", zc, err)
		}
		// A healed file set aside before does not stop it.
		if _, err := healState(spec, owner, nil, dev(nil)); err != nil {
			t.Fatalf("no unreadable file: %v", err)
		}
	})

	for _, c := range []struct {
		name   string
		spec   func(*AttachSpec)
		mine   []string
		dev    func(*kernelDevice)
		reason string
	}{
		{name: "no recorded device", spec: func(s *AttachSpec) { s.RecordedDev = "" }, reason: "no device is recorded"},
		{name: "recorded device not ublk", spec: func(s *AttachSpec) { s.RecordedDev = "/dev/loop3" }, reason: "not a ublk block device"},
		{name: "recorded device a partition", spec: func(s *AttachSpec) { s.RecordedDev = "/dev/ublkb3p1" }, reason: "not a ublk block device"},
		{name: "recorded device not unaccounted for", spec: func(s *AttachSpec) { s.RecordedDev = "/dev/ublkb4" }, reason: "not a started device"},
		{name: "state file unreadable, not set aside", mine: []string{"v1.json"}, reason: "cannot be read and is not set aside"},
		{name: "other owner", dev: func(d *kernelDevice) { d.info.UblksrvFlags = OwnerToken("/elsewhere") }, reason: "carries owner"},
		{name: "never started", dev: func(d *kernelDevice) { d.info.State = StateDead }, reason: "not started"},
		{name: "params unreadable", dev: func(d *kernelDevice) { d.err = os.ErrPermission }, reason: "permission denied"},
		{name: "no basic params", dev: func(d *kernelDevice) { d.params.Types = 0 }, reason: "no basic parameters"},
		{name: "device larger", dev: func(d *kernelDevice) { d.params.Basic.DevSectors += 8 }, reason: "has 67112960 bytes, the volume 67108864"},
		{name: "volume larger (expanded)", spec: func(s *AttachSpec) { s.SizeBytes *= 2 }, reason: "has 67108864 bytes, the volume 134217728"},
		{name: "512-byte blocks", dev: func(d *kernelDevice) { d.params.Basic.LogicalBSShift = 9 }, reason: "512-byte blocks"},
		{name: "device read-only", dev: func(d *kernelDevice) { d.params.Basic.Attrs |= uapi.AttrReadOnly }, reason: "read-only true, the volume false"},
		{name: "volume read-only", spec: func(s *AttachSpec) { s.ReadOnly = true }, reason: "read-only false, the volume true"},
		{name: "backing file missing", spec: func(s *AttachSpec) { s.File = filepath.Join(dir, "gone.img") }, reason: "no such file"},
		{name: "backing file short", spec: func(s *AttachSpec) { s.File = short }, reason: "has 67104768 bytes"},
		{name: "backing file a directory", spec: func(s *AttachSpec) { s.File = dir }, reason: "not a regular file"},
		{name: "no USER_RECOVERY", dev: func(d *kernelDevice) { d.info.Flags = FlagCmdIoctlEncode }, reason: "lack USER_RECOVERY"},
		{name: "depth not a power of two", dev: func(d *kernelDevice) { d.info.QueueDepth = 48 }, reason: "queue depth 48"},
		{name: "relative backing path", spec: func(s *AttachSpec) { s.File = "v1.img" }, reason: "v1.img"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec
			if c.spec != nil {
				c.spec(&s)
			}
			m := mine
			if c.mine != nil {
				m = c.mine
			}
			got, err := healState(s, owner, m, dev(c.dev))
			if !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), c.reason) || got != (State{}) {
				t.Fatalf("healState = %+v, %v; want ErrDisagree saying %q", got, err, c.reason)
			}
		})
	}
}

// TestHealedNotUnreadable: a set-aside state file marked healed is kept
// but no longer counts as unreadable or quarantined, so it stops blocking
// the sweep; one not healed still does.
func TestHealedNotUnreadable(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"v1.json.corrupt-20261203T190000.000000000Z" + healedMark, "v2.json.corrupt-20261203T190000.000000000Z"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	scan, err := loadStates(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.unreadable) != 1 || scan.unreadable[0] != "v2.json.corrupt-20261203T190000.000000000Z" {
		t.Fatalf("unreadable = %q", scan.unreadable)
	}
	if got := scan.mine("v1"); len(got) != 0 {
		t.Fatalf("mine(v1) = %q", got)
	}
	q, err := Quarantined(dir)
	if err != nil || len(q) != 1 || q[0] != scan.unreadable[0] {
		t.Fatalf("Quarantined = %q, %v", q, err)
	}
}
