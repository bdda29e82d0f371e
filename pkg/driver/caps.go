package driver

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/devclass"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
)

// StorageClass parameters the driver understands.
const (
	ParamFsType     = "csi.storage.k8s.io/fstype"
	ParamQueues     = "queues"
	ParamQueueDepth = "queueDepth"
	ParamMaxIOSize  = "maxIOSize"
	// Rate limits: requests and bytes per second (reads plus writes).
	// They may also come as mutable parameters (a VolumeAttributesClass)
	// and change while the volume is in use.
	ParamMaxIOPS      = "maxIOPS"
	ParamMaxBandwidth = "maxBandwidth"
	// ParamPreallocation gives the volume's backing file disk blocks for
	// its whole size at create and expansion, so that the space counts
	// as used from the start: "falloc" allocates them (unwritten
	// extents), "full" also writes zeros over them, so that first writes
	// are as fast as overwrites (see blockdev.Preallocation). "off" (the
	// default) keeps the file sparse.
	ParamPreallocation = "preallocation"
	// ParamTransferRate bounds, in bytes per second, the copy of a source
	// that lives on another node (a restore or clone pulled over the peer
	// channel), so that both nodes' other volumes keep their disks;
	// default 200Mi, at least 1Mi, 0 for no bound.
	ParamTransferRate = "transferRate"
	// ParamCrossNodeSource says how a volume whose source lives on
	// another node is made: "pull" (the default) copies the data here
	// over the peer channel; "handoff" has the source's node make it
	// (a reflink there) and answers with that node's topology, so that
	// the scheduler moves the pod to the source's node.
	ParamCrossNodeSource = "crossNodeSource"
	crossNodePull        = "pull"
	crossNodeHandoff     = "handoff"
	// Keys under this prefix are added by the external-provisioner
	// (--extra-create-metadata) and are accepted; the volume keeps them
	// with its other parameters, and the metrics name the PVC and PV
	// from these three.
	paramCSIPrefix    = "csi.storage.k8s.io/"
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParamPVName       = "csi.storage.k8s.io/pv/name"
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
		case ParamCrossNodeSource:
			if v != crossNodePull && v != crossNodeHandoff {
				return fmt.Errorf("parameter %s=%q: want %s (copy the data to the node the pod is on, the default) or %s (make the volume on the source's node, and let the pod follow)",
					k, v, crossNodePull, crossNodeHandoff)
			}
		case ParamTransferRate:
			if r, err := ParseBandwidth(v); err != nil || (r != 0 && r < minTransferRate) {
				return fmt.Errorf("parameter %s=%q: want bytes per second, at least 1Mi, or 0 for no bound (e.g. 200Mi)", k, v)
			}
		case ParamDeviceClass:
			if err := devclass.CheckName(v); err != nil {
				return fmt.Errorf("parameter %s: %w", k, err)
			}
		case ParamQueues, ParamQueueDepth, ParamMaxIOSize, ParamMaxIOPS, ParamMaxBandwidth, ParamPreallocation:
		default:
			if !strings.HasPrefix(k, paramCSIPrefix) {
				return fmt.Errorf("unknown parameter %q (known: %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", k, ParamFsType, ParamDeviceClass,
					ParamQueues, ParamQueueDepth, ParamMaxIOSize, ParamMaxIOPS, ParamMaxBandwidth, ParamPreallocation, ParamTransferRate, ParamCrossNodeSource)
			}
		}
	}
	if _, err := tuningFromParams(p); err != nil {
		return err
	}
	if _, err := preallocationFromParams(p); err != nil {
		return err
	}
	_, err := limitsFromParams(p)
	return err
}

// preallocationFromParams reads the preallocation parameter: exactly off
// (or absent), falloc or full, so that a typo never passes for a choice.
func preallocationFromParams(p map[string]string) (blockdev.Preallocation, error) {
	s, ok := p[ParamPreallocation]
	switch {
	case !ok || s == "off":
		return blockdev.PreallocOff, nil
	case s == string(blockdev.PreallocFalloc) || s == string(blockdev.PreallocFull):
		return blockdev.Preallocation(s), nil
	}
	return "", fmt.Errorf("parameter %s=%q: want off (sparse, the default), falloc (allocate the backing file at create and expansion) "+
		"or full (allocate it and write zeros over it, so that first writes are as fast as overwrites)", ParamPreallocation, s)
}

// checkMutableParams validates mutable parameters: only the rate limits
// may change over a volume's life.
func checkMutableParams(p map[string]string) error {
	for k := range p {
		if k != ParamMaxIOPS && k != ParamMaxBandwidth {
			return fmt.Errorf("parameter %q cannot be changed (mutable: %s, %s)", k, ParamMaxIOPS, ParamMaxBandwidth)
		}
	}
	_, err := limitsFromParams(p)
	return err
}

// limitsOf returns the rate limits of a volume: its parameters, with the
// mutable ones on top.
func limitsOf(v blockdev.Volume) (qos.Limits, error) {
	return limitsFromParams(v.EffectiveParams())
}

