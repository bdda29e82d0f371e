package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/qos"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
)

// TestErrorCodes pins the mapping from blockdev's error classes to the gRPC
// codes the CSI spec names for them.
func TestErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("volume x: %w", blockdev.ErrNotFound), codes.NotFound},
		{fmt.Errorf("name y: %w", blockdev.ErrConflict), codes.AlreadyExists},
		{blockdev.ErrInvalid, codes.InvalidArgument},
		{fmt.Errorf("create: %w", blockdev.ErrNoSpace), codes.ResourceExhausted},
		{blockdev.ErrOutOfRange, codes.OutOfRange},
		{blockdev.ErrBusy, codes.FailedPrecondition},
		{fmt.Errorf("resize: %w", blockdev.ErrNotSupported), codes.FailedPrecondition},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("disk on fire"), codes.Internal},
		{status.Error(codes.Aborted, "busy"), codes.Aborted},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := status.Code(toStatus(tc.err)); got != tc.want {
				t.Errorf("code = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSizeFor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		req, lim int64
		want     int64
		code     codes.Code
	}{
		{"default", 0, 0, defaultVolumeSize, codes.OK},
		{"default capped by limit", 0, 1 << 20, 1 << 20, codes.OK},
		{"rounded up", 1000, 0, 4096, codes.OK},
		{"exact", 8192, 8192, 8192, codes.OK},
		{"limit rounds down", 1, 6000, 4096, codes.OK},
		{"no aligned size in range", 4097, 5000, 0, codes.OutOfRange},
		{"required above limit", 10, 5, 0, codes.InvalidArgument},
		{"negative", -1, 0, 0, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sizeFor(&csi.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.lim})
			if status.Code(err) != tc.code {
				t.Fatalf("err = %v, want code %v", err, tc.code)
			}
			if got != tc.want {
				t.Errorf("size = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPaginate(t *testing.T) {
	items := []int{0, 1, 2, 3, 4}
	var got []int
	token := ""
	for range 10 {
		page, next, err := paginate(items, token, 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if next == "" {
			break
		}
		token = next
	}
	if fmt.Sprint(got) != fmt.Sprint(items) {
		t.Errorf("pages joined = %v, want %v", got, items)
	}
	for _, bad := range []string{"x", "-1", strconv.Itoa(len(items) + 1)} {
		if _, _, err := paginate(items, bad, 0); status.Code(err) != codes.Aborted {
			t.Errorf("token %q: err = %v, want Aborted", bad, err)
		}
	}
}

// TestParseMaxIOSize pins the maxIOSize parameter's format: bytes or Ki/Mi,
// a multiple of 4 KiB from 4 KiB to 1 MiB, nothing that could overflow.
func TestParseMaxIOSize(t *testing.T) {
	for in, want := range map[string]int{"4096": 4096, "4Ki": 4096, "512Ki": 512 << 10, "1Mi": 1 << 20,
		"1048576": 1 << 20, "1024Ki": 1 << 20} {
		if got, err := ParseMaxIOSize(in); err != nil || got != want {
			t.Errorf("ParseMaxIOSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-4Ki", "1000", "6Ki", "2Mi", "1025Ki", "1Gi", "512k", "512KiB",
		"9223372036854775807Mi", "1.5Mi"} {
		if got, err := ParseMaxIOSize(in); err == nil {
			t.Errorf("ParseMaxIOSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestCheckParams(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    map[string]string
		ok   bool
	}{
		{"empty", nil, true},
		{"xfs and tuning", map[string]string{ParamFsType: "xfs", ParamQueues: "2", ParamQueueDepth: "128"}, true},
		{"provisioner metadata", map[string]string{"csi.storage.k8s.io/pvc/name": "data"}, true},
		{"bad fs", map[string]string{ParamFsType: "vfat"}, false},
		{"bad queues", map[string]string{ParamQueues: "0"}, false},
		{"huge depth", map[string]string{ParamQueueDepth: "100000"}, false},
		{"depth not a power of two", map[string]string{ParamQueueDepth: "100"}, false},
		{"max i/o size", map[string]string{ParamMaxIOSize: "512Ki", ParamQueueDepth: "16"}, true},
		{"max i/o size too large", map[string]string{ParamMaxIOSize: "2Mi"}, false},
		{"unknown", map[string]string{"speed": "ludicrous"}, false},
		{"rate limits", map[string]string{ParamMaxIOPS: "5000", ParamMaxBandwidth: "200Mi"}, true},
		{"no limit", map[string]string{ParamMaxIOPS: "0", ParamMaxBandwidth: "0"}, true},
		{"negative iops", map[string]string{ParamMaxIOPS: "-1"}, false},
		{"fractional iops", map[string]string{ParamMaxIOPS: "1.5"}, false},
		{"bandwidth below 1Mi", map[string]string{ParamMaxBandwidth: "512Ki"}, false},
		{"bandwidth unit", map[string]string{ParamMaxBandwidth: "100MB"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkParams(tc.p); (err == nil) != tc.ok {
				t.Errorf("checkParams(%v) = %v, want ok=%v", tc.p, err, tc.ok)
			}
		})
	}
}

// TestParseBandwidth pins the maxBandwidth format: bytes per second with an
// optional binary or decimal suffix, as in Kubernetes quantities.
func TestParseBandwidth(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "200Mi": 200 << 20, "1Gi": 1 << 30,
		"500M": 500e6, "2G": 2e9, "800k": 800e3, "64Ki": 64 << 10} {
		if got, err := ParseBandwidth(in); err != nil || got != want {
			t.Errorf("ParseBandwidth(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1Mi", "1.5Gi", "100MB", "1Ti", "Mi", "9223372036854775807Gi"} {
		if got, err := ParseBandwidth(in); err == nil {
			t.Errorf("ParseBandwidth(%q) = %d, want an error", in, got)
		}
	}
}

// TestMutableParams proves only the rate limits may change after creation,
// and that mutable parameters override the StorageClass's.
func TestMutableParams(t *testing.T) {
	if err := checkMutableParams(map[string]string{ParamMaxIOPS: "100", ParamMaxBandwidth: "10Mi"}); err != nil {
		t.Errorf("rate limits as mutable parameters: %v", err)
	}
	for _, p := range []map[string]string{{ParamQueues: "2"}, {ParamFsType: "xfs"}, {ParamMaxIOPS: "x"}} {
		if err := checkMutableParams(p); err == nil {
			t.Errorf("checkMutableParams(%v) = nil, want an error", p)
		}
	}
	v := blockdev.Volume{Params: map[string]string{ParamMaxIOPS: "100", ParamMaxBandwidth: "10Mi"},
		MutableParams: map[string]string{ParamMaxIOPS: "2000"}}
	if got, err := limitsOf(v); err != nil || got != (qos.Limits{IOPS: 2000, BytesPerSecond: 10 << 20}) {
		t.Errorf("limitsOf = %+v, %v; want the mutable IOPS over the class's, the class's bandwidth", got, err)
	}
}

// TestKeyLocksSerialise proves a second locker waits for the first and
// gives up when its context ends.
func TestKeyLocksSerialise(t *testing.T) {
	k := newKeyLocks()
	unlock, err := k.lock(context.Background(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := k.lock(ctx, "v1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock: %v, want deadline exceeded", err)
	}
	other, err := k.lock(context.Background(), "v2")
	if err != nil {
		t.Fatalf("other key must not wait: %v", err)
	}
	other()
	unlock()
	again, err := k.lock(context.Background(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	again()
	if n := len(k.locks); n != 0 {
		t.Errorf("%d lock entries left, want 0", n)
	}
}

// TestAttachRequestTuning proves that a volume's StorageClass tuning
// (queueDepth, maxIOSize) reaches the backend over the node's defaults,
// and that the node's defaults fill what the StorageClass left out.
func TestAttachRequestTuning(t *testing.T) {
	store, err := store.Open(store.Config{Dir: t.TempDir(), OverProvisionRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{Tuning: blockdev.Tuning{Queues: 2, QueueDepth: 64, MaxIOBytes: 128 << 10}}, store: &classes{def: store}}
	v := blockdev.Volume{ID: blockdev.VolumeID("pvc-tuned"), SizeBytes: 1 << 30,
		Params: map[string]string{ParamQueueDepth: "16", ParamMaxIOSize: "1Mi"}}
	req := d.attachRequest(v)
	want := blockdev.Tuning{Queues: 2, QueueDepth: 16, MaxIOBytes: 1 << 20}
	if req.Tuning != want || req.File != store.VolumeFile(v.ID) {
		t.Fatalf("attachRequest tuning %+v file %q, want %+v and the volume's file", req.Tuning, req.File, want)
	}
	if !req.Limits.IsZero() {
		t.Fatalf("attachRequest limits %v for a volume without any", req.Limits)
	}
	v.MutableParams = map[string]string{ParamMaxIOPS: "300"}
	if got := d.attachRequest(v).Limits; got != (qos.Limits{IOPS: 300}) {
		t.Fatalf("attachRequest limits %+v, want 300 IOPS from the mutable parameters", got)
	}
}
