package chart

import (
	"reflect"
	"testing"
)

// TestCSIDriver pins the CSIDriver fields a node-local block driver needs.
func TestCSIDriver(t *testing.T) {
	var d struct {
		Spec struct {
			AttachRequired       *bool    `yaml:"attachRequired"`
			PodInfoOnMount       *bool    `yaml:"podInfoOnMount"`
			StorageCapacity      *bool    `yaml:"storageCapacity"`
			SELinuxMount         *bool    `yaml:"seLinuxMount"`
			FSGroupPolicy        string   `yaml:"fsGroupPolicy"`
			VolumeLifecycleModes []string `yaml:"volumeLifecycleModes"`
		} `yaml:"spec"`
	}
	o := one(t, render(t, "driverName=x.example.com"), "CSIDriver")
	if err := o.decode(&d); err != nil {
		t.Fatal(err)
	}
	if o.Metadata.Name != "x.example.com" {
		t.Errorf("name %s, want the driverName value", o.Metadata.Name)
	}
	s := d.Spec
	for name, got := range map[string]*bool{"attachRequired": s.AttachRequired} {
		if got == nil || *got {
			t.Errorf("%s must be false", name)
		}
	}
	for name, got := range map[string]*bool{"podInfoOnMount": s.PodInfoOnMount,
		"storageCapacity": s.StorageCapacity, "seLinuxMount": s.SELinuxMount} {
		if got == nil || !*got {
			t.Errorf("%s must be true", name)
		}
	}
	if s.FSGroupPolicy != "File" {
		t.Errorf("fsGroupPolicy %q, want File", s.FSGroupPolicy)
	}
	if !reflect.DeepEqual(s.VolumeLifecycleModes, []string{"Persistent"}) {
		t.Errorf("volumeLifecycleModes %v, want [Persistent]", s.VolumeLifecycleModes)
	}
}

// TestStorageClass checks the class and its parameters, which the plugin
// validates (queues and queueDepth must be 1..4096, maxIOSize 4Ki..1Mi, when present).
func TestStorageClass(t *testing.T) {
	type class struct {
		Provisioner          string            `yaml:"provisioner"`
		VolumeBindingMode    string            `yaml:"volumeBindingMode"`
		AllowVolumeExpansion bool              `yaml:"allowVolumeExpansion"`
		Parameters           map[string]string `yaml:"parameters"`
	}
	cases := []struct {
		name    string
		set     []string
		params  map[string]string
		isDefal bool
	}{
		{"default", nil, map[string]string{"csi.storage.k8s.io/fstype": "ext4"}, false},
		{"tuned xfs default class", []string{"storageClass.fsType=xfs", "storageClass.queues=2",
			"storageClass.queueDepth=128", "storageClass.maxIOSize=512Ki", "storageClass.isDefault=true"},
			map[string]string{"csi.storage.k8s.io/fstype": "xfs", "queues": "2", "queueDepth": "128", "maxIOSize": "512Ki"}, true},
		{"rate limited", []string{"storageClass.maxIOPS=5000", "storageClass.maxBandwidth=1G"},
			map[string]string{"csi.storage.k8s.io/fstype": "ext4", "maxIOPS": "5000", "maxBandwidth": "1G"}, false},
		{"preallocated", []string{"storageClass.preallocation=full"},
			map[string]string{"csi.storage.k8s.io/fstype": "ext4", "preallocation": "full"}, false},
		{"sparse", []string{"storageClass.preallocation=off"}, map[string]string{"csi.storage.k8s.io/fstype": "ext4"}, false},
		{"cross-node handoff, slow pulls", []string{"storageClass.crossNodeSource=handoff", "storageClass.transferRate=50Mi"},
			map[string]string{"csi.storage.k8s.io/fstype": "ext4", "crossNodeSource": "handoff", "transferRate": "50Mi"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := one(t, render(t, tc.set...), "StorageClass")
			var c class
			if err := o.decode(&c); err != nil {
				t.Fatal(err)
			}
			if c.Provisioner != "fastblk.csi.io" || c.VolumeBindingMode != "WaitForFirstConsumer" || !c.AllowVolumeExpansion {
				t.Errorf("class %+v: want provisioner fastblk.csi.io, WaitForFirstConsumer, expansion", c)
			}
			if !reflect.DeepEqual(c.Parameters, tc.params) {
				t.Errorf("parameters %v, want %v", c.Parameters, tc.params)
			}
			_, isDefault := o.Metadata.Annotations["storageclass.kubernetes.io/is-default-class"]
			if isDefault != tc.isDefal {
				t.Errorf("default-class annotation present=%v, want %v", isDefault, tc.isDefal)
			}
		})
	}
}

