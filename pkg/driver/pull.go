package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/copypace"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/store"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// A CreateVolume whose source (a snapshot, or a volume to clone) lives on
// another node pulls the data from that node's plugin over the peer
// channel: the source's node streams its allocated extents (pkg/peer's
// ReadData, checked frame by frame and end to end) into a volume this
// node makes with store.BeginImport, recorded as "creating" until the
// data is in and synced.
//
// The copy runs in the background, not in the call: a copy of a large
// volume may outlast the external-provisioner's timeout. A call waits for
// it until shortly before its own deadline, or maxPullWait (firstPullWait
// for the call that starts it), and then answers Aborted with the progress
// (non-final for the provisioner, which retries with the same name and
// records the message as an event on the claim); the retry that comes
// after the copy ended gets its outcome. A failed copy leaves nothing
// behind, and the next retry starts afresh. DeleteVolume of the target
// cancels its copy. A crash of this plugin loses the copy (Open removes
// the "creating" volume) and the retry starts afresh; a crash of the
// source's plugin or a cut connection fails it (Unavailable) the same way.

const (
	// defaultTransferRate bounds a pull when the class says nothing, so
	// that both nodes' other volumes keep their disks.
	defaultTransferRate = 200 << 20
	// pullIdle cuts a stream that brings nothing for this long.
	pullIdle = time.Minute
	// maxPullWait is the longest a CreateVolume waits for its copy: the
	// provisioner's timeout is long (the chart's csiTimeout, 1h), and
	// each Aborted it gets is an event with the progress on the claim.
	maxPullWait = 5 * time.Minute
	// minTransferRate keeps a frame of data well within pullIdle. It
	// is also the rate a pull's deadline counts with, as the source's
	// node does (peer.DefaultLimits).
	minTransferRate = 1 << 20
)

// A pull's whole length is bounded: the source's node keeps the idle cut
// off with wait frames while it prepares the source, so a broken or
// hostile one could otherwise hold a pull for ever. Until the stream's
// header the bound is pullPrepare; from the header on, the source's size
// at minTransferRate and pullSlack (a little more than the sender's own
// deadline, peer's streamSlack, so that the sender's answer comes first).
// Variables for tests.
var (
	pullPrepare = time.Hour
	pullSlack   = 3 * time.Minute
)

// firstPullWait is the longest the call that starts a copy waits for it,
// so that a copy of a few minutes has its progress on the claim early; the
// provisioner's first retry follows within seconds and waits maxPullWait.
// A variable for tests.
var firstPullWait = 20 * time.Second

// pull is one copy in flight into the volume id.
type pull struct {
	id, source string           // the target's store ID; the source's CSI ID
	kind       peer.SourceKind  // what the source is
	node       string           // the source's node tag
	spec       store.VolumeSpec // the target, with its smallest size
	explicit   bool             // the request named a size
	limit      int64            // the request's limit bytes (0: none)
	started    time.Time
	size       atomic.Int64 // the source's size, once known
	alloc      atomic.Int64 // the most data to come, once known
	received   atomic.Int64
	cancel     context.CancelFunc
	done       chan struct{} // closed when vol or err is set
	vol        blockdev.Volume
	err        error
}

// pulls are the copies in flight by target ID.
type pulls struct {
	mu sync.Mutex
	m  map[string]*pull
}

func (ps *pulls) get(id string) *pull {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[id]
}

// add records p unless a copy into its target is in flight, which it
// returns instead.
func (ps *pulls) add(p *pull) *pull {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if old := ps.m[p.id]; old != nil {
		return old
	}
	if ps.m == nil {
		ps.m = make(map[string]*pull)
	}
	ps.m[p.id] = p
	return p
}

// remove forgets p (not a newer copy into its target).
func (ps *pulls) remove(p *pull) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m[p.id] == p {
		delete(ps.m, p.id)
	}
}

func (ps *pulls) list() []*pull {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*pull, 0, len(ps.m))
	for _, p := range ps.m {
		out = append(out, p)
	}
	return out
}

