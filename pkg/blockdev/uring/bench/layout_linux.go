package bench

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Layout makes file at least size bytes long with every block written (so
// reads hit allocated blocks, as fio's layout does). An existing file that
// is large enough is left alone.
func Layout(file string, size int64) error {
	fd, err := unix.Open(file, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("layout %s: %w", file, err)
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("layout %s: %w", file, err)
	}
	if st.Size() >= size {
		return nil
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*131 + 7)
	}
	for off := st.Size() &^ (1<<20 - 1); off < size; off += int64(len(chunk)) {
		n := min(int64(len(chunk)), size-off)
		if _, err := f.WriteAt(chunk[:n], off); err != nil {
			return fmt.Errorf("layout %s: %w", file, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("layout %s: %w", file, err)
	}
	return nil
}
