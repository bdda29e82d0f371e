package ublk

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// statesComplete is true since loadStates refuses a State that cannot
// describe a device of ours (issue 23, defect 1; State.validate). With it
// false, FuzzState leaves out that property: a returned State has an
// absolute backing file, a positive size and an owner token (whose top bit
// OwnerToken always sets), and is one saveState writes.
const statesComplete = true

// FuzzState writes fuzz input as a state file named by fuzz input and loads
// the state directory. Properties: nothing panics; a file that does not
// parse into a State of its own name is reported as an error, never
// returned (no zero State for a corrupt file) and never deleted; a State
// that is returned names a volume whose state path is that file, in the
// directory; saving it again and reloading gives the same State (parse,
// format, parse).
func FuzzState(f *testing.F) {
	good := `{"volumeID":"v1","devID":3,"file":"/data/volumes/v1.img","sizeBytes":1073741824,` +
		`"tuning":{"queues":2,"depth":32,"maxIOBytes":131072,"bufferBytes":8388608},"flags":8,"owner":9223372036854775809}`
	for _, s := range []string{good, "", "{}", "null", "[]", good[:40], `{"volumeID":"v2"}`, `{"volumeID":"v1","devID":-1}`,
		`{"volumeID":"v1","sizeBytes":1e400}`, `{"volumeID":"v1","limits":{"iops":-5}}`, `{"volumeID":"v1"}`,
		strings.Replace(good, `"devID":3,`, "", 1), strings.Replace(good, `"depth":32`, `"depth":48`, 1)} {
		f.Add("v1", []byte(s))
	}
	f.Add(".x", []byte(`{"volumeID":".x"}`))
	f.Add("", []byte(`{"volumeID":""}`))
	// In /dev/shm where there is one: saving a state syncs it, which on a
	// disk costs more than the rest of an input.
	base, err := os.MkdirTemp("/dev/shm", "fastblk-fuzz-")
	if err != nil {
		base = f.TempDir()
	} else {
		f.Cleanup(func() { os.RemoveAll(base) })
	}
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		name := id + stateSuffix
		if id == "" || strings.ContainsAny(name, "/\x00") || strings.HasPrefix(name, ".tmp-") || len(name) > 255 {
			return // not a file name a directory can hold, or a temp file
		}
		dir, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		states, err := States(dir)
		if len(states) == 0 {
			if err == nil {
				t.Fatalf("state file %q holding %q: no State and no error", name, data)
			}
			if _, serr := os.Stat(file); serr != nil {
				t.Fatalf("unparsable state file %q was removed: %v", name, serr)
			}
			return
		}
		if len(states) != 1 || err != nil {
			t.Fatalf("one state file gave %d States and %v", len(states), err)
		}
		st := states[0]
		if st.VolumeID != id || statePath(dir, st.VolumeID) != file {
			t.Fatalf("state file %q loaded as volume %q", name, st.VolumeID)
		}
		if statesComplete && (!filepath.IsAbs(st.File) || st.SizeBytes <= 0 || st.Owner&(1<<63) == 0) {
			t.Fatalf("state file %q holding %q loaded as an incomplete State %+v", name, data, st)
		}
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := saveState(dir, st); err != nil {
			t.Fatalf("save loaded State %+v: %v", st, err)
		}
		again, err := States(dir)
		if err != nil || len(again) != 1 || again[0] != st {
			t.Fatalf("State %+v saved and loaded is %+v, %v", st, again, err)
		}
	})
}
