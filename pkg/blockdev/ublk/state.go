package ublk

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// State is what a later process needs to re-adopt a device: it is written
// to <StateDir>/<volume-id>.json after ADD_DEV and before START_DEV, and
// removed after the device is deleted.
type State struct {
	VolumeID  string `json:"volumeID"`
	DevID     uint32 `json:"devID"`
	File      string `json:"file"`
	SizeBytes int64  `json:"sizeBytes"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	Tuning    Tuning `json:"tuning"`
	// NowaitWrites is the QueueOptions.NowaitWrites chosen at creation,
	// kept when the device is re-adopted.
	NowaitWrites bool `json:"nowaitWrites,omitempty"`
	// KeepAllocated is AttachSpec.KeepAllocated, kept when the device is
	// re-adopted.
	KeepAllocated bool `json:"keepAllocated,omitempty"`
	// Limits are the device's rate limits.
	Limits qos.Limits `json:"limits,omitzero"`
	// Flags are the negotiated UBLK_F_* flags.
	Flags uint64 `json:"flags"`
	// Owner is the token stored in the device's ublksrv_flags.
	Owner uint64 `json:"owner"`
	// Handover is the device's change record as the process that served
	// it left it (HandOver at a stop, or Close), once no write could
	// reach the file any more, for the next process to carry on
	// (adoptOne consumes it before the device serves again). nil
	// otherwise: a process that ended any other way lost the record.
	Handover *Handover `json:"handover,omitempty"`
}

const (
	stateSuffix = ".json"
	// corruptMark joins the name of a set-aside state file and the time
	// it was set aside: <volume-id>.json.corrupt-<UTC time>.
	corruptMark = ".corrupt-"
)

// OwnerToken derives a token from the state directory's path: the token
// plugins before the owner file used, and what ServerConfig.Owner falls
// back to when zero. It is kept by the kernel in dev_info.ublksrv_flags, so
// it survives the process; the top bit is set so that it is never 0 (what
// other servers usually leave there).
func OwnerToken(stateDir string) uint64 {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	h := fnv.New64a()
	h.Write([]byte("csi-fastblk:" + abs))
	return h.Sum64() | 1<<63
}

// validName refuses volume IDs that could leave the state directory.
func validName(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\x00") || strings.HasPrefix(id, ".") {
		return fmt.Errorf("volume id %q: %w", id, errInvalid)
	}
	return nil
}

func statePath(dir, id string) string { return filepath.Join(dir, id+stateSuffix) }

// validate returns why st is not a complete record of a device, or nil.
// It accepts every State the Server writes (create, Resize, SetLimits), in
// this release and the earlier ones, and refuses what re-adoption could
// act on wrongly:
//   - VolumeID is a name validName accepts (readState also checks that it
//     names the file);
//   - File is an absolute path: re-adoption opens it, and deletes the
//     device when it does not exist, so an empty or relative one could get
//     a live device deleted;
//   - SizeBytes is a positive multiple of 4096, as CreateDevice and
//     Device.Resize require;
//   - Tuning is one ChooseTuning can give: 1 to maxNrQueues queues, a
//     power of two depth up to maxQueueDepth, a request size that is a
//     positive multiple of 4096 up to ZeroCopyMaxIOBytes;
//   - Limits are valid (qos.Limits.Validate);
//   - Flags carry USER_RECOVERY, which every device the Server makes
//     negotiates (addFlags), and without which there is nothing to adopt;
//   - Owner has its top bit set, as every owner token has (OwnerToken and
//     the blockdev layer's token).
//
// DevID has no invalid value (0 is the first device); readState checks
// that the file holds one.
func (st State) validate() error {
	if err := validName(st.VolumeID); err != nil {
		return err
	}
	t := st.Tuning
	switch {
	case !filepath.IsAbs(st.File) || strings.IndexByte(st.File, 0) >= 0:
		return fmt.Errorf("backing file %q is not an absolute path", st.File)
	case st.SizeBytes <= 0 || st.SizeBytes%4096 != 0:
		return fmt.Errorf("size %d is not a positive multiple of 4096", st.SizeBytes)
	case t.Queues < 1 || t.Queues > maxNrQueues:
		return fmt.Errorf("queues %d not in 1..%d", t.Queues, maxNrQueues)
	case t.Depth < 1 || t.Depth > maxQueueDepth || bits.OnesCount(uint(t.Depth)) != 1:
		return fmt.Errorf("queue depth %d is not a power of two in 1..%d", t.Depth, maxQueueDepth)
	case t.MaxIOBytes == 0 || t.MaxIOBytes%4096 != 0 || t.MaxIOBytes > ZeroCopyMaxIOBytes:
		return fmt.Errorf("max i/o bytes %d is not a positive multiple of 4096 up to %d", t.MaxIOBytes, ZeroCopyMaxIOBytes)
	case t.BufferBytes < 0 || t.PoolBytes < 0:
		return fmt.Errorf("buffer bytes %d or pool bytes %d below 0", t.BufferBytes, t.PoolBytes)
	case st.Flags&FlagUserRecovery == 0:
		return fmt.Errorf("flags %#x lack USER_RECOVERY", st.Flags)
	case st.Owner>>63 != 1:
		return fmt.Errorf("owner %#x is not an owner token", st.Owner)
	}
	if err := st.Limits.Validate(); err != nil {
		return err
	}
	return nil
}

// saveState writes st durably: temp file, fsync, rename, fsync dir. It
// refuses a State that is not valid: one would be set aside when read.
func saveState(dir string, st State) error {
	if err := st.validate(); err != nil {
		return fmt.Errorf("save state %s: %w: %w", st.VolumeID, err, errInvalid)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state %s: %w", st.VolumeID, err)
	}
	return atomicfile.WriteFile(statePath(dir, st.VolumeID), data)
}

// removeState removes the state file durably; a missing file is fine.
func removeState(dir, id string) error {
	if err := atomicfile.Remove(statePath(dir, id)); err != nil {
		return fmt.Errorf("remove state %s: %w", id, err)
	}
	return nil
}

// stateScan is what loadStates found in a state directory.
type stateScan struct {
	states []State
	// unreadable names the state files that could not be read or
	// decoded, and those set aside earlier: each may name a device, so
	// while any exists no unrecorded device is known to be unused.
	unreadable []string
	// problems say why, one per file.
	problems []error
}

// loadStates reads every state file in dir. With setAside, a file that
// does not decode, names another volume, is not a valid State (see
// State.validate) or names the device of another file (see dropShared) is
// renamed aside (quarantine) and reported; one that cannot be read is
// reported. Temp files are left alone: they may be another volume's state
// being written (see atomicfile.RemoveStale). The error is for a directory
// that cannot be read, when nothing is known.
func loadStates(dir string, setAside bool) (stateScan, error) {
	var scan stateScan
	ents, err := os.ReadDir(dir)
	if err != nil {
		return scan, fmt.Errorf("read state dir %s: %w", dir, err)
	}
	for _, e := range ents {
		name := e.Name()
		if isSetAside(name) {
			scan.unreadable = append(scan.unreadable, name)
			continue
		}
		if strings.HasPrefix(name, atomicfile.TempPrefix) || !strings.HasSuffix(name, stateSuffix) {
			continue
		}
		st, err := readState(dir, name)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since ReadDir
		}
		if errors.Is(err, errCorrupt) && setAside {
			name, err = quarantine(dir, name, err)
		}
		if err != nil {
			scan.unreadable = append(scan.unreadable, name)
			scan.problems = append(scan.problems, err)
			continue
		}
		scan.states = append(scan.states, st)
	}
	scan.dropShared(dir, setAside)
	return scan, nil
}

// dropShared moves the states that name a device another state names too
// from scan.states to the unreadable ones (set aside with setAside). At
// most one of them is right, and which is unknown: re-adopting the device
// from the wrong one would serve one volume from another's file, and
// deleting it for the wrong one would take a live device away. (The
// Server writes two only when a state outlives its device, a failed
// removal, and the kernel gives the id to a new device before the stale
// state is seen again.)
func (scan *stateScan) dropShared(dir string, setAside bool) {
	named := map[uint32]int{}
	for _, st := range scan.states {
		named[st.DevID]++
	}
	kept := scan.states[:0]
	for _, st := range scan.states {
		if named[st.DevID] == 1 {
			kept = append(kept, st)
			continue
		}
		name := st.VolumeID + stateSuffix
		err := fmt.Errorf("load state %s: %w: ublk device %d is named by %d state files", name, errCorrupt, st.DevID, named[st.DevID])
		if setAside {
			name, err = quarantine(dir, name, err)
		}
		scan.unreadable = append(scan.unreadable, name)
		scan.problems = append(scan.problems, err)
	}
	scan.states = kept
}

// errCorrupt marks a state file that was read but does not describe a
// device: it does not decode, decodes into a State that is not valid, or
// names a device another file names.
var errCorrupt = errors.New("corrupt state file")

func readState(dir, name string) (State, error) {
	var st State
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return st, fmt.Errorf("load state %s: %w", name, err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("load state %s: %w: %w", name, errCorrupt, err)
	}
	if st.VolumeID+stateSuffix != name {
		return st, fmt.Errorf("load state %s: %w: volume id %q does not match the file name", name, errCorrupt, st.VolumeID)
	}
	// A missing devID decodes as 0, a device id like any other: the State
	// would name whichever device is 0.
	var devID struct {
		DevID *uint32 `json:"devID"`
	}
	if err := json.Unmarshal(data, &devID); err != nil || devID.DevID == nil {
		return st, fmt.Errorf("load state %s: %w: no device id", name, errCorrupt)
	}
	if err := st.validate(); err != nil {
		return st, fmt.Errorf("load state %s: %w: %w", name, errCorrupt, err)
	}
	return st, nil
}

// quarantine renames the state file name aside, never deleting it, and
// returns its new name (the old one if the rename failed) and an error
// saying what happened, for the start-up report.
func quarantine(dir, name string, cause error) (string, error) {
	set := name + corruptMark + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(filepath.Join(dir, name), filepath.Join(dir, set)); err != nil {
		return name, errors.Join(cause, fmt.Errorf("set aside state %s: %w", name, err))
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return set, errors.Join(cause, err)
	}
	return set, fmt.Errorf("%w; set aside as %s: its device, if any, is left alone", cause, set)
}

// healedMark ends the name of a set-aside state file whose device was
// re-adopted from the volume's record (heal): it is kept, for the
// operator, but no longer counts as unreadable.
const healedMark = ".healed"

// mine returns the volume's entries among the unreadable state files.
func (scan stateScan) mine(id string) []string {
	var out []string
	for _, name := range scan.unreadable {
		if name == id+stateSuffix || strings.HasPrefix(name, id+stateSuffix+corruptMark) {
			out = append(out, name)
		}
	}
	return out
}

// isSetAside reports whether name is a state file set aside (quarantine)
// and not healed since (see heal): one that may name any device. A healed
// one is kept for the operator but names no device the server does not
// know.
func isSetAside(name string) bool {
	return strings.Contains(name, stateSuffix+corruptMark) && !strings.HasSuffix(name, healedMark)
}

// States returns the device records in a state directory; the error joins
// what went wrong per file. It changes nothing (the Server sets aside what
// does not decode when it starts).
func States(dir string) ([]State, error) {
	scan, err := loadStates(dir, false)
	if err != nil {
		return nil, err
	}
	return scan.states, errors.Join(scan.problems...)
}

// Quarantined lists the state files set aside in dir, sorted, by name.
func Quarantined(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read state dir %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if isSetAside(e.Name()) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// target is the device's backing store: file, or the null target where
// file is nil (benchmark devices).
func (st State) target(file *os.File) Target {
	if file == nil {
		return NullTarget()
	}
	t := FileTarget(int(file.Fd()))
	t.KeepAllocated = st.KeepAllocated
	return t
}
