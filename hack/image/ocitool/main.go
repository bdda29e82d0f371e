// Command ocitool is the Go half of hack/image/build.sh, which builds the
// plugin's multi-architecture image without a container engine:
//
//	ocitool chartref CHART_DIR          print the plugin image the chart runs by default
//	ocitool elfcheck ROOTFS GOARCH      check every ELF of ROOTFS is for GOARCH and finds its libraries
//	ocitool index LAYOUT REF TAG...     make REF an image index of the images tagged TAG in LAYOUT
//
// chartref makes the chart the one source of the image's name: build.sh
// tags what it builds with it, so `make image` and the chart's default
// cannot drift apart. elfcheck needs no emulator, so the arm64 root
// filesystem is checked on an amd64 host. index replaces the per-platform
// tags umoci wrote with one index, named REF for containerd (ctr images
// import) and tagged with REF's tag for OCI tools (skopeo).
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ocitool:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: ocitool chartref, elfcheck or index")
	}
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "chartref" && len(rest) == 1:
		ref, err := chartRef(rest[0])
		if err != nil {
			return err
		}
		fmt.Println(ref)
		return nil
	case cmd == "elfcheck" && len(rest) == 2:
		n, err := elfCheck(rest[0], rest[1])
		if err != nil {
			return err
		}
		fmt.Printf("elfcheck: %d ELF files for %s find their interpreter and libraries\n", n, rest[1])
		return nil
	case cmd == "index" && len(rest) >= 3:
		return makeIndex(rest[0], rest[1], rest[2:])
	}
	return fmt.Errorf("bad arguments %q", args)
}
