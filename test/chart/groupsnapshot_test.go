package chart

import (
	"strings"
	"testing"
)

// groupSnapshotAPI is the --api-versions entry of a cluster that serves
// group snapshots (the chart's CRDs on a fresh install).
const groupSnapshotAPI = "groupsnapshot.storage.k8s.io/v1"

// TestGroupSnapshots renders the chart for clusters without and with the
// group snapshot API: where it exists, the csi-snapshotter and the
// snapshot-controller the chart installs run with the group feature gate,
// the plugin labels the group objects for its node's csi-snapshotter, the
// node account may do what that takes and no more, the controller may make
// the groups' objects, and the VolumeGroupSnapshotClass exists as the
// VolumeSnapshotClass does. Without the API none of it is rendered: a
// csi-snapshotter with the gate and no CRDs would wait for ever and take
// no snapshot at all.
func TestGroupSnapshots(t *testing.T) {
	ctrl := "csi-fastblk-snapshot-controller"
	for _, tc := range []struct {
		name        string
		apis        []string
		set         []string
		gate, class bool
	}{
		{"no group API", []string{snapshotAPI}, []string{"snapshotController.install=true"}, false, false},
		{"group API, controller installed", []string{snapshotAPI, groupSnapshotAPI}, []string{"snapshotController.install=true"}, true, true},
		{"group API, cluster's controller", []string{snapshotAPI, groupSnapshotAPI}, []string{"snapshotController.distributedInCluster=true"}, true, true},
		{"group API, no distributed controller", []string{snapshotAPI, groupSnapshotAPI}, nil, true, false},
		{"group API, class off", []string{snapshotAPI, groupSnapshotAPI}, []string{"snapshotController.install=true", "groupSnapshotClass.create=false"}, true, false},
		{"group API, snapshotter off", []string{snapshotAPI, groupSnapshotAPI}, []string{"snapshotController.install=true", "snapshotter.enabled=false"}, false, false},
		// helm upgrade --reuse-values of a release made before groupSnapshotClass existed.
		{"group API, values without groupSnapshotClass", []string{snapshotAPI, groupSnapshotAPI}, []string{"snapshotController.install=true", "groupSnapshotClass=null"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			for _, a := range tc.apis {
				extra = append(extra, "--api-versions", a)
			}
			objs := renderArgs(t, extra, tc.set...)
			p := nodePod(t, objs)
			if got := hasArg(mustContainer(t, p, "csi-fastblk"), "label-group-snapshots"); got != tc.gate {
				t.Errorf("plugin --label-group-snapshots %v, want %v", got, tc.gate)
			}
			if c, ok := p.container("csi-snapshotter"); ok {
				if v, _ := c.arg("feature-gates"); (v == "CSIVolumeGroupSnapshot=true") != tc.gate {
					t.Errorf("csi-snapshotter --feature-gates=%q, want the group gate %v", v, tc.gate)
				}
			}
			for _, d := range find(objs, "Deployment") {
				var dep workload
				if err := d.decode(&dep); err != nil {
					t.Fatal(err)
				}
				if v, _ := dep.Spec.Template.Spec.Containers[0].arg("feature-gates"); (v == "CSIVolumeGroupSnapshot=true") != tc.gate {
					t.Errorf("snapshot-controller --feature-gates=%q, want the group gate %v", v, tc.gate)
				}
			}
			node := grants(t, objs, "csi-fastblk", "csi-fastblk-node")
			for _, g := range node {
				if strings.HasPrefix(g, "groupsnapshot.storage.k8s.io/") && !tc.gate {
					t.Errorf("node account may %s without group snapshots", g)
				}
			}
			if tc.gate {
				for _, want := range []string{"volumegroupsnapshotclasses:patch", "volumegroupsnapshotcontents:patch",
					"volumegroupsnapshotcontents/status:update", "volumegroupsnapshotcontents:watch"} {
					res, verb, _ := strings.Cut(want, ":")
					if !canI(node, "groupsnapshot.storage.k8s.io", verb, res, "") {
						t.Errorf("node account may not %s", want)
					}
				}
				for _, never := range []string{"volumegroupsnapshotcontents:update", "volumegroupsnapshotcontents:create",
					"volumegroupsnapshotcontents:delete", "volumegroupsnapshotclasses:update", "volumegroupsnapshots:get"} {
					res, verb, _ := strings.Cut(never, ":")
					if canI(node, "groupsnapshot.storage.k8s.io", verb, res, "") {
						t.Errorf("node account may %s: more than its csi-snapshotter and plugin need", never)
					}
				}
			}
			if len(find(objs, "Deployment")) == 1 && tc.gate {
				c := grants(t, objs, "csi-fastblk", ctrl)
				for _, want := range []string{"groupsnapshot.storage.k8s.io/volumegroupsnapshotcontents:create",
					"groupsnapshot.storage.k8s.io/volumegroupsnapshots/status:patch", "snapshot.storage.k8s.io/volumesnapshots:create"} {
					grp, rest, _ := strings.Cut(want, "/")
					res, verb, _ := strings.Cut(rest, ":")
					if !canI(c, grp, verb, res, "") {
						t.Errorf("snapshot-controller may not %s", want)
					}
				}
			}
			classes := find(objs, "VolumeGroupSnapshotClass")
			if (len(classes) == 1) != tc.class {
				t.Fatalf("%d VolumeGroupSnapshotClasses, want %v", len(classes), tc.class)
			}
			if tc.class {
				var cls struct {
					APIVersion     string `yaml:"apiVersion"`
					Driver         string `yaml:"driver"`
					DeletionPolicy string `yaml:"deletionPolicy"`
				}
				if err := classes[0].decode(&cls); err != nil {
					t.Fatal(err)
				}
				if cls.APIVersion != groupSnapshotAPI || cls.Driver != "fastblk.csi.io" || cls.DeletionPolicy != "Delete" || classes[0].Metadata.Name != "fastblk" {
					t.Errorf("class %s %+v", classes[0].Metadata.Name, cls)
				}
			}
		})
	}
	objs := renderArgs(t, []string{"--api-versions", snapshotAPI, "--api-versions", groupSnapshotAPI},
		"snapshotController.install=true", "groupSnapshotClass.isDefault=true", "groupSnapshotClass.name=db", "groupSnapshotClass.deletionPolicy=Retain")
	cls := named(t, objs, "VolumeGroupSnapshotClass", "db")
	if cls.Metadata.Annotations["groupsnapshot.storage.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("isDefault: annotations %v", cls.Metadata.Annotations)
	}
	if n := notes(t, []string{"--api-versions", snapshotAPI}, "snapshotController.install=true"); !strings.Contains(n, "groupsnapshot.storage.k8s.io/v1 API") {
		t.Errorf("NOTES without the group API do not say why there are no group snapshots:\n%s", n)
	}
}
