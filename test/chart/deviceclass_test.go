package chart

import (
	"slices"
	"strings"
	"testing"
)

// deviceClassSets are a node's two device classes, as the chart README's
// example gives them.
var deviceClassSets = []string{
	"deviceClasses[0].name=nvme", "deviceClasses[0].path=/mnt/fastblk/nvme", "deviceClasses[0].reserve=5%",
	"deviceClasses[1].name=hdd", "deviceClasses[1].path=/srv/hdd/fastblk", "deviceClasses[1].overProvisionRatio=2",
}

// TestDeviceClasses: each class reaches the plugin as a --device-class,
// the parent of its path is mounted (once, HostToContainer, created where
// missing) so that the path itself may be missing without stopping the
// pod, a node group has its own classes or the top-level ones, and a
// StorageClass picks one with deviceClass.
func TestDeviceClasses(t *testing.T) {
	objs := render(t, append(slices.Clone(deviceClassSets), "deviceClasses[2].name=ssd", "deviceClasses[2].path=/mnt/fastblk/ssd",
		"storageClass.deviceClass=nvme")...)
	p := nodePod(t, objs)
	c := mustContainer(t, p, "csi-fastblk")
	var args []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--device-class="); ok {
			args = append(args, v)
		}
	}
	want := []string{"name=nvme,path=/mnt/fastblk/nvme,reserve=5%", "name=hdd,path=/srv/hdd/fastblk,over-provision-ratio=2",
		"name=ssd,path=/mnt/fastblk/ssd"}
	if !slices.Equal(args, want) {
		t.Errorf("--device-class flags %q, want %q", args, want)
	}
	for _, path := range []string{"/mnt/fastblk/nvme", "/mnt/fastblk/ssd", "/srv/hdd/fastblk"} {
		if h := hostPathOf(t, p, c, path); h != path {
			t.Errorf("%s comes from host %s", path, h)
		}
	}
	var parents []string
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(m.Name, "device-classes-") {
			parents = append(parents, m.MountPath)
			if m.MountPropagation != "HostToContainer" {
				t.Errorf("%s is mounted with propagation %q, want HostToContainer (a disk mounted later shows)", m.MountPath, m.MountPropagation)
			}
			if v, _ := p.volume(m.Name); v.HostPath == nil || v.HostPath.Path != m.MountPath || v.HostPath.Type != "DirectoryOrCreate" {
				t.Errorf("volume %s: %+v, want the host's %s, created if missing", m.Name, v.HostPath, m.MountPath)
			}
		}
	}
	if !slices.Equal(parents, []string{"/mnt/fastblk", "/srv/hdd"}) {
		t.Errorf("class parents mounted %v, want /mnt/fastblk and /srv/hdd once each", parents)
	}
	var sc struct {
		Parameters map[string]string `yaml:"parameters"`
	}
	if err := named(t, objs, "StorageClass", "fastblk").decode(&sc); err != nil {
		t.Fatal(err)
	}
	if sc.Parameters["deviceClass"] != "nvme" {
		t.Errorf("StorageClass parameters %v, want deviceClass nvme", sc.Parameters)
	}
	var plain struct {
		Parameters map[string]string `yaml:"parameters"`
	}
	if err := named(t, render(t), "StorageClass", "fastblk").decode(&plain); err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.Parameters["deviceClass"]; ok {
		t.Errorf("default StorageClass has deviceClass %q, want none (the default class)", plain.Parameters["deviceClass"])
	}

	out, stderr, err := helm(t, append(templateArgs(append(slices.Clone(deviceClassSets),
		"nodeGroups[0].name=big", "nodeGroups[0].nodeSelector.disk=big", "nodeGroups[0].dataDir=/mnt/big",
		"nodeGroups[0].deviceClasses[0].name=bulk", "nodeGroups[0].deviceClasses[0].path=/mnt/big2/bulk",
		"nodeGroups[1].name=rest", "nodeGroups[1].nodeSelector.disk=rest", "nodeGroups[1].dataDir=/var/lib/csi-fastblk",
		"nodeGroups[2].name=none", "nodeGroups[2].nodeSelector.disk=none", "nodeGroups[2].dataDir=/var/lib/csi-fastblk")...),
		"--set-json", "nodeGroups[2].deviceClasses=[]")...)
	if err != nil {
		t.Fatalf("helm template with node groups' classes: %v\n%s", err, stderr)
	}
	if objs, err = decodeObjects([]byte(out)); err != nil {
		t.Fatal(err)
	}
	wantGroup := map[string][]string{
		"csi-fastblk-node-big":  {"name=bulk,path=/mnt/big2/bulk"},
		"csi-fastblk-node-rest": want[:2],
		"csi-fastblk-node-none": nil,
	}
	for _, o := range find(objs, "DaemonSet") {
		var w workload
		if err := o.decode(&w); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range mustContainer(t, w.Spec.Template.Spec, "csi-fastblk").Args {
			if v, ok := strings.CutPrefix(a, "--device-class="); ok {
				got = append(got, v)
			}
		}
		if !slices.Equal(got, wantGroup[o.Metadata.Name]) {
			t.Errorf("%s: --device-class %q, want %q", o.Metadata.Name, got, wantGroup[o.Metadata.Name])
		}
	}
}

