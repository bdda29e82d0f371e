package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// TestRolloutKeepsChangeRecords: a rollout (SIGTERM, then a new plugin on
// the same data directory, which re-adopts the devices) keeps every ublk
// device's change record: the first GetMetadataDelta after it comes from
// the records, reads no data, and covers every write, those made just
// before the stop included. After kill -9 (a crash) the record is lost and
// the first delta compares the two snapshot files. The volume is 10 GiB,
// holding FASTBLK_ROLLOUT_FILL bytes (default 64 MiB) besides the writes;
// the time of each first delta and the bytes the plugin read for it (from
// the disk, page cache dropped) are logged (docs/upgrades.md has them).
func TestRolloutKeepsChangeRecords(t *testing.T) {
	p := newPlugin(t, "--over-provision-ratio=8") // 10 GiB on the VM's 4 GiB disk
	fill := int64(64 << 20)
	if s := os.Getenv("FASTBLK_ROLLOUT_FILL"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n%(1<<20) != 0 {
			t.Fatalf("FASTBLK_ROLLOUT_FILL=%q: want a multiple of 1 MiB", s)
		}
		fill = n
	}
	v := p.provision("rollout", 10<<30, blockCap(), nil)
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < fill; off += int64(len(chunk)) {
		chunk[0]++
		writeDirect(t, v.target, off, chunk)
	}
	s1 := p.snapshot(t, "rollout-s1", v)
	w1 := writeDirect(t, v.target, 3<<30, pattern4k(1))

	p.stop() // a rollout: SIGTERM, then the next plugin
	p.start()
	w2 := writeDirect(t, v.target, 5<<30, pattern4k(2))
	s2 := p.snapshot(t, "rollout-s2", v)
	how, took, read := p.timedDelta(t, s1, s2, w1, w2)
	t.Logf("first delta after a rollout, 10 GiB volume holding %d MiB: %s in %v, %d bytes read by the plugin",
		fill>>20, how, took.Round(time.Microsecond), read)
	if how != "tracked" {
		t.Errorf("first delta after a rollout %s, want it from the records (tracked)\n%s", how, p.logTail())
	}

	w3 := writeDirect(t, v.target, 7<<30, pattern4k(3))
	p.kill9() // a crash: the record dies with the process
	p.start()
	w4 := writeDirect(t, v.target, 9<<30, pattern4k(4))
	s3 := p.snapshot(t, "rollout-s3", v)
	how, took, read = p.timedDelta(t, s2, s3, w3, w4)
	t.Logf("first delta after a crash, 10 GiB volume holding %d MiB: %s in %v, %d bytes read by the plugin",
		fill>>20, how, took.Round(time.Microsecond), read)
	if how != "compared" {
		t.Errorf("first delta after kill -9 %s, want a comparison of the files", how)
	}
}

// pattern4k is 4 KiB of seed.
func pattern4k(seed byte) []byte {
	b := make([]byte, 4096)
	for i := range b {
		b[i] = seed
	}
	return b
}

// writeDirect writes data at off of the block device at path with
// O_DIRECT (from page-aligned memory), and returns the range.
func writeDirect(t *testing.T, path string, off int64, data []byte) [2]int64 {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	copy(buf, data)
	if n, err := unix.Pwrite(fd, buf, off); err != nil || n != len(data) {
		t.Fatalf("write %d bytes at %d of %s: %d, %v", len(data), off, path, n, err)
	}
	return [2]int64{off, int64(len(data))}
}

// snapshot takes a snapshot of v and returns its ID; it is deleted in
// t.Cleanup.
func (p *plugin) snapshot(t *testing.T, name string, v *volume) string {
	t.Helper()
	r, err := p.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
	if err != nil {
		t.Fatalf("CreateSnapshot %s: %v\n%s", name, err, p.logTail())
	}
	id := r.GetSnapshot().GetSnapshotId()
	t.Cleanup(func() {
		if p.cmd != nil {
			p.ctrl.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: id})
		}
	})
	return id
}

// timedDelta asks the plugin for the delta between two snapshots, with
// the page cache dropped first, and checks that it covers each written
// range. It returns how the plugin found it (its log says: "tracked" or
// "compared"), how long the call took and how many bytes the plugin read
// from the disk meanwhile (read_bytes of /proc/PID/io).
func (p *plugin) timedDelta(t *testing.T, base, target string, written ...[2]int64) (how string, took time.Duration, read int64) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Fatal(err)
	}
	before := p.readBytes(t)
	start := time.Now()
	stream, err := csi.NewSnapshotMetadataClient(p.conn).GetMetadataDelta(context.Background(),
		&csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]int64
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("GetMetadataDelta: %v\n%s", err, p.logTail())
		}
		for _, b := range r.GetBlockMetadata() {
			got = append(got, [2]int64{b.GetByteOffset(), b.GetSizeBytes()})
		}
	}
	took = time.Since(start)
	read = p.readBytes(t) - before
	for _, w := range written {
		covered := int64(0)
		for _, g := range got {
			covered += max(0, min(w[0]+w[1], g[0]+g[1])-max(w[0], g[0]))
		}
		if covered != w[1] {
			t.Errorf("delta %v misses the write of %d bytes at %d", got, w[1], w[0])
		}
	}
	return p.deltaMethod(t, target), took, read
}

// readBytes is what the plugin's process has read from storage so far.
func (p *plugin) readBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^read_bytes: (\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no read_bytes in /proc/%d/io: %s", p.cmd.Process.Pid, b)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// deltaMethod reads how the plugin found the last delta to target from
// its log ("snapshot delta" at -v=2).
func (p *plugin) deltaMethod(t *testing.T, target string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dir, "plugin.log"))
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(target, "-")
	method := ""
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"snapshot delta"`) && strings.Contains(line, `targetSnapshotID="`+id+`"`) {
			if m := regexp.MustCompile(`method="(\w+)"`).FindStringSubmatch(line); m != nil {
				method = m[1]
			}
		}
	}
	if method == "" {
		t.Fatalf("no \"snapshot delta\" line for %s in the plugin's log\n%s", id, p.logTail())
	}
	return method
}
