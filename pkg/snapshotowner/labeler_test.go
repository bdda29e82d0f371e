package snapshotowner

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

func vsc(name, driver, snapshotHandle, volumeHandle string, lbls map[string]string) *unstructured.Unstructured {
	src := map[string]any{}
	if snapshotHandle != "" {
		src["snapshotHandle"] = snapshotHandle
	}
	if volumeHandle != "" {
		src["volumeHandle"] = volumeHandle
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"driver": driver, "source": src, "deletionPolicy": "Retain"}}}
	u.SetLabels(lbls)
	return u
}

func fakeAPI(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{kubeapi.VolumeSnapshotContents: "VolumeSnapshotContentList"}, objs...)
}

func label(t *testing.T, api *dynamicfake.FakeDynamicClient, name string) (string, bool) {
	t.Helper()
	c, err := api.Resource(kubeapi.VolumeSnapshotContents).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := c.GetLabels()[ManagedBy]
	return v, ok
}

// member is the content the snapshot-controller makes for a member of
// the group snapshot group.
func member(name, volumeHandle, group string) *unstructured.Unstructured {
	u := vsc(name, "fastblk.csi.io", "", volumeHandle, nil)
	u.SetAnnotations(map[string]string{GroupMember: group})
	return u
}

// TestOnceLabelsThisNodesHandMadeContents: of the contents without the
// label, only the hand-made ones (snapshotHandle) of this driver whose
// handle this node holds, and the members of this node's group snapshots,
// get managed-by: <node>; another node's, another driver's, a dynamic
// one, another node's group's member and an already labelled one are
// left alone; a content deleted before its patch is skipped; a second
// pass labels nothing. Before, nothing labelled them: the suite's
// pre-provisioned snapshot specs never became ready, and a deleted
// group's members kept their finalizer.
func TestOnceLabelsThisNodesHandMadeContents(t *testing.T) {
	api := fakeAPI(
		vsc("mine", "fastblk.csi.io", "s1-n1", "", nil),
		member("my-member", "v1-n1", "g1-n1"),
		member("their-member", "v2-n2", "g2-n2"),
		vsc("other-node", "fastblk.csi.io", "s2-n2", "", nil),
		vsc("other-driver", "other.csi.io", "s1-n1", "", nil),
		vsc("dynamic", "fastblk.csi.io", "", "v1-n1", nil),
		vsc("labelled", "fastblk.csi.io", "s3-n1", "", map[string]string{ManagedBy: "n9"}),
		vsc("gone", "fastblk.csi.io", "s9-n1", "", nil),
	)
	holds := func(h string) bool {
		if h == "s9-n1" { // deleted between the watch and the patch
			if err := api.Tracker().Delete(kubeapi.VolumeSnapshotContents, "", "gone"); err != nil {
				t.Error(err)
			}
		}
		return strings.HasSuffix(h, "-n1")
	}
	l := &Labeler{API: api, Driver: "fastblk.csi.io", Node: "n1", Holds: holds, HoldsGroup: holds}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	contents, err := watchAll(ctx, api, kubeapi.VolumeSnapshotContents, unlabelled, make(chan struct{}, 1))
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.once(ctx, contents)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(got); !slices.Equal(got, []string{"mine", "my-member"}) {
		t.Errorf("labelled %q, want [mine my-member]", got)
	}
	for _, n := range []string{"mine", "my-member"} {
		if v, _ := label(t, api, n); v != "n1" {
			t.Errorf("%s's %s = %v, want n1", n, ManagedBy, v)
		}
	}
	if v, _ := label(t, api, "labelled"); v != "n9" {
		t.Errorf("an already labelled content was relabelled %v", v)
	}
	for _, n := range []string{"other-node", "other-driver", "dynamic", "their-member"} {
		if _, has := label(t, api, n); has {
			t.Errorf("%s was labelled", n)
		}
	}
	waitFor(t, "the watch to see mine's label", func() bool {
		obj, err := contents.Get("mine")
		return err == nil && obj.(*unstructured.Unstructured).GetLabels()[ManagedBy] == "n1"
	})
	again, err := l.once(ctx, contents)
	if err != nil || len(again) != 0 {
		t.Errorf("second pass labelled %q (%v), want nothing", again, err)
	}
}

// TestRunLabelsFromTheWatch: Run labels a content made after it started
// as the watch brings it, well before its periodic pass, and lists the
// contents no more after its start.
func TestRunLabelsFromTheWatch(t *testing.T) {
	api := fakeAPI()
	l := &Labeler{API: api, Driver: "fastblk.csi.io", Node: "n1", Holds: func(h string) bool { return strings.HasSuffix(h, "-n1") }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.Run(ctx, time.Hour)
	waitFor(t, "the labeler's watch", func() bool { return countActions(api, "watch") > 0 })
	lists := countActions(api, "list")
	if _, err := api.Resource(kubeapi.VolumeSnapshotContents).Create(ctx, vsc("late", "fastblk.csi.io", "s5-n1", "", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the late content labelled", func() bool { v, _ := label(t, api, "late"); return v == "n1" })
	if got := countActions(api, "list"); got != lists {
		t.Errorf("%d lists after the watch started, want none", got-lists)
	}
}

func countActions(api *dynamicfake.FakeDynamicClient, verb string) int {
	n := 0
	for _, a := range api.Actions() {
		if a.GetVerb() == verb && a.GetResource() == kubeapi.VolumeSnapshotContents {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
