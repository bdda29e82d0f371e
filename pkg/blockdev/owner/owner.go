package owner

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/internal/atomicfile"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// ownerFile, in the data directory, holds the directory's owner token in
// hex.
const ownerFile = "owner"

// Ensure returns the data directory's owner token, creating the owner
// file on first use: with the token the directory's recorded ublk devices
// carry (plugins before the owner file derived it from the state
// directory's path, see ublk.OwnerToken), else a random one. The top bit
// is always set, so a token is never 0. An owner file that does not parse
// is an error: a new token would disown every device of the directory.
func Ensure(dataDir string) (uint64, error) {
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
			"a new one would disown this directory's devices): %w", path, data, blockdev.ErrInvalid)
	}
	return tok, nil
}

// Read returns the data directory's owner token and changes nothing: the
// owner file's token, or, in a directory without one, the token Ensure
// would adopt from the ublk devices an older plugin recorded there; 0 when
// there is neither (no device carries a token then). Listing and status
// commands use it, so that they write nothing on the node.
func Read(dataDir string) (uint64, error) {
	tok, err := readOwner(filepath.Join(dataDir, ownerFile))
	if !errors.Is(err, os.ErrNotExist) {
		return tok, err
	}
	tok, _ = recordedOwner(dataDir)
	return tok, nil
}

// firstOwner picks the token of a data directory that has none: the one
// its recorded ublk devices carry (recordedOwner), else a new random one.
func firstOwner(dataDir string) (uint64, error) {
	if tok, ok := recordedOwner(dataDir); ok {
		return tok, nil
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("owner token: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1<<63, nil
}

// recordedOwner returns the token the data directory's recorded ublk
// devices carry when they agree, or when one of them carries the
// path-derived token of the current path (plugins before the owner file).
func recordedOwner(dataDir string) (uint64, bool) {
	stateDir := filepath.Join(dataDir, blockdev.UblkStateDir)
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
		return legacy, true
	case len(seen) == 1:
		for tok := range seen {
			return tok, true
		}
	}
	return 0, false
}
