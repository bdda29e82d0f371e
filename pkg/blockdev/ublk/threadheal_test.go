package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// TestServerHealsFailedThread proves that a server thread that fails for
// real (a panic inside its loop) heals without a new server, with fio
// verify writing to three devices across the failure: "a" has its one
// queue on the failed thread, "b" one queue there and one on the other
// thread (so the heal must end its live queue too), "c" its one queue on
// the other thread. All three fio runs finish and verify, the devices of
// the failed thread are re-adopted (a thread started in its place, user
// recovery), "c" is never touched, and health is good after the heal.
// Cost: three 16 MiB fio verify runs at once.
func TestServerHealsFailedThread(t *testing.T) {
	needUblk(t)
	testgate.RequireTool(t, "fio")
	dir := scratchDir(t)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: filepath.Join(dir, "state"), Threads: 2, ThreadPolicy: ThreadsShared})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	defer s.Close()
	ctx := context.Background()
	// SpreadQueues places them so: a on thread 0; b on 1 and 0; c on 1.
	paths := map[string]string{}
	for _, v := range []struct {
		id     string
		queues int
	}{{"a", 1}, {"b", 2}, {"c", 1}} {
		d, err := s.Attach(ctx, AttachSpec{VolumeID: v.id, File: sparseFile(t, dir, v.id+".img", 64<<20), Queues: v.queues, Depth: 32})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Detach(ctx, v.id)
		paths[v.id] = d.Path
	}
	th := s.Threads().Threads()[0]
	for id, want := range map[string]bool{"a": true, "b": true, "c": false} {
		if got := s.get(id).dev.servedBy(th); got != want {
			t.Fatalf("volume %s served by thread 0: %v, want %v (the placement changed)", id, got, want)
		}
	}
	cDev := s.get("c").dev

	runs := map[string]*fioRun{}
	for id, path := range paths {
		runs[id] = startFio(t, path, "16M")
	}
	waitDevWrites(t, paths["a"], 1000)
	waitDevWrites(t, paths["b"], 1000)
	stopFailing := failThread(t, th)
	defer stopFailing()
	<-th.Done()
	failed := time.Now()
	stopFailing()
	err = poll(ctx, 2*time.Minute, func() (bool, error) { return healed(s), nil })
	if err != nil {
		t.Fatalf("not healed: %v; health: %v", err, s.Health())
	}
	t.Logf("healed %v after the failure", time.Since(failed).Round(time.Millisecond))
	for id, r := range runs {
		r.wait(t, id)
	}
	if p := s.Threads(); p.Live() != 2 || p.Threads()[0] == th {
		t.Fatalf("%d live threads, thread 0 replaced: %v", p.Live(), p.Threads()[0] != th)
	}
	for id := range paths {
		sv := s.get(id)
		if err := sv.dev.Err(); err != nil || sv.dev.servedBy(th) {
			t.Fatalf("volume %s after the heal: %v, still on the failed thread: %v", id, err, sv.dev.servedBy(th))
		}
	}
	if s.get("c").dev != cDev {
		t.Fatal("volume c, whose queue ran on the live thread, was re-adopted")
	}
	// A heal is a recovery, and the volume's counters run on across it:
	// fio wrote and read back all 16 MiB of each volume, more than a
	// thousand 4k blocks of it before the failure. (Bytes, not requests:
	// the block layer merges neighbouring blocks of one batch.)
	for id, heals := range map[string]uint64{"a": 1, "b": 1, "c": 0} {
		st, recoveries, ok := s.Stats(id)
		if !ok || recoveries != heals || st.BytesWritten < 16<<20 || st.BytesRead < 16<<20 {
			t.Fatalf("volume %s after the heal: %d recoveries (want %d), %d bytes written and %d read (want at least 16 MiB each)",
				id, recoveries, heals, st.BytesWritten, st.BytesRead)
		}
	}
}

// healed reports whether the server serves every volume again: health is
// good and no device reports a failure (Health does not fail for a device
// whose heal is under way).
func healed(s *Server) bool {
	for _, d := range s.List() {
		if sv := s.get(d.VolumeID); sv != nil && sv.dev.Err() != nil {
			return false
		}
	}
	return s.Health() == nil
}

