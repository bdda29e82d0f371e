package loop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const deletedSuffix = " (deleted)"

func sysPath(n int, rel string) string {
	return filepath.Join("/sys/block", "loop"+strconv.Itoa(n), rel)
}

// number parses N out of /dev/loopN.
func number(path string) (int, error) {
	s, ok := strings.CutPrefix(path, "/dev/loop")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a loop device path: %w", path, os.ErrInvalid)
	}
	return n, nil
}

// Get describes loop device n; an unbound device is an error wrapping
// os.ErrNotExist.
func Get(n int) (Device, error) {
	d := Device{Number: n, Path: fmt.Sprintf("/dev/loop%d", n)}
	back, err := os.ReadFile(sysPath(n, "loop/backing_file"))
	if err != nil {
		return d, fmt.Errorf("loop%d: %w", n, err)
	}
	d.BackingFile = strings.TrimSuffix(string(back), "\n")
	d.BackingFile, d.Deleted = strings.CutSuffix(d.BackingFile, deletedSuffix)
	sectors, err := readInt(n, "size")
	if err == nil {
		d.BlockSize, err = readIntAs[int](n, "queue/logical_block_size")
	}
	if err != nil {
		return d, err
	}
	d.SizeBytes = sectors * 512
	dio, _ := readInt(n, "loop/dio")
	ro, _ := readInt(n, "ro")
	d.DirectIO, d.ReadOnly = dio == 1, ro == 1
	info, err := status(n)
	if err != nil {
		return d, err
	}
	d.Mark = unix.ByteSliceToString(info.File_name[:])
	d.BackingDev, d.BackingInode = info.Device, info.Inode
	return d, nil
}

// status returns device n's LOOP_GET_STATUS64; an unbound device is an
// error wrapping os.ErrNotExist.
func status(n int) (*unix.LoopInfo64, error) {
	path, err := ensureNode(n)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return nil, fmt.Errorf("loop%d: unbound: %w", n, os.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("get status %s: %w", path, err)
	}
	return info, nil
}

// List returns every bound loop device.
func List() ([]Device, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var out []Device
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "loop")
		n, err := strconv.Atoi(s)
		if !ok || err != nil {
			continue
		}
		d, err := Get(n)
		if errors.Is(err, os.ErrNotExist) {
			continue // unbound, or unbound while we looked
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Find returns the bound devices whose backing file is file (absolute),
// including devices whose file has since been deleted (Deleted set). Any
// user of the kernel may have bound them: see FindMark.
func Find(file string) ([]Device, error) {
	return find(func(d Device) bool { return d.BackingFile == file })
}

// FindMark returns the bound devices whose Mark is mark.
func FindMark(mark string) ([]Device, error) {
	return find(func(d Device) bool { return d.Mark == mark })
}

func find(match func(Device) bool) ([]Device, error) {
	all, err := List()
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, d := range all {
		if match(d) {
			out = append(out, d)
		}
	}
	return out, nil
}

func readInt(n int, rel string) (int64, error) { return readIntAs[int64](n, rel) }

func readIntAs[T int | int64](n int, rel string) (T, error) {
	b, err := os.ReadFile(sysPath(n, rel))
	if err != nil {
		return 0, fmt.Errorf("loop%d: %w", n, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("loop%d %s: %w", n, rel, err)
	}
	return T(v), nil
}
