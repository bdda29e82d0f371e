package snapshotowner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// ManagedBy is the label by which a node's csi-snapshotter picks its
// VolumeSnapshotContents.
const ManagedBy = "snapshot.storage.kubernetes.io/managed-by"

const contentsPath = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents"

// Labeler labels this node's unlabelled pre-provisioned contents.
type Labeler struct {
	API    *kubeapi.Client
	Driver string // the CSI driver name, spec.driver of our contents
	Node   string // this node's name, the label's value
	// Holds reports whether a snapshot handle is one of this node's.
	Holds func(handle string) bool
}

// content is what the labeler reads of a VolumeSnapshotContent.
type content struct {
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Driver string `json:"driver"`
		Source struct {
			SnapshotHandle string `json:"snapshotHandle"`
		} `json:"source"`
	} `json:"spec"`
}

// Once labels every content the API server lists without the label whose
// driver is ours and whose snapshot handle this node holds, and returns
// their names. A content deleted meanwhile is skipped.
func (l *Labeler) Once(ctx context.Context) ([]string, error) {
	var mine []string
	q := url.Values{"labelSelector": {"!" + ManagedBy}}
	err := l.API.List(ctx, contentsPath, q, func(items json.RawMessage) error {
		var cs []content
		if err := json.Unmarshal(items, &cs); err != nil {
			return err
		}
		for _, c := range cs {
			h := c.Spec.Source.SnapshotHandle
			if c.Spec.Driver == l.Driver && h != "" && c.Metadata.Labels[ManagedBy] == "" && l.Holds(h) {
				mine = append(mine, c.Metadata.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var labelled []string
	for _, name := range mine {
		patch := map[string]any{"metadata": map[string]any{"labels": map[string]string{ManagedBy: l.Node}}}
		err := l.API.MergePatch(ctx, contentsPath+"/"+url.PathEscape(name), patch)
		if errors.Is(err, kubeapi.ErrNotFound) {
			continue
		}
		if err != nil {
			return labelled, fmt.Errorf("label VolumeSnapshotContent %s: %w", name, err)
		}
		labelled = append(labelled, name)
	}
	return labelled, nil
}

// Run calls Once every period until ctx ends. It logs what it labels, and
// an error when it first appears (RBAC without the right to patch, an API
// server away), then tries again; a cluster without the snapshot CRDs is
// not an error.
func (l *Labeler) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		labelled, err := l.Once(ctx)
		for _, name := range labelled {
			klog.InfoS("labelled a pre-provisioned snapshot content for this node's csi-snapshotter", "content", name, "label", ManagedBy, "node", l.Node)
		}
		switch {
		case err == nil || errors.Is(err, kubeapi.ErrNotFound) || ctx.Err() != nil:
			last = ""
		case err.Error() != last:
			last = err.Error()
			klog.ErrorS(err, "labelling pre-provisioned snapshot contents; retrying", "every", every)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
