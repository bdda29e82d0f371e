package backend

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/kernel"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/uring"
)

// Backend selection where the ublk control device exists but ublk cannot
// serve (issue 23, defect 12). The control device's presence is what
// "auto" looks at; Config.UblkControl points it at a file in the
// test's directory, so the fallback runs on hosts without ublk too.

func selectConfig(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	control := filepath.Join(dir, "ublk-control")
	if err := os.WriteFile(control, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{DataDir: filepath.Join(dir, "data"), DevDir: filepath.Join(dir, "dev"), UblkControl: control}
}

func closeBackend(t *testing.T, b blockdev.Backend) {
	t.Helper()
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
}

// TestAutoFallsBackWhenUblkFails: with the control device present and
// io_uring working, a ublk backend that cannot start makes "auto" serve
// with loop and say why (where the kernel has a working ublk, "auto" picks
// it and does not fall back).
func TestAutoFallsBackWhenUblkFails(t *testing.T) {
	testgate.RequireRoot(t)
	cfg := selectConfig(t)
	b, fb, err := Select("auto", cfg)
	if err != nil {
		t.Fatalf("Select(auto): %v", err)
	}
	closeBackend(t, b)
	if _, herr := ublk.HaveUblk(); herr == nil {
		if b.Name() != "ublk" || fb != nil {
			t.Fatalf("working ublk: backend %s, fallback %+v", b.Name(), fb)
		}
		return
	}
	if b.Name() != "loop" || fb == nil || fb.Reason != FallbackUblkFailed || fb.Err == nil {
		t.Fatalf("ublk unusable: backend %s, fallback %+v; want loop and %s", b.Name(), fb, FallbackUblkFailed)
	}
	t.Logf("fallback: %s: %v", fb.Reason, fb.Err)
}

// TestIOUringRefusedBySeccomp runs the checks of checkIOUringRefused in a
// child process whose every thread has a seccomp filter that answers
// io_uring_setup, io_uring_enter and io_uring_register with EPERM, as a
// container runtime's default profile does.
func TestIOUringRefusedBySeccomp(t *testing.T) {
	if os.Getenv(seccompChildEnv) == "1" {
		if err := refuseIOUring(); err != nil {
			t.Fatal(err)
		}
		checkIOUringRefused(t, "a seccomp filter")
		return
	}
	testgate.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestIOUringRefusedBySeccomp$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), seccompChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("child with io_uring refused: %v", err)
	}
}

// TestIOUringDisabledBySysctl sets kernel.io_uring_disabled=2 for the time
// of checkIOUringRefused. The sysctl is machine-wide, so this runs only
// when FASTBLK_TEST_SYSCTL=1: on a shared host it would fail other
// processes' io_uring meanwhile.
func TestIOUringDisabledBySysctl(t *testing.T) {
	testgate.RequireRoot(t)
	if os.Getenv("FASTBLK_TEST_SYSCTL") != "1" {
		testgate.Skip(t, testgate.Sysctl, "changes a machine-wide sysctl; set FASTBLK_TEST_SYSCTL=1 (TestIOUringRefusedBySeccomp covers the same checks per process)")
	}
	const sysctl = "/proc/sys/kernel/io_uring_disabled"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatalf("this kernel has no io_uring_disabled sysctl: %v", err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(sysctl, old, 0o644); err != nil {
			t.Errorf("restore %s to %q: %v", sysctl, old, err)
		}
	})
	if err := os.WriteFile(sysctl, []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkIOUringRefused(t, "sysctl kernel.io_uring_disabled=2")
}

// checkIOUringRefused asserts, where io_uring is refused, that the engine
// says so with the errno, that "auto" falls back to loop with the reason
// and an error naming the cause, and that an explicit "ublk" fails
// instead of falling back.
func checkIOUringRefused(t *testing.T, cause string) {
	t.Helper()
	_, err := uring.New(uring.Config{Entries: 4})
	if err == nil || !(errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS)) {
		t.Fatalf("uring.New with io_uring refused: %v, want an error wrapping EPERM or ENOSYS", err)
	}
	t.Logf("engine: %v", err)
	cfg := selectConfig(t)
	b, fb, err := Select("auto", cfg)
	if err != nil {
		t.Fatalf("Select(auto) with io_uring refused: %v", err)
	}
	closeBackend(t, b)
	if b.Name() != "loop" || fb == nil || fb.Reason != FallbackIOUringRefused {
		t.Fatalf("auto with io_uring refused: backend %s, fallback %+v; want loop and %s", b.Name(), fb, FallbackIOUringRefused)
	}
	if msg := fb.Err.Error(); !strings.Contains(msg, "io_uring refused by "+cause) {
		t.Fatalf("fallback error %q does not name %s", msg, cause)
	}
	t.Logf("auto: %s: %v", fb.Reason, fb.Err)
	if b, _, err := Select("ublk", cfg); err == nil || !strings.Contains(err.Error(), "io_uring refused") {
		if b != nil {
			b.Close()
		}
		t.Fatalf("Select(ublk) with io_uring refused: %v, want an error saying io_uring is refused", err)
	} else {
		t.Logf("ublk: %v", err)
	}
}

const seccompChildEnv = "FASTBLK_TEST_SECCOMP_CHILD"

// refuseIOUring installs, on every thread of this process (TSYNC), a
// seccomp filter that fails the three io_uring system calls with EPERM.
func refuseIOUring() error {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return fmt.Errorf("no audit arch for %s", runtime.GOARCH)
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldAbs, K: 4}, // arch
		{Code: jeq, K: arch, Jf: 4},
		{Code: ldAbs, K: 0}, // nr
		{Code: jeq, K: unix.SYS_IO_URING_SETUP, Jt: 3},
		{Code: jeq, K: unix.SYS_IO_URING_ENTER, Jt: 2},
		{Code: jeq, K: unix.SYS_IO_URING_REGISTER, Jt: 1},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	return nil
}

// TestAutoCountsFallbackWithoutUblk: where the ublk control device does not
// exist, "auto" still tries ublk (it loads ublk_drv, kernel.LoadModule) and,
// when that fails, serves with loop AND says why: a fallback is a fallback
// whatever its cause (issue 52: it was recorded only when the control device
// existed, so a node without ublk_drv fell back silently). On this machine
// the kernel has no ublk_drv and loads no modules; in the VM the module is
// loaded, but the control device named here never appears.
func TestAutoCountsFallbackWithoutUblk(t *testing.T) {
	testgate.RequireRoot(t)
	cfg := selectConfig(t)
	cfg.UblkControl = filepath.Join(t.TempDir(), "no-ublk-control")
	b, fb, err := Select("auto", cfg)
	if err != nil {
		t.Fatalf("Select(auto): %v", err)
	}
	closeBackend(t, b)
	if b.Name() != "loop" || fb == nil || fb.Err == nil {
		t.Fatalf("no ublk control device: backend %s, fallback %+v; want loop and the reason", b.Name(), fb)
	}
	want := FallbackUblkAbsent
	if kernel.ModuleLoaded("ublk_drv") {
		want = FallbackUblkLoadFailed
	}
	if fb.Reason != want {
		t.Errorf("fallback reason %q (%v), want %q", fb.Reason, fb.Err, want)
	}
	t.Logf("fallback: %s: %v", fb.Reason, fb.Err)
	if _, _, err := Select("ublk", cfg); err == nil || !strings.Contains(err.Error(), "ublk_drv") {
		t.Errorf("Select(ublk) without ublk: %v, want an error naming ublk_drv", err)
	}
}