// TestNodePod checks privileges, host mounts, provisioner flags and the
// environment the sidecars require.
func TestNodePod(t *testing.T) {
	p := nodePod(t, render(t))
	if p.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", p.PriorityClassName)
	}
	plugin, _ := p.container("csi-fastblk")
	sc := plugin.SecurityContext
	if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.SeccompProfile == nil || sc.SeccompProfile.Type != "Unconfined" {
		t.Errorf("plugin securityContext %+v: want privileged and seccomp Unconfined", sc)
	}
	if len(plugin.Args) == 0 || plugin.Args[0] != "serve" {
		t.Errorf("plugin args %v: want serve first", plugin.Args)
	}
	for _, m := range []struct {
		path, host string
		ro         bool
	}{{"/dev", "/dev", false}, {"/sys", "/sys", false}, {"/lib/modules", "/lib/modules", true},
		{"/var/lib/csi-fastblk", "/var/lib/csi-fastblk", false}} {
		got, ok := plugin.mountAt(m.path)
		if !ok {
			t.Errorf("plugin does not mount %s", m.path)
			continue
		}
		if h := hostPathOf(t, p, plugin, m.path); h != m.host || got.ReadOnly != m.ro {
			t.Errorf("mount %s: host %s readOnly %v, want %s readOnly %v", m.path, h, got.ReadOnly, m.host, m.ro)
		}
	}
	prov, _ := p.container("csi-provisioner")
	for _, f := range []string{"node-deployment=true", "enable-capacity", "capacity-ownerref-level=1",
		"strict-topology=true", "immediate-topology=false"} {
		if !hasArg(prov, f) {
			t.Errorf("provisioner lacks --%s", f)
		}
	}
	wantEnv := map[string][]string{
		"csi-provisioner": {"NODE_NAME", "NAMESPACE", "POD_NAME"},
		"csi-snapshotter": {"NODE_NAME"}, "csi-fastblk": {"NODE_NAME"}, "csi-resizer": {"NAMESPACE"},
	}
	for name, envs := range wantEnv {
		c, ok := p.container(name)
		if !ok {
			t.Errorf("no %s container", name)
			continue
		}
		for _, e := range envs {
			if !hasFieldEnv(c, e) {
				t.Errorf("%s lacks env %s from the downward API", name, e)
			}
		}
	}
}

