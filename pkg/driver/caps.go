package driver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// StorageClass parameters the driver understands.
const (
	ParamFsType     = "csi.storage.k8s.io/fstype"
	ParamQueues     = "queues"
	ParamQueueDepth = "queueDepth"
	ParamMaxIOSize  = "maxIOSize"
	// Keys under this prefix are added by the external-provisioner
	// (--extra-create-metadata) and are accepted and ignored.
	paramCSIPrefix = "csi.storage.k8s.io/"
)

var supportedFsTypes = map[string]bool{"ext4": true, "xfs": true}

const defaultFsType = "ext4"

// Node-local volumes can be used by one node only.
var supportedModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
}

// checkCapability reports why a capability cannot be served, or nil.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("volume capability is empty")
	}
	if c.GetAccessMode() == nil {
		return fmt.Errorf("access mode is missing")
	}
	if m := c.GetAccessMode().GetMode(); !supportedModes[m] {
		return fmt.Errorf("access mode %s is not supported by node-local volumes", m)
	}
	switch {
	case c.GetBlock() != nil:
	case c.GetMount() != nil:
		if fs := c.GetMount().GetFsType(); fs != "" && !supportedFsTypes[fs] {
			return fmt.Errorf("filesystem %q is not supported (ext4, xfs)", fs)
		}
	default:
		return fmt.Errorf("access type must be block or mount")
	}
	return nil
}

func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return fmt.Errorf("volume capabilities are missing")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// checkParams validates StorageClass parameters.
func checkParams(p map[string]string) error {
	for k, v := range p {
		switch k {
		case ParamFsType:
			if !supportedFsTypes[v] {
				return fmt.Errorf("parameter %s=%q: want ext4 or xfs", k, v)
			}
		case ParamQueues, ParamQueueDepth, ParamMaxIOSize:
		default:
			if !strings.HasPrefix(k, paramCSIPrefix) {
				return fmt.Errorf("unknown parameter %q (known: %s, %s, %s, %s)",
					k, ParamFsType, ParamQueues, ParamQueueDepth, ParamMaxIOSize)
			}
		}
	}
	_, err := tuningFromParams(p)
	return err
}

// tuningFromParams reads the per-volume queue overrides; the backend
// validates them against the node's limits.
func tuningFromParams(p map[string]string) (blockdev.Tuning, error) {
	var t blockdev.Tuning
	for key, dst := range map[string]*int{ParamQueues: &t.Queues, ParamQueueDepth: &t.QueueDepth} {
		s, ok := p[key]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 4096 {
			return t, fmt.Errorf("parameter %s=%q: want an integer from 1 to 4096", key, s)
		}
		if key == ParamQueueDepth && n&(n-1) != 0 {
			return t, fmt.Errorf("parameter %s=%q: want a power of two (ublk queue depths are)", key, s)
		}
		*dst = n
	}
	if s, ok := p[ParamMaxIOSize]; ok {
		n, err := ParseMaxIOSize(s)
		if err != nil {
			return t, fmt.Errorf("parameter %s=%q: %w", ParamMaxIOSize, s, err)
		}
		t.MaxIOBytes = n
	}
	return t, nil
}

// ParseMaxIOSize reads a request size (the maxIOSize parameter and the
// --max-io-size flag) in bytes, with an optional Ki or Mi suffix as in
// Kubernetes quantities: a multiple of 4Ki up to 1Mi.
func ParseMaxIOSize(s string) (int, error) {
	num, unit := s, 1
	switch {
	case strings.HasSuffix(s, "Ki"):
		num, unit = strings.TrimSuffix(s, "Ki"), 1<<10
	case strings.HasSuffix(s, "Mi"):
		num, unit = strings.TrimSuffix(s, "Mi"), 1<<20
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > blockdev.MaxIOBytesLimit/unit || n*unit%4096 != 0 {
		return 0, fmt.Errorf("want a multiple of 4Ki from 4Ki to 1Mi, in bytes or with a Ki or Mi suffix (e.g. 512Ki)")
	}
	return n * unit, nil
}

// fsTypeFor picks the filesystem: the capability's, then the parameter's,
// then ext4.
func fsTypeFor(c *csi.VolumeCapability, params map[string]string) string {
	if fs := c.GetMount().GetFsType(); fs != "" {
		return fs
	}
	if fs := params[ParamFsType]; fs != "" {
		return fs
	}
	return defaultFsType
}

func isSingleWriter(c *csi.VolumeCapability) bool {
	return c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
}

func isReadOnlyMode(c *csi.VolumeCapability) bool {
	return c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}
