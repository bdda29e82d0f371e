package snapshotowner

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

const drv = "fastblk.csi.io"

func groupClass(name, driver, holder string, since time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": name}, "driver": driver, "deletionPolicy": "Delete"}}
	if holder != "" {
		u.SetLabels(map[string]string{ManagedBy: holder})
		u.SetAnnotations(map[string]string{ClassSince: since.UTC().Format(time.RFC3339Nano)})
	}
	return u
}

// groupContent is a VolumeGroupSnapshotContent of class (none: "") of the
// volumes (dynamic) or, with handle set, made by hand for that group;
// made says its group has been made.
func groupContent(name, class, holder string, made bool, handle string, volumes ...string) *unstructured.Unstructured {
	src := map[string]any{"volumeHandles": toAny(volumes)}
	if handle != "" {
		src = map[string]any{"groupSnapshotHandles": map[string]any{"volumeGroupSnapshotHandle": handle, "volumeSnapshotHandles": []any{"s1-n1"}}}
	}
	spec := map[string]any{"driver": drv, "deletionPolicy": "Delete", "source": src,
		"volumeGroupSnapshotRef": map[string]any{"name": name, "namespace": "ns"}}
	if class != "" {
		spec["volumeGroupSnapshotClassName"] = class
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent",
		"metadata": map[string]any{"name": name}, "spec": spec}}
	if made {
		u.Object["status"] = map[string]any{"volumeGroupSnapshotHandle": "g-" + name}
	}
	if holder != "" {
		u.SetLabels(map[string]string{ManagedBy: holder})
	}
	return u
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func groupAPI(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kubeapi.VolumeGroupSnapshotContents: "VolumeGroupSnapshotContentList",
		kubeapi.VolumeGroupSnapshotClasses:  "VolumeGroupSnapshotClassList",
	}, objs...)
}

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// nodeGroups is the Groups of node on api, holding the handles tagged
// with it, on the clock c.
func nodeGroups(api *dynamicfake.FakeDynamicClient, node string, c *clock) *Groups {
	holds := func(h string) bool { return strings.HasSuffix(h, "-"+node) }
	return &Groups{API: api, Driver: drv, Node: node, HoldsVolume: holds, HoldsGroup: holds, now: c.now}
}

// snapshotListers is a lister of what the API holds of r now.
func snapshotListers(t *testing.T, api *dynamicfake.FakeDynamicClient, r schema.GroupVersionResource) cache.GenericLister {
	t.Helper()
	list, err := api.Resource(r).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range list.Items {
		idx.Add(&list.Items[i])
	}
	return cache.NewGenericLister(idx, r.GroupResource())
}

// pass runs one pass of g over what the API holds now.
func pass(t *testing.T, g *Groups) (took, labelled []string) {
	t.Helper()
	api := g.API.(*dynamicfake.FakeDynamicClient)
	took, labelled, err := g.once(context.Background(), snapshotListers(t, api, kubeapi.VolumeGroupSnapshotContents),
		snapshotListers(t, api, kubeapi.VolumeGroupSnapshotClasses))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(labelled)
	return took, labelled
}

func holderOf(t *testing.T, api *dynamicfake.FakeDynamicClient, r schema.GroupVersionResource, name string) string {
	t.Helper()
	u, err := api.Resource(r).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u.GetLabels()[ManagedBy]
}

// TestGroupsLabelThisNodesContents: a node takes the free class its new
// group needs, then labels that group's content, and at once the group
// contents that need no class (made already, or made by hand without
// one); another node's, another driver's and a group whose first volume
// is another node's are left alone. A group of volumes of two nodes goes
// to its first volume's node, whose plugin refuses it with a message
// naming both. A second pass does nothing.
func TestGroupsLabelThisNodesContents(t *testing.T) {
	api := groupAPI(
		groupClass("fastblk", drv, "", time.Time{}),
		groupContent("new", "fastblk", "", false, "", "v1-n1", "v2-n1"),
		groupContent("made", "fastblk", "", true, "", "v3-n1"),
		groupContent("by-hand", "", "", false, "g1-n1"),
		groupContent("mixed", "fastblk", "", false, "", "v4-n1", "v5-n2"),
		groupContent("theirs", "fastblk", "", false, "", "v6-n2"),
		groupContent("their-mixed", "fastblk", "", false, "", "v7-n2", "v8-n1"),
	)
	c := &clock{t: time.Unix(1000, 0)}
	g := nodeGroups(api, "n1", c)
	took, labelled := pass(t, g)
	if !slices.Equal(took, []string{"fastblk"}) || !slices.Equal(labelled, []string{"by-hand", "made", "mixed", "new"}) {
		t.Fatalf("took %q, labelled %q; want the class, then by-hand, made, mixed and new", took, labelled)
	}
	cls, _ := api.Resource(kubeapi.VolumeGroupSnapshotClasses).Get(context.Background(), "fastblk", metav1.GetOptions{})
	if cls.GetLabels()[ManagedBy] != "n1" || cls.GetAnnotations()[ClassSince] != c.t.UTC().Format(time.RFC3339Nano) {
		t.Errorf("class %v: want it labelled n1 since now", cls.Object["metadata"])
	}
	for _, name := range []string{"theirs", "their-mixed"} {
		if h := holderOf(t, api, kubeapi.VolumeGroupSnapshotContents, name); h != "" {
			t.Errorf("%s labelled %q", name, h)
		}
	}
	if took, labelled := pass(t, g); len(took)+len(labelled) != 0 {
		t.Errorf("second pass took %q and labelled %q, want nothing", took, labelled)
	}
}

