package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// Files in the data directory beside volumes/, snapshots/ and meta/.
const (
	// lockFile is flocked, exclusively, by the process serving the data
	// directory for as long as it lives; it holds that process's pid.
	lockFile = "lock"
)

// A process holds each data directory's lock once: Stores opened again in
// the same process (a test modelling a restart) share it, since a second
// flock on a new descriptor would conflict with the first. Keyed by the
// lock file's device and inode; an entry whose file was unlinked (its
// directory removed, the inode free for reuse) no longer counts.
var (
	locksMu sync.Mutex
	locks   = map[[2]uint64]*heldLock{}
)

type heldLock struct {
	f    *os.File
	refs int
}

// lockDir takes the data directory's exclusive lock, or fails with ErrBusy
// naming the pid of the process that holds it. release gives it back; the
// lock goes with the last release or the process.
func lockDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, lockFile)
	// Read-only: a file open for writing would keep the data directory's
	// filesystem from being remounted read-only.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	key := [2]uint64{st.Dev, st.Ino}
	locksMu.Lock()
	defer locksMu.Unlock()
	if l := locks[key]; l != nil && linked(l.f) {
		f.Close()
		l.refs++
		return l.release(key), nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data directory %s is in use by another csi-fastblk process (pid %s in its pid namespace); "+
				"one plugin per data directory: %w", dir, strings.TrimSpace(string(holder)), blockdev.ErrBusy)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	// The pid is only for the message above; a failure to record it
	// does not matter.
	os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	l := &heldLock{f: f, refs: 1}
	locks[key] = l
	return l.release(key), nil
}

// release returns a function that drops one reference to l, which is
// closed (unlocked) with the last.
func (l *heldLock) release(key [2]uint64) func() {
	return func() {
		locksMu.Lock()
		defer locksMu.Unlock()
		if l.refs--; l.refs > 0 {
			return
		}
		if locks[key] == l {
			delete(locks, key)
		}
		l.f.Close()
	}
}

// linked reports whether f still has a name.
func linked(f *os.File) bool {
	var st unix.Stat_t
	return unix.Fstat(int(f.Fd()), &st) == nil && st.Nlink > 0
}