// pull answers CreateVolume for a volume whose source is on another node
// (spec.SourceNode): the volume if it exists or its copy ends within the
// call's deadline, else Aborted with the progress (see the top of the
// file). The caller holds the name's lock.
func (d *Driver) pull(ctx context.Context, req *csi.CreateVolumeRequest, spec store.VolumeSpec) (*csi.CreateVolumeResponse, error) {
	check := spec
	if req.GetCapacityRange().GetRequiredBytes() == 0 {
		check.SizeBytes = 0 // the source's size, unknown here
	}
	answer := func(v blockdev.Volume) (*csi.CreateVolumeResponse, error) {
		if err := store.SameVolume(v, check); err != nil {
			return nil, toStatus(err)
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(v, req.GetVolumeContentSource())}, nil
	}
	id := blockdev.VolumeID(spec.Name)
	if v, err := d.store.Volume(id); err == nil {
		return answer(v)
	}
	kind, srcID := peer.SourceSnapshot, spec.SourceSnapshotID
	if spec.SourceVolumeID != "" {
		kind, srcID = peer.SourceVolume, spec.SourceVolumeID
	}
	// The source's class is the volume's (sameClass).
	source := formatID(srcID, className(spec.Params), spec.SourceNode)
	if d.cfg.NoPeerData {
		return nil, d.pinToSource(kind, source, "the installation's plugins send no data to each other (--peer-serve-data=false)")
	}
	// The copy's context is its own, not the call's: only DeleteVolume
	// (cancelPull) ends it.
	copyCtx, cancel := context.WithCancel(context.Background())
	p := &pull{id: id, source: source, kind: kind, node: spec.SourceNode, spec: spec,
		explicit: check.SizeBytes != 0, limit: req.GetCapacityRange().GetLimitBytes(), started: time.Now(), cancel: cancel, done: make(chan struct{})}
	wait := maxPullWait
	if q := d.pulls.add(p); q != p {
		cancel()
		p = q // a retry: wait for the copy in flight
	} else {
		d.startPull(copyCtx, p)
		wait = firstPullWait
	}
	if dl, ok := ctx.Deadline(); ok {
		// Answer before the caller gives up, so that it gets the
		// progress rather than its own DeadlineExceeded.
		wait = min(wait, time.Until(dl)*9/10)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		return nil, status.Errorf(codes.Aborted, "%s: in progress, retry later", p.progress())
	case <-ctx.Done():
		return nil, status.Errorf(codes.Aborted, "%s: in progress, retry later", p.progress())
	}
	d.pulls.remove(p) // its outcome is this call's
	if p.err != nil {
		return nil, p.err
	}
	return answer(p.vol)
}

// startPull copies p's data in the background under ctx.
func (d *Driver) startPull(ctx context.Context, p *pull) {
	klog.InfoS("pulling volume data from another node", "volumeID", p.id, "name", p.spec.Name, "source", p.source, "kind", p.kind, "node", p.node)
	go func() {
		defer p.cancel()
		v, err := d.runPull(ctx, p)
		if err != nil {
			klog.ErrorS(err, "pull failed", "volumeID", p.id, "source", p.source, "received", p.received.Load(), "took", time.Since(p.started))
		} else {
			klog.InfoS("volume pulled", "volumeID", p.id, "source", p.source, "size", v.SizeBytes, "received", p.received.Load(), "took", time.Since(p.started))
		}
		p.vol, p.err = v, err
		if err == nil {
			d.pulls.remove(p) // the volume answers from now on
		}
		close(p.done)
	}()
}

// pinToSource answers a CreateVolume from the source id of another node
// that is not pulled, for why: as without the peer channel,
// ResourceExhausted, on which the provisioner reschedules the claim (a
// pod that can run on the source's node then does).
func (d *Driver) pinToSource(kind peer.SourceKind, id, why string) error {
	st := status.Convert(d.sourceElsewhere(kind.String(), id))
	return status.Errorf(st.Code(), "%s (%s)", st.Message(), why)
}

// runPull streams the source into a new volume and commits it, within the
// pull's deadline (pullPrepare, pullSlack). A panic in it fails the pull
// with Internal and leaves nothing, not the plugin's end.
func (d *Driver) runPull(ctx context.Context, p *pull) (v blockdev.Volume, err error) {
	rate := int64(defaultTransferRate)
	if s, ok := p.spec.Params[ParamTransferRate]; ok {
		rate, _ = ParseBandwidth(s) // checked by checkParams
	}
	ctx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	deadline := func(after time.Duration, of string) *time.Timer {
		return time.AfterFunc(after, func() {
			cut(status.Errorf(codes.DeadlineExceeded, "longer than its deadline of %v (%s)", after.Round(time.Second), of))
		})
	}
	timer := deadline(pullPrepare, "the longest a source's node may prepare it")
	defer func() { timer.Stop() }()
	pace := d.copies.Pacer(0) // the sender keeps the rate
	defer pace.Close()
	sink := &pullSink{ctx: ctx, d: d, p: p, pace: pace, started: func(size int64) {
		timer.Stop()
		timer = deadline(time.Duration(float64(size)/minTransferRate*float64(time.Second))+pullSlack,
			fmt.Sprintf("%d bytes at %d bytes/s and %v", size, minTransferRate, pullSlack))
	}}
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(fmt.Errorf("panic: %v", r), "pull panicked", "volumeID", p.id, "source", p.source, "stack", string(debug.Stack()))
			if sink.imp != nil {
				sink.imp.Abort()
			}
			v, err = blockdev.Volume{}, status.Errorf(codes.Internal, "%s: internal error (panic: %v)", p.progress(), r)
		}
	}()
	req := &peer.ReadRequest{Kind: p.kind, ID: p.source, Target: p.spec.Name, Rate: rate,
		Claim: p.spec.Params[ParamPVCNamespace] + "/" + p.spec.Params[ParamPVCName]}
	_, err = d.cfg.Peers.ReadData(ctx, p.node, req, sink, pullIdle)
	if errors.Is(err, errExists) {
		return sink.existing, nil
	}
	if err != nil {
		if sink.imp != nil {
			sink.imp.Abort()
		}
		if cause := context.Cause(ctx); status.Code(cause) == codes.DeadlineExceeded {
			err = cause
		} else if ctx.Err() != nil {
			return blockdev.Volume{}, status.Errorf(codes.Aborted, "%s: cancelled (the volume was deleted)", p.progress())
		}
		st := status.Convert(toStatus(err))
		code := st.Code()
		switch code {
		case codes.ResourceExhausted:
			// The source's node is at its limits: retried, not
			// rescheduled as the provisioner does on ResourceExhausted.
			code = codes.Unavailable
		case codes.PermissionDenied:
			return blockdev.Volume{}, d.pinToSource(p.kind, p.source, "its node refused the stream: "+st.Message())
		}
		return blockdev.Volume{}, status.Errorf(code, "%s: %s", p.progress(), st.Message())
	}
	v, err = sink.imp.Commit()
	if err != nil {
		return blockdev.Volume{}, toStatus(fmt.Errorf("%s: %w", p.progress(), err))
	}
	return v, nil
}