// TestGroupsHandTheClassFromNodeToNode: a node whose group waits for a
// class another node holds takes it only once that node has made its
// groups and held it classMinHold, or after classMaxHold whatever that
// node still waits for; until then its content stays unlabelled, so that
// its csi-snapshotter never fails for want of the class. Two nodes
// waiting for a free class: the first to take it wins, the other waits.
func TestGroupsHandTheClassFromNodeToNode(t *testing.T) {
	start := time.Unix(1000, 0)
	c := &clock{t: start}
	api := groupAPI(
		groupClass("fastblk", drv, "n2", start),
		groupContent("theirs", "fastblk", "n2", false, "", "v1-n2"),
		groupContent("mine", "fastblk", "", false, "", "v2-n1"),
	)
	n1 := nodeGroups(api, "n1", c)
	step := func(at time.Duration, wantHolder string) {
		t.Helper()
		c.t = start.Add(at)
		pass(t, n1)
		if h := holderOf(t, api, kubeapi.VolumeGroupSnapshotClasses, "fastblk"); h != wantHolder {
			t.Fatalf("at %v the class is n%q's, want %q's", at, h, wantHolder)
		}
		mine := holderOf(t, api, kubeapi.VolumeGroupSnapshotContents, "mine")
		if (mine == "n1") != (wantHolder == "n1") {
			t.Fatalf("at %v mine is labelled %q while the class is %q's", at, mine, wantHolder)
		}
	}
	step(classMinHold*2, "n2") // n2 still makes its group
	made := groupContent("theirs", "fastblk", "n2", true, "", "v1-n2")
	if _, err := api.Resource(kubeapi.VolumeGroupSnapshotContents).Update(context.Background(), made, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step(classMinHold*2, "n1") // n2 is done, and has held it long enough

	// n1 now makes a group that never succeeds; n2 waits classMaxHold.
	c.t = start
	if _, err := api.Resource(kubeapi.VolumeGroupSnapshotClasses).Update(context.Background(), groupClass("fastblk", drv, "n1", start), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Resource(kubeapi.VolumeGroupSnapshotContents).Create(context.Background(), groupContent("theirs-2", "fastblk", "", false, "", "v3-n2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n2 := nodeGroups(api, "n2", c)
	for _, at := range []time.Duration{classMinHold, classMaxHold - time.Second, classMaxHold} {
		c.t = start.Add(at)
		pass(t, n2)
		want := "n1"
		if at >= classMaxHold {
			want = "n2"
		}
		if h := holderOf(t, api, kubeapi.VolumeGroupSnapshotClasses, "fastblk"); h != want {
			t.Fatalf("at %v the class is %q's, want %q's (n1's group never finishes)", at, h, want)
		}
	}
	if h := holderOf(t, api, kubeapi.VolumeGroupSnapshotContents, "theirs-2"); h != "n2" {
		t.Errorf("theirs-2 labelled %q once n2 took the class, want n2", h)
	}
}

// TestGroupsTakeAClassOnlyAsRead: a node takes a class only as it read
// it: its patch carries the resourceVersion it read, so that of two nodes
// that find the class free at once, the API server lets one take it and
// refuses the other (409 Conflict), which then labels nothing and reads
// again. (client-go's fake API does not check resource versions; the
// refusal is the API server's.)
func TestGroupsTakeAClassOnlyAsRead(t *testing.T) {
	cls := groupClass("fastblk", drv, "", time.Time{})
	cls.SetResourceVersion("7")
	api := groupAPI(cls, groupContent("mine", "fastblk", "", false, "", "v1-n1"))
	var conflicted bool
	api.PrependReactor("patch", "volumegroupsnapshotclasses", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &p); err != nil || p.Metadata.ResourceVersion != "7" {
			t.Errorf("class patch %s (%v): want the resourceVersion read, 7", a.(k8stesting.PatchAction).GetPatch(), err)
		}
		conflicted = true // as the API server answers when another node took it first
		return true, nil, apierrors.NewConflict(kubeapi.VolumeGroupSnapshotClasses.GroupResource(), "fastblk", errors.New("changed"))
	})
	took, labelled := pass(t, nodeGroups(api, "n1", &clock{t: time.Unix(1000, 0)}))
	if !conflicted || len(took)+len(labelled) != 0 {
		t.Fatalf("after a conflict n1 took %q and labelled %q, want nothing", took, labelled)
	}
}

// TestGroupsRunsFromTheWatch: Run labels a group made after it started as
// the watches bring it, well before its periodic pass.
func TestGroupsRunsFromTheWatch(t *testing.T) {
	api := groupAPI(groupClass("fastblk", drv, "", time.Time{}))
	g := nodeGroups(api, "n1", &clock{t: time.Now()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.Run(ctx, time.Hour)
	waitFor(t, "the watches", func() bool { return len(api.Actions()) >= 3 })
	if _, err := api.Resource(kubeapi.VolumeGroupSnapshotContents).Create(ctx, groupContent("late", "fastblk", "", false, "", "v1-n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the late group labelled", func() bool {
		u, err := api.Resource(kubeapi.VolumeGroupSnapshotContents).Get(ctx, "late", metav1.GetOptions{})
		return err == nil && u.GetLabels()[ManagedBy] == "n1"
	})
}
