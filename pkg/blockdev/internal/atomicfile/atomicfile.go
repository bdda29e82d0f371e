// Package atomicfile replaces small files crash-safely: the new content is
// written to a temporary file in the same directory, fsynced, renamed over
// the old file, and the directory is fsynced, so that after a crash the file
// holds either the old or the new content, never a mix, and an acknowledged
// write is never lost. Temporary files start with TempPrefix; owners of a
// directory remove leftovers of that name when they open it.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// TempPrefix starts the name of every temporary file this package makes.
const TempPrefix = ".tmp-"

// WriteFile replaces path with data durably.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, TempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// Remove removes path durably; a missing path is fine.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the directory's entries (creations, renames, removals)
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