// errExists ends a stream whose target turned out to exist.
var errExists = errors.New("volume exists")

// pullSink makes the target when the stream says how large the source is.
type pullSink struct {
	ctx      context.Context
	d        *Driver
	p        *pull
	started  func(size int64) // the header came
	pace     *copypace.Pacer
	imp      *store.Import
	existing blockdev.Volume
}

func (s *pullSink) Start(size, alloc int64) (io.WriterAt, error) {
	p := s.p
	s.started(size)
	p.size.Store(size)
	p.alloc.Store(alloc)
	if r, err := blockdev.RoundSize(size); err != nil || r != size {
		return nil, status.Errorf(codes.DataLoss, "the source's size %d is not a volume size", size)
	}
	spec := p.spec
	if size > spec.SizeBytes && !p.explicit {
		// As sizeFromSource: at least the source, within the limit.
		if p.limit > 0 && size > p.limit {
			return nil, status.Errorf(codes.OutOfRange, "the source is %d bytes, above the limit %d", size, p.limit)
		}
		spec.SizeBytes = size
	}
	if spec.SizeBytes < size {
		return nil, status.Errorf(codes.OutOfRange, "the source is %d bytes, above the volume's size %d", size, spec.SizeBytes)
	}
	v, imp, err := s.d.store.BeginImport(s.ctx, spec)
	if err != nil {
		return nil, err
	}
	if imp == nil {
		s.existing = v
		return nil, errExists
	}
	s.imp = imp
	return pacedWriter{ctx: s.ctx, w: imp.File(), pace: s.pace}, nil
}

func (s *pullSink) Progress(n int64) { s.p.received.Store(n) }

// progress describes p for messages and events.
func (p *pull) progress() string {
	msg := fmt.Sprintf("copy of %s %s from %s", p.kind, p.source, tagNode(p.node))
	size, alloc := p.size.Load(), p.alloc.Load()
	if size == 0 {
		return msg + ": waiting for the source's node"
	}
	return fmt.Sprintf("%s: %d of at most %d bytes of data received (the source is %d bytes) in %v",
		msg, p.received.Load(), alloc, size, time.Since(p.started).Round(time.Second))
}

// cancelPull cancels the copy into the volume id, if any, and waits for
// it to end (and remove what it made).
func (d *Driver) cancelPull(ctx context.Context, id string) error {
	p := d.pulls.get(id)
	if p == nil {
		return nil
	}
	p.cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
		return toStatus(fmt.Errorf("cancel the copy into %s: %w", id, ctx.Err()))
	}
	d.pulls.remove(p)
	klog.InfoS("copy cancelled", "volumeID", id, "source", p.source)
	return nil
}

// PullStatus is a copy in flight, for /status and the metrics.
type PullStatus struct {
	VolumeID   string `json:"volumeID"`
	Name       string `json:"name"`
	Source     string `json:"source"`
	SourceNode string `json:"sourceNode"`
	SizeBytes  int64  `json:"sizeBytes"`
	// PVCNamespace and PVCName name the claim (--extra-create-metadata).
	PVCNamespace string `json:"pvcNamespace,omitempty"`
	PVCName      string `json:"pvcName,omitempty"`
	// ExpectedBytes is the most data to come (the source's allocated
	// bytes), ReceivedBytes what came so far.
	ExpectedBytes int64   `json:"expectedBytes"`
	ReceivedBytes int64   `json:"receivedBytes"`
	Seconds       float64 `json:"seconds"`
}

// pullStatus lists the copies in flight.
func (d *Driver) pullStatus() []PullStatus {
	var out []PullStatus
	for _, p := range d.pulls.list() {
		select {
		case <-p.done:
			continue // failed, its error kept for the next call
		default:
		}
		out = append(out, PullStatus{VolumeID: p.id, Name: p.spec.Name, Source: p.source, SourceNode: p.node,
			PVCNamespace: p.spec.Params[ParamPVCNamespace], PVCName: p.spec.Params[ParamPVCName],
			SizeBytes: p.size.Load(), ExpectedBytes: p.alloc.Load(), ReceivedBytes: p.received.Load(), Seconds: time.Since(p.started).Seconds()})
	}
	return out
}