// TestSnapshotCRDs checks the CRDs of crds/ (which Helm installs where
// missing, before it renders the templates): the three of
// snapshot.storage.k8s.io, serving and storing v1, and the
// SnapshotMetadataService of cbt.storage.k8s.io, serving and storing
// v1beta1 (the version the csi-snapshot-metadata sidecar and its clients
// read), each approved for a k8s.io group; and that the VolumeSnapshotClass is an ordinary object: as a hook
// in the same release as its CRD a real API server refuses it.
func TestSnapshotCRDs(t *testing.T) {
	out, stderr, err := helm(t, "show", "crds", "charts/csi-fastblk")
	if err != nil {
		t.Fatalf("helm show crds: %v\n%s", err, stderr)
	}
	crds, err := decodeObjects([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"volumesnapshots.snapshot.storage.k8s.io": false,
		"volumesnapshotcontents.snapshot.storage.k8s.io": false, "volumesnapshotclasses.snapshot.storage.k8s.io": false,
		"snapshotmetadataservices.cbt.storage.k8s.io":       false,
		"volumegroupsnapshots.groupsnapshot.storage.k8s.io": false, "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io": false,
		"volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io": false}
	version := map[string]string{"snapshot.storage.k8s.io": "v1", "cbt.storage.k8s.io": "v1beta1", "groupsnapshot.storage.k8s.io": "v1"}
	// external-snapshotter v8.6.0 still stores group snapshots as v1beta2
	// and serves v1beta1 and v1beta2 beside v1: the chart uses v1.
	olderServed := map[string]bool{"groupsnapshot.storage.k8s.io": true}
	for _, o := range find(crds, "CustomResourceDefinition") {
		var crd struct {
			Spec struct {
				Group    string `yaml:"group"`
				Versions []struct {
					Name    string `yaml:"name"`
					Served  bool   `yaml:"served"`
					Storage bool   `yaml:"storage"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		if err := o.decode(&crd); err != nil {
			t.Fatal(err)
		}
		wantV, ok := version[crd.Spec.Group]
		if !ok {
			t.Errorf("CRD %s of group %s: the chart ships none of that group", o.Metadata.Name, crd.Spec.Group)
		}
		stored := false
		for _, v := range crd.Spec.Versions {
			if v.Name == wantV {
				stored = v.Served && (v.Storage || olderServed[crd.Spec.Group])
			} else if (v.Served || v.Storage) && !olderServed[crd.Spec.Group] {
				t.Errorf("CRD %s serves or stores %s besides %s", o.Metadata.Name, v.Name, wantV)
			}
		}
		if !stored {
			t.Errorf("CRD %s: %+v, want %s served and stored", o.Metadata.Name, crd.Spec, wantV)
		}
		if o.Metadata.Annotations["api-approved.kubernetes.io"] == "" {
			t.Errorf("CRD %s lacks api-approved.kubernetes.io (required for *.k8s.io groups)", o.Metadata.Name)
		}
		want[o.Metadata.Name] = true
	}
	for n, seen := range want {
		if !seen {
			t.Errorf("CRD %s not in crds/", n)
		}
	}
	objs := renderArgs(t, []string{"--api-versions", snapshotAPI}, "snapshotController.install=true")
	if a := one(t, objs, "VolumeSnapshotClass").Metadata.Annotations["helm.sh/hook"]; a != "" {
		t.Errorf("VolumeSnapshotClass is a hook (%s)", a)
	}
	if len(find(objs, "Deployment")) != 1 {
		t.Error("snapshotController.install=true renders no Deployment")
	}
}

func hasArg(c container, flag string) bool {
	for _, a := range c.Args {
		if a == "--"+flag {
			return true
		}
	}
	return false
}

func hasFieldEnv(c container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath != "" {
			return true
		}
	}
	return false
}

// TestVolumeAttributesClasses checks each listed tier becomes a
// VolumeAttributesClass for the driver with exactly the limits given, a
// "0" kept (it lifts a limit), and none by default.
func TestVolumeAttributesClasses(t *testing.T) {
	type vac struct {
		Metadata   struct{ Name string }
		DriverName string            `yaml:"driverName"`
		Parameters map[string]string `yaml:"parameters"`
	}
	if objs := find(render(t), "VolumeAttributesClass"); len(objs) != 0 {
		t.Fatalf("%d VolumeAttributesClasses by default, want none", len(objs))
	}
	objs := find(render(t, "volumeAttributesClasses[0].name=gold", "volumeAttributesClasses[0].maxIOPS=20000",
		"volumeAttributesClasses[0].maxBandwidth=1Gi", "volumeAttributesClasses[1].name=unpaced-iops",
		"volumeAttributesClasses[1].maxIOPS=0"), "VolumeAttributesClass")
	want := map[string]map[string]string{
		"gold":         {"maxIOPS": "20000", "maxBandwidth": "1Gi"},
		"unpaced-iops": {"maxIOPS": "0"},
	}
	if len(objs) != len(want) {
		t.Fatalf("%d VolumeAttributesClasses, want %d", len(objs), len(want))
	}
	for _, o := range objs {
		var c vac
		if err := o.decode(&c); err != nil {
			t.Fatal(err)
		}
		if c.DriverName != "fastblk.csi.io" || !reflect.DeepEqual(c.Parameters, want[c.Metadata.Name]) {
			t.Errorf("class %s: driver %q parameters %v, want fastblk.csi.io and %v",
				c.Metadata.Name, c.DriverName, c.Parameters, want[c.Metadata.Name])
		}
	}
}
