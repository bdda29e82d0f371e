package ublk

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"

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
	// Limits are the device's rate limits.
	Limits qos.Limits `json:"limits,omitzero"`
	// Flags are the negotiated UBLK_F_* flags.
	Flags uint64 `json:"flags"`
	// Owner is the token stored in the device's ublksrv_flags.
	Owner uint64 `json:"owner"`
}

const stateSuffix = ".json"

// OwnerToken derives the token that marks devices as belonging to the
// plugin instance with this state directory. It is kept by the kernel in
// dev_info.ublksrv_flags, so it survives the process; the top bit is set
// so that it is never 0 (what other servers usually leave there).
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

// saveState writes st durably: temp file, fsync, rename, fsync dir.
func saveState(dir string, st State) error {
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

// loadStates reads every state file in dir and removes leftover temp
// files. A file that does not parse is reported, not deleted.
func loadStates(dir string) ([]State, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read state dir %s: %w", dir, err)
	}
	var states []State
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, atomicfile.TempPrefix) {
			os.Remove(filepath.Join(dir, name))
			continue
		}
		if !strings.HasSuffix(name, stateSuffix) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		var st State
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err == nil && st.VolumeID+stateSuffix != name {
			err = fmt.Errorf("volume id %q does not match the file name", st.VolumeID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("load state %s: %w", name, err))
			continue
		}
		states = append(states, st)
	}
	return states, errors.Join(errs...)
}

// States returns the device records in a state directory.
func States(dir string) ([]State, error) { return loadStates(dir) }

// Quarantined lists the state files set aside in dir. (stub)
func Quarantined(dir string) ([]string, error) { return nil, nil }

func removeStaleTemps(dir string) {} // stub

// Quarantined (stub).
func (s *Server) Quarantined() []string { return nil }
