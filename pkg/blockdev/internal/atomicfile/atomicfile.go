// Package atomicfile replaces small files crash-safely: the new content is
// written to a temporary file in the same directory, fsynced, renamed over
// the old file, and the directory is fsynced, so that after a crash the file
// holds either the old or the new content, never a mix, and an acknowledged
// write is never lost. Temporary files start with TempPrefix; owners of a
// directory remove stale leftovers of that name (RemoveStale) when they
// open it.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TempPrefix starts the name of every temporary file this package makes.
const TempPrefix = ".tmp-"

// WriteFile replaces path with data durably.
func WriteFile(path string, data []byte) error {
	return place(path, data, os.Rename)
}

// Create makes path with data durably, failing with an error matching
// os.ErrExist if path exists: when two writers race, the first one's
// content stays.
func Create(path string, data []byte) error {
	return place(path, data, func(tmp, path string) error {
		err := os.Link(tmp, path)
		os.Remove(tmp)
		return err
	})
}

// place writes data to a synced temp file beside path, moves it to path
// with move, and syncs the directory.
func place(path string, data []byte, move func(tmp, path string) error) error {
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
		err = move(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// StaleAge is how old a temp file must be before RemoveStale takes it:
// younger ones may be another writer's, between write and rename.
const StaleAge = time.Minute

// RemoveStale removes the temp files in dir older than StaleAge, leftovers
// of a crash between writing and renaming. A missing dir is fine.
func RemoveStale(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove stale temp files: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < StaleAge {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale temp file: %w", err))
		}
	}
	return errors.Join(errs...)
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