// TestBadDeviceClassesFail: class values that could not work stop the
// render, naming the value and why.
func TestBadDeviceClassesFail(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want []string
	}{
		{"the default's name", []string{"deviceClasses[0].name=default", "deviceClasses[0].path=/mnt/a/b"}, []string{"/deviceClasses/0/name"}},
		{"a bad name", []string{"deviceClasses[0].name=Fast_SSD", "deviceClasses[0].path=/mnt/a/b"}, []string{"/deviceClasses/0/name"}},
		{"no path", []string{"deviceClasses[0].name=a"}, []string{"/deviceClasses/0", "path"}},
		{"a path one level deep", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/data"}, []string{"/deviceClasses/0/path"}},
		{"a ratio below one", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/mnt/a/b", "deviceClasses[0].overProvisionRatio=0.5"},
			[]string{"deviceClasses[0] (a): overProvisionRatio 0.5 must be from 1 to 100"}},
		{"a name twice", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/mnt/x/a", "deviceClasses[1].name=a", "deviceClasses[1].path=/mnt/x/b"},
			[]string{"deviceClasses[1] (a): the device class name a is used twice"}},
		{"inside the data directory", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/var/lib/csi-fastblk/a"},
			[]string{"overlaps dataDir /var/lib/csi-fastblk"}},
		{"inside another class", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/mnt/x", "deviceClasses[1].name=b", "deviceClasses[1].path=/mnt/x/b"},
			[]string{"deviceClasses[1] (b): path /mnt/x/b overlaps device class a's path /mnt/x"}},
		{"beside the kubelet's directory", []string{"deviceClasses[0].name=a", "deviceClasses[0].path=/var/lib/a"},
			[]string{"its parent directory /var/lib, which the chart mounts into the plugin pod, overlaps kubeletDir"}},
		{"a node group's inside its data directory", []string{"nodeGroups[0].name=g", "nodeGroups[0].nodeSelector.a=b", "nodeGroups[0].dataDir=/mnt/g",
			"nodeGroups[0].deviceClasses[0].name=a", "nodeGroups[0].deviceClasses[0].path=/mnt/g/a"},
			[]string{"nodeGroups[0].deviceClasses[0] (a): path /mnt/g/a overlaps nodeGroups[0].dataDir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helm(t, templateArgs(tc.set...)...)
			if err == nil {
				t.Fatalf("render with %v succeeded", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("error %q does not say %q", stderr, w)
				}
			}
		})
	}
}

// TestNodeReport: the plugin reports its node's backend (--kube-report)
// with the rights that needs (its Node's patch, events, the StorageClasses
// and claims it reports on), and the admission policy keeps the node
// account, whose token every node holds, to its own Node's backend label
// and annotation.
func TestNodeReport(t *testing.T) {
	objs := render(t)
	if _, ok := mustContainer(t, nodePod(t, objs), "csi-fastblk").arg("kube-report"); !ok {
		t.Error("the plugin runs without --kube-report")
	}
	g := grants(t, objs, "csi-fastblk", "csi-fastblk-node")
	for _, w := range [][3]string{{"", "patch", "nodes"}, {"", "create", "events"}, {"storage.k8s.io", "list", "storageclasses"},
		{"", "list", "persistentvolumeclaims"}} {
		if !canI(g, w[0], w[1], w[2], "") {
			t.Errorf("the node account may not %s %s", w[1], w[2])
		}
	}
	var p admissionPolicy
	if err := named(t, objs, "ValidatingAdmissionPolicy", "csi-fastblk-node-report").decode(&p); err != nil {
		t.Fatal(err)
	}
	s := p.Spec
	if r := s.MatchConstraints.ResourceRules; s.FailurePolicy != "Fail" || len(r) != 1 || !slices.Equal(r[0].Operations, []string{"UPDATE"}) ||
		!slices.Equal(r[0].Resources, []string{"nodes"}) {
		t.Errorf("policy %q on %+v, want Fail on UPDATE of nodes", s.FailurePolicy, r)
	}
	if len(s.MatchConditions) != 1 || !strings.Contains(s.MatchConditions[0].Expression, "system:serviceaccount:csi-fastblk:csi-fastblk-node'") {
		t.Errorf("policy matches %+v, want the node account alone", s.MatchConditions)
	}
	var all []string
	for _, v := range s.Variables {
		all = append(all, v.Name+"="+v.Expression)
	}
	for _, v := range s.Validations {
		all = append(all, v.Expression)
	}
	joined := strings.Join(all, "\n")
	for _, w := range []string{"prefix='fastblk.csi.io/backend'", "object.metadata.name == variables.node", "object.spec == oldObject.spec",
		"object.metadata.labels.all(k, k.startsWith(variables.prefix)", "object.metadata.annotations.all(k, k.startsWith(variables.prefix)"} {
		if !strings.Contains(joined, w) {
			t.Errorf("policy lacks %q:\n%s", w, joined)
		}
	}
	named(t, objs, "ValidatingAdmissionPolicyBinding", "csi-fastblk-node-report")
}

// TestNotesShowEachNodesBackend: NOTES.txt gives the one command that
// lists each node's backend and why, for the release's driver name, and
// the device classes.
func TestNotesShowEachNodesBackend(t *testing.T) {
	n := notes(t, nil, append(slices.Clone(deviceClassSets), "driverName=blk.example.com")...)
	for _, w := range []string{
		`kubectl get nodes -o custom-columns='NODE:.metadata.name,BACKEND:.metadata.labels.blk\.example\.com/backend,WHY:.metadata.annotations.blk\.example\.com/backend-reason'`,
		"Device classes (StorageClass parameter deviceClass): default (/var/lib/csi-fastblk), nvme (/mnt/fastblk/nvme), hdd (/srv/hdd/fastblk).",
		"kubectl get csistoragecapacities -n csi-fastblk",
	} {
		if !strings.Contains(n, w) {
			t.Errorf("NOTES.txt lacks %q:\n%s", w, n)
		}
	}
}