// fioRun is a fio verify run in the background.
type fioRun struct {
	cmd *exec.Cmd
	out strings.Builder
}

// startFio starts fio writing size bytes of 4k random writes to dev at
// queue depth 16 with crc32c checksums, then reading them all back to
// verify (each block is written once: no two writes to one block are in
// flight together).
func startFio(t *testing.T, dev, size string) *fioRun {
	t.Helper()
	r := &fioRun{cmd: exec.Command("fio", "--name=verify", "--filename="+dev, "--rw=randwrite", "--bs=4k", "--size="+size,
		"--direct=1", "--ioengine=libaio", "--iodepth=16", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--randrepeat=1")}
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
		}
	})
	return r
}

// wait waits for the run and fails the test unless it wrote and verified.
func (r *fioRun) wait(t *testing.T, name string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || strings.Contains(r.out.String(), "verify: bad") {
			t.Fatalf("fio on %s: %v\n%s", name, err, r.out.String())
		}
	case <-time.After(5 * time.Minute):
		r.cmd.Process.Kill()
		<-done
		t.Fatalf("fio on %s did not finish within 5 minutes (i/o held?)\n%s", name, r.out.String())
	}
}

// waitDevWrites waits until the block device dev has completed n writes
// (/sys/block/DEV/stat).
func waitDevWrites(t *testing.T, dev string, n int64) {
	t.Helper()
	stat := filepath.Join("/sys/block", filepath.Base(dev), "stat")
	err := poll(context.Background(), time.Minute, func() (bool, error) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false, err
		}
		f := strings.Fields(string(b))
		if len(f) < 5 {
			return false, fmt.Errorf("%s: %q", stat, b)
		}
		w, err := strconv.ParseInt(f[4], 10, 64)
		return w >= n, err
	})
	if err != nil {
		t.Fatalf("%s: %d writes: %v", dev, n, err)
	}
}

// TestServerHealRefusedWhereWarningPanics proves the heal where a kernel
// warning panics the node (kernel.panic_on_warn, set for the test): a
// device with queues on two threads, one of which fails, is re-adopted in
// the process where the driver has QUIESCE (it does not warn; a warning
// here would panic the VM), and elsewhere (6.12, which warns when a queue's
// old thread still runs) it is not: health fails, and the next server,
// whose old threads are all gone, re-adopts it with its data.
func TestServerHealRefusedWhereWarningPanics(t *testing.T) {
	features := needUblk(t)
	const knob = "/proc/sys/kernel/panic_on_warn"
	was, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(knob, was, 0) })
	dir := scratchDir(t)
	state := filepath.Join(dir, "state")
	reports := make(chan error, 16)
	s, errs, err := NewServer(context.Background(), ServerConfig{StateDir: state, Threads: 2, ThreadPolicy: ThreadsShared,
		Report: func(err error, _ string, _ ...any) { reports <- err }})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	defer s.Close()
	ctx := context.Background()
	d, err := s.Attach(ctx, AttachSpec{VolumeID: "vol", File: sparseFile(t, dir, "vol.img", 32<<20), Queues: 2, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	writeRead(t, d.Path, 0, 5, true)
	th := s.Threads().Threads()[0]
	stopFailing := failThread(t, th)
	defer stopFailing()
	<-th.Done()
	stopFailing()
	if features&FlagQuiesce != 0 {
		if err := poll(ctx, time.Minute, func() (bool, error) { return healed(s), nil }); err != nil {
			t.Fatalf("not healed: %v; health: %v", err, s.Health())
		}
		writeRead(t, d.Path, 0, 5, false)
		if err := s.Detach(ctx, "vol"); err != nil {
			t.Fatal(err)
		}
		return
	}
	waitReport(t, reports, errors.ErrUnsupported)
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "vol") {
		t.Fatalf("Health = %v, want the volume named", err)
	}
	s.Close()
	readoptedByNextServer(t, state, "vol", d.Path, 5)
}
