package blockdev

import (
	"errors"
	"strings"
	"testing"
)

func TestDerivedIDs(t *testing.T) {
	names := map[string]string{
		"plain":         "pvc-0b6c6e8a-6a0e-4a43-9b8e-2f3a0c1d9e77",
		"max-length":    strings.Repeat("n", MaxNameLen),
		"dot-dot":       "../../../etc/passwd",
		"slashes":       "a/b/c",
		"nul-newline":   "a\x00b\nc",
		"unicode":       "卷-τόμος-🚀",
		"dot":           ".",
		"spaces":        "  ",
		"percent-shell": "%s$(rm -rf /)`x`",
	}
	seen := map[string]string{}
	for label, name := range names {
		t.Run(label, func(t *testing.T) {
			if err := CheckName(name); err != nil {
				t.Fatalf("checkName: %v", err)
			}
			vid, sid, gid := VolumeID(name), SnapshotID(name), GroupSnapshotID(name)
			if !ValidID(vid) || !IsVolumeID(vid) || IsSnapshotID(vid) || IsGroupSnapshotID(vid) {
				t.Errorf("VolumeID(%q) = %q is not a valid volume ID", name, vid)
			}
			if !ValidID(sid) || !IsSnapshotID(sid) || IsVolumeID(sid) || IsGroupSnapshotID(sid) {
				t.Errorf("SnapshotID(%q) = %q is not a valid snapshot ID", name, sid)
			}
			if !ValidID(gid) || !IsGroupSnapshotID(gid) || IsVolumeID(gid) || IsSnapshotID(gid) {
				t.Errorf("GroupSnapshotID(%q) = %q is not a valid group snapshot ID", name, gid)
			}
			if VolumeID(name) != vid {
				t.Errorf("VolumeID(%q) is not stable", name)
			}
		})
		if other, dup := seen[VolumeID(name)]; dup {
			t.Errorf("%q and %q map to the same ID", name, other)
		}
		seen[VolumeID(name)] = name
	}
}

func TestCheckNameRejects(t *testing.T) {
	for label, name := range map[string]string{
		"empty":        "",
		"too-long":     strings.Repeat("n", MaxNameLen+1),
		"invalid-utf8": "a\xff\xfeb",
	} {
		t.Run(label, func(t *testing.T) {
			if err := CheckName(name); !errors.Is(err, ErrInvalid) {
				t.Fatalf("checkName(%q) = %v, want ErrInvalid", name, err)
			}
		})
	}
}

func TestValidID(t *testing.T) {
	good := VolumeID("x")
	for label, tc := range map[string]struct {
		id   string
		want bool
	}{
		"volume":        {good, true},
		"snapshot":      {SnapshotID("x"), true},
		"group":         {GroupSnapshotID("x"), true},
		"empty":         {"", false},
		"no-prefix":     {good[1:], false},
		"other-prefix":  {"x" + good[1:], false},
		"upper-hex":     {"v" + strings.ToUpper(good[1:]), false},
		"short":         {good[:len(good)-1], false},
		"long":          {good + "0", false},
		"dot-dot":       {"v../../../../../../../etc/passwd", false},
		"slash":         {"v" + strings.Repeat("0", 15) + "/" + strings.Repeat("0", 16), false},
		"nul":           {"v" + strings.Repeat("0", 31) + "\x00", false},
		"name-not-id":   {"sanity-volume-1", false},
		"prefix-only-v": {"v", false},
	} {
		t.Run(label, func(t *testing.T) {
			if got := ValidID(tc.id); got != tc.want {
				t.Fatalf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
			}
		})
	}
}

func TestRoundSize(t *testing.T) {
	for label, tc := range map[string]struct {
		in, want int64
		err      error
	}{
		"zero":      {0, 0, nil},
		"one":       {1, 4096, nil},
		"aligned":   {8192, 8192, nil},
		"unaligned": {8193, 12288, nil},
		"max":       {MaxSize, MaxSize, nil},
		"above-max": {MaxSize + 1, 0, ErrOutOfRange},
		"negative":  {-1, 0, ErrOutOfRange},
	} {
		t.Run(label, func(t *testing.T) {
			got, err := RoundSize(tc.in)
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Fatalf("RoundSize(%d) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}
