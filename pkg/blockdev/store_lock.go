package blockdev

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// Files in the data directory beside volumes/, snapshots/ and meta/.
const (
	// lockFile is flocked, exclusively, by the process serving the data
	// directory for as long as it lives; it holds that process's pid.
	lockFile = "lock"
	// ownerFile holds the data directory's owner token in hex. Devices
	// carry the token (ublk in ublksrv_flags, loop in lo_file_name), so
	// that a restarted plugin recognises its own devices however the
	// directory is reached.
	ownerFile = "owner"
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
				"one plugin per data directory: %w", dir, strings.TrimSpace(string(holder)), ErrBusy)
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

// OwnerToken returns the data directory's owner token, creating the owner
// file on first use: with the token the directory's recorded ublk devices
// carry (plugins before the owner file derived it from the state
// directory's path, see ublk.OwnerToken), else a random one. The top bit
// is always set, so a token is never 0. An owner file that does not parse
// is an error: a new token would disown every device of the directory.
func OwnerToken(dataDir string) (uint64, error) {
	path := filepath.Join(dataDir, ownerFile)
	tok, err := readOwner(path)
	if !errors.Is(err, os.ErrNotExist) {
		return tok, err
	}
	if tok, err = firstOwner(dataDir); err != nil {
		return 0, err
	}
	err = atomicfile.Create(path, []byte(fmt.Sprintf("%016x\n", tok)))
	if err != nil && !errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("owner token: %w", err)
	}
	// Another process may have created it first: its token wins.
	return readOwner(path)
}

func readOwner(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("owner token: %w", err)
	}
	tok, err := strconv.ParseUint(strings.TrimSpace(string(data)), 16, 64)
	if err != nil || tok>>63 != 1 {
		return 0, fmt.Errorf("owner token: %s holds %q, not a token (restore it from a backup; "+
			"a new one would disown this directory's devices): %w", path, data, ErrInvalid)
	}
	return tok, nil
}

// firstOwner picks the token of a data directory that has none: the one
// its recorded ublk devices carry when they agree (or when one of them
// carries the path-derived token of the current path), else a new random
// one.
func firstOwner(dataDir string) (uint64, error) {
	stateDir := filepath.Join(dataDir, UblkStateDir)
	sts, _ := ublk.States(stateDir)
	seen := map[uint64]bool{}
	for _, st := range sts {
		if st.Owner>>63 == 1 {
			seen[st.Owner] = true
		}
	}
	legacy := ublk.OwnerToken(stateDir)
	switch {
	case seen[legacy]:
		return legacy, nil
	case len(seen) == 1:
		for tok := range seen {
			return tok, nil
		}
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("owner token: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1<<63, nil
}

// LockFile takes an exclusive lock on path (created if missing) for as long
// as the process lives or until release; a lock another open file holds
// fails with ErrBusy. The plugin locks its CSI socket's path with it, so
// that a second plugin on one node stops instead of taking the socket.
func LockFile(path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: held by another process: %w", path, ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