// limitsFromParams reads maxIOPS and maxBandwidth ("0" or absent: none).
func limitsFromParams(p map[string]string) (qos.Limits, error) {
	var l qos.Limits
	if s, ok := p[ParamMaxIOPS]; ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n > maxIOPSLimit {
			return l, fmt.Errorf("parameter %s=%q: want requests per second, an integer from 0 (no limit) to %d", ParamMaxIOPS, s, maxIOPSLimit)
		}
		l.IOPS = n
	}
	if s, ok := p[ParamMaxBandwidth]; ok {
		n, err := ParseBandwidth(s)
		if err != nil {
			return l, fmt.Errorf("parameter %s=%q: %w", ParamMaxBandwidth, s, err)
		}
		l.BytesPerSecond = n
	}
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("parameters %s/%s: %w", ParamMaxIOPS, ParamMaxBandwidth, err)
	}
	return l, nil
}

// maxIOPSLimit bounds maxIOPS far above any device (and so that a
// request's cost in nanoseconds never rounds to 0).
const maxIOPSLimit = 100_000_000

// quantityUnits are the suffixes of sizes in parameters, as in Kubernetes
// quantities: binary Ki, Mi, Gi and decimal k, M, G.
var quantityUnits = []struct {
	suffix string
	mult   int64
}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}}

// splitQuantity splits a size into its number and the multiplier of its
// suffix (1 without one).
func splitQuantity(s string) (string, int64) {
	for _, u := range quantityUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			return num, u.mult
		}
	}
	return s, 1
}

// ParseBandwidth reads a bandwidth in bytes per second: an integer with an
// optional Ki, Mi, Gi, k, M or G suffix; 0 means no limit.
func ParseBandwidth(s string) (int64, error) {
	num, mult := splitQuantity(s)
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("want bytes per second: an integer with an optional Ki, Mi, Gi, k, M or G suffix (e.g. 200Mi), 0 for no limit")
	}
	return n * mult, nil
}

// ParseBytes reads a size in bytes: an integer with an optional Ki, Mi, Gi,
// k, M or G suffix.
func ParseBytes(s string) (int64, error) {
	num, mult := splitQuantity(s)
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: want bytes, an integer with an optional Ki, Mi, Gi, k, M or G suffix (e.g. 10Gi)", s)
	}
	return n * mult, nil
}

// ParseReserve reads a reserve: a size (see ParseBytes), or a percentage
// of the filesystem, "N%" with 0 <= N < 100 (fractions allowed). It returns
// the bytes or the ratio, the other zero.
func ParseReserve(s string) (bytes int64, ratio float64, err error) {
	if num, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(num, 64)
		if err != nil || !(p >= 0 && p < 100) {
			return 0, 0, fmt.Errorf("reserve %q: want a percentage from 0 to below 100, such as 10%%", s)
		}
		return 0, p / 100, nil
	}
	bytes, err = ParseBytes(s)
	return bytes, 0, err
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

// checkNodeTuning refuses tuning parameters this node can never serve:
// more ublk queues than it has CPUs (the ublk server's limit, since the
// kernel clamps a device's hardware queues to the CPU count). Checked at
// creation on whatever backend the node runs, since a node may move from
// loop to ublk. What the queue buffers cost (queues × queueDepth ×
// maxIOSize, at most 256 MiB) depends on whether the node's kernel has zero
// copy and is checked when the device is made.
func checkNodeTuning(p map[string]string, cpus int) error {
	t, err := tuningFromParams(p)
	if err != nil {
		return err
	}
	if t.Queues > cpus {
		return fmt.Errorf("parameter %s=%d: this node has %d CPUs, and a ublk device takes at most one queue per CPU", ParamQueues, t.Queues, cpus)
	}
	return nil
}

// tuningError adds to an attach error the tuning parameters the volume
// asked for when the backend refused them (ErrInvalid), so that the stage
// error names the StorageClass parameter to fix.
func tuningError(p map[string]string, err error) error {
	if !errors.Is(err, blockdev.ErrInvalid) {
		return err
	}
	var set []string
	for _, k := range []string{ParamQueues, ParamQueueDepth, ParamMaxIOSize} {
		if v, ok := p[k]; ok {
			set = append(set, k+"="+v)
		}
	}
	if len(set) == 0 {
		return err
	}
	return fmt.Errorf("StorageClass parameters %s: %w", strings.Join(set, ", "), err)
}

// ParseMaxIOSize reads a request size (the maxIOSize parameter and the
// --max-io-size flag) in bytes, with an optional Ki or Mi suffix as in
// Kubernetes quantities: a multiple of 4Ki up to 1Mi.
func ParseMaxIOSize(s string) (int, error) {
	num, mult := splitQuantity(s)
	unit := int(mult)
	n, err := strconv.Atoi(num)
	// Binary suffixes only: "512k" would be 512,000 bytes, surely not
	// what was meant (and Gi never fits).
	if err != nil || (unit != 1 && unit%1024 != 0) || n < 1 || n > backend.MaxIOBytesLimit/unit || n*unit%4096 != 0 {
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
