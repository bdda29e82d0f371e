package fsstat

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testfs"
	"github.com/fastblk/csi-fastblk/internal/testgate"
)

func TestStatDirAndProbe(t *testing.T) {
	t.Run("writable", func(t *testing.T) {
		dir := t.TempDir()
		st, err := Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.ReadOnly || st.TotalBytes <= 0 || st.AvailableBytes > st.TotalBytes {
			t.Fatalf("Stat = %+v", st)
		}
		if err := ProbeWrite(dir); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("probe left %v behind", ents)
		}
	})
	t.Run("missing directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "gone")
		if _, err := Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Stat: %v, want ErrNotExist", err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("ProbeWrite: %v, want ErrNotExist", err)
		}
	})
	t.Run("read-only filesystem", func(t *testing.T) {
		dir := testfs.MountTmpfs(t, 1<<20)
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount ro: %v", err)
		}
		st, err := Stat(dir)
		if err != nil || !st.ReadOnly {
			t.Fatalf("Stat = %+v, %v; want read-only", st, err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, unix.EROFS) {
			t.Fatalf("ProbeWrite: %v, want EROFS", err)
		}
	})
	t.Run("full filesystem", func(t *testing.T) {
		dir := testfs.MountTmpfs(t, 64<<10)
		err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 68<<10), 0o600)
		if !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("fill: %v, want ENOSPC", err)
		}
		st, err := Stat(dir)
		if err != nil || st.AvailableBytes != 0 {
			t.Fatalf("Stat = %+v, %v; want no space", st, err)
		}
		if err := ProbeWrite(dir); !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("ProbeWrite: %v, want ENOSPC", err)
		}
	})
}

// TestExt4Errors reads a fresh ext4's error record, then makes the kernel
// record a real filesystem error (ext4's trigger_fs_error attribute calls
// ext4_error) and reads it again.
func TestExt4Errors(t *testing.T) {
	m := testfs.MountedExt4(t)
	e, err := Ext4Errors(m.Major, m.Minor)
	if err != nil || e.Count != 0 {
		t.Fatalf("fresh ext4: %+v, %v; want no errors", e, err)
	}
	trigger := filepath.Join(sysExt4Dir, filepath.Base(m.Source), "trigger_fs_error")
	err = os.WriteFile(trigger, []byte("csi-fastblk health test"), 0)
	if errors.Is(err, os.ErrNotExist) { // a kernel without the attribute
		testgate.Skip(t, testgate.Ext4Error, "cannot inject an ext4 error: %v", err)
	}
	if err != nil {
		t.Fatalf("inject an ext4 error: %v", err)
	}
	// ext4 with errors=continue writes the record to the superblock from
	// a work item (ext4_handle_error, fs/ext4/super.c), so poll for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err = Ext4Errors(m.Major, m.Minor)
		if err == nil && e.Count == 1 && !e.LastTime.IsZero() && e.LastFunc != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an error: %+v, %v; want one error with time and function", e, err)
		}
		<-time.After(10 * time.Millisecond)
	}
	t.Run("not ext4", func(t *testing.T) {
		if _, err := Ext4Errors(m.Major, m.Minor+1000); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("unknown device: %v, want ErrNotExist", err)
		}
	})
}
