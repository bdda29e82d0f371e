// Control payload memory. The kernel reads and writes the buffer a control
// command names in ctrl_cmd.addr (dev_info, params, cpumask, features) while
// the command runs, possibly on an io-wq worker after io_uring_enter has
// returned. That memory therefore lives outside the Go heap: one anonymous
// mmap'd page per Control, reused by the serialised commands. unsafe is
// used only to copy the fixed-layout UAPI structs in and out of that page;
// every copy is bounds-checked against the page length first, and the
// structs' layouts are pinned by zuapi_linux_test.go.

package ublk

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

// payloadSize covers the largest payload: a cpumask for 4096 CPUs (512
// bytes), ublk_params (152), dev_info (64).
const payloadSize = 4096

// payload is an mmap'd page handed to the kernel by control commands.
type payload struct{ mem []byte }

func newPayload() (*payload, error) {
	mem, err := unix.Mmap(-1, 0, payloadSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap control payload: %w", err)
	}
	return &payload{mem: mem}, nil
}

// addr is the page's address for ctrl_cmd.addr.
func (p *payload) addr() uint64 { return uint64(uintptr(unsafe.Pointer(&p.mem[0]))) }

func (p *payload) clear(n int) { clear(p.mem[:n]) }

func (p *payload) putDevInfo(info DevInfo) uint16 {
	*(*DevInfo)(unsafe.Pointer(&p.mem[0])) = info
	return uint16(unsafe.Sizeof(info))
}

func (p *payload) devInfo() DevInfo { return *(*DevInfo)(unsafe.Pointer(&p.mem[0])) }

func (p *payload) putParams(pr uapi.Params) uint16 {
	*(*uapi.Params)(unsafe.Pointer(&p.mem[0])) = pr
	return uint16(unsafe.Sizeof(pr))
}

func (p *payload) params() uapi.Params { return *(*uapi.Params)(unsafe.Pointer(&p.mem[0])) }

// bytes returns the first n bytes (cpumask, features).
func (p *payload) bytes(n int) []byte { return p.mem[:n] }

// release unmaps the page. It must not be called while a command that
// names it may still be running in the kernel (see Control.abandon).
func (p *payload) release() error {
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}
