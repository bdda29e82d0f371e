package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// snapshotAPI is the --api-versions entry of a cluster that serves the
// snapshot.storage.k8s.io/v1 API (its own CRDs, or the chart's, which Helm
// installs before it reads the cluster's APIs).
const snapshotAPI = "snapshot.storage.k8s.io/v1"

// renderArgs renders the chart with extra helm arguments and --set pairs.
func renderArgs(t *testing.T, extra []string, set ...string) []object {
	t.Helper()
	out, stderr, err := helm(t, append(templateArgs(set...), extra...)...)
	if err != nil {
		t.Fatalf("helm template %v %v: %v\n%s", extra, set, err, stderr)
	}
	objs, err := decodeObjects([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestSnapshotClassOnlyWhereItWorks renders the chart for clusters without
// and with the snapshot API and with each snapshot-controller setting: the
// VolumeSnapshotClass exists only where the API does (a class of an unknown
// kind fails the whole install) and a distributed snapshot-controller is
// installed or declared (elsewhere its snapshots would hang).
func TestSnapshotClassOnlyWhereItWorks(t *testing.T) {
	cases := []struct {
		name string
		api  bool
		set  []string
		want bool
	}{
		{"no API, defaults", false, nil, false},
		{"no API, controller installed", false, []string{"snapshotController.install=true"}, false},
		{"API, no distributed controller", true, nil, false},
		{"API, controller installed", true, []string{"snapshotController.install=true"}, true},
		{"API, cluster's controller distributed", true, []string{"snapshotController.distributedInCluster=true"}, true},
		{"API, snapshotter off", true, []string{"snapshotController.install=true", "snapshotter.enabled=false"}, false},
		{"API, class off", true, []string{"snapshotController.install=true", "snapshotClass.create=false"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.api {
				extra = []string{"--api-versions", snapshotAPI}
			}
			objs := renderArgs(t, extra, tc.set...)
			if got := len(find(objs, "VolumeSnapshotClass")) == 1; got != tc.want {
				t.Errorf("VolumeSnapshotClass rendered=%v, want %v", got, tc.want)
			}
			if n := len(find(objs, "CustomResourceDefinition")); n != 0 {
				t.Errorf("templates render %d CRDs; they belong in crds/", n)
			}
		})
	}
}

// TestSnapshotCRDsAreUpstream checks crds/ holds exactly the upstream CRDs,
// byte for byte, with their licence: the snapshot.storage.k8s.io and
// groupsnapshot.storage.k8s.io ones of the external-snapshotter release the
// chart's csi-snapshotter image names, and
// the cbt.storage.k8s.io one of the external-snapshot-metadata release its
// csi-snapshot-metadata image names (hack/chart/snapshot-crds.sh fetches
// both as Go modules).
func TestSnapshotCRDsAreUpstream(t *testing.T) {
	root := repoRoot(t)
	crdDir := func(flag string) string {
		out, err := exec.Command(filepath.Join(root, "hack/chart/snapshot-crds.sh"), flag).Output()
		if err != nil {
			testgate.Skip(t, testgate.Chart, "upstream CRDs not reachable (no module cache and no module proxy?): %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	upstream, cbt := crdDir("--dir"), crdDir("--cbt-dir")
	want, err := filepath.Glob(filepath.Join(upstream, "snapshot.storage.k8s.io_*.yaml"))
	if err != nil || len(want) != 3 {
		t.Fatalf("upstream %s: %d snapshot CRDs (%v), want 3", upstream, len(want), err)
	}
	groups, err := filepath.Glob(filepath.Join(upstream, "groupsnapshot.storage.k8s.io_*.yaml"))
	if err != nil || len(groups) != 3 {
		t.Fatalf("upstream %s: %d group snapshot CRDs (%v), want 3", upstream, len(groups), err)
	}
	want = append(want, groups...)
	cbtCRDs, err := filepath.Glob(filepath.Join(cbt, "cbt.storage.k8s.io_*.yaml"))
	if err != nil || len(cbtCRDs) != 1 {
		t.Fatalf("upstream %s: %d cbt CRDs (%v), want 1", cbt, len(cbtCRDs), err)
	}
	want = append(want, cbtCRDs...)
	want = append(want, filepath.Join(upstream, "..", "..", "LICENSE"))
	got, _ := filepath.Glob(filepath.Join(root, "charts/csi-fastblk/crds/*"))
	if a, err := os.ReadFile(filepath.Join(cbt, "..", "..", "LICENSE")); err != nil {
		t.Fatal(err)
	} else if b, err := os.ReadFile(filepath.Join(root, "charts/csi-fastblk/crds/LICENSE.cbt")); err != nil || !bytes.Equal(a, b) {
		t.Errorf("crds/LICENSE.cbt differs from the licence of %s (%v): run make chart-crds", cbt, err)
	}
	want = append(want, "LICENSE.cbt") // checked above
	if len(got) != len(want) {
		t.Errorf("crds/ holds %d files, want the %d upstream ones: run make chart-crds", len(got), len(want))
	}
	for _, w := range want[:len(want)-1] {
		a, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, "charts/csi-fastblk/crds", filepath.Base(w)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("crds/%s differs from upstream %s (%v): run make chart-crds", filepath.Base(w), w, err)
		}
	}
}

// notes renders NOTES.txt with --set pairs and extra helm arguments. helm
// template leaves NOTES.txt out, so the test renders a copy of the chart in
// which a ConfigMap carries NOTES.txt through tpl, with the same helpers,
// values and capabilities.
func notes(t *testing.T, extra []string, set ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "csi-fastblk")
	if out, err := exec.Command("cp", "-a", filepath.Join(repoRoot(t), "charts/csi-fastblk"), dir).CombinedOutput(); err != nil {
		t.Fatalf("copy chart: %v\n%s", err, out)
	}
	if err := os.Rename(filepath.Join(dir, "templates/NOTES.txt"), filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n" +
		`{{ tpl (.Files.Get "notes.txt") . | indent 4 }}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "templates/notes-test.yaml"), []byte(cm), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "csi-fastblk", dir, "--namespace", "csi-fastblk", "--kube-version", kubeVersion,
		"--show-only", "templates/notes-test.yaml"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, stderr, err := helm(t, append(args, extra...)...)
	if err != nil {
		t.Fatalf("render NOTES.txt %v: %v\n%s", set, err, stderr)
	}
	var cmObj struct {
		Data map[string]string `yaml:"data"`
	}
	objs, err := decodeObjects([]byte(out))
	if err != nil || len(objs) != 1 {
		t.Fatalf("NOTES.txt render: %d objects, %v", len(objs), err)
	}
	if err := objs[0].decode(&cmObj); err != nil {
		t.Fatal(err)
	}
	return cmObj.Data["notes"]
}

// TestNotesSayWhatIsWrong checks NOTES.txt explains each snapshot setup
// that would not work, and says nothing alarming when it would.
func TestNotesSayWhatIsWrong(t *testing.T) {
	api := []string{"--api-versions", snapshotAPI}
	cases := []struct {
		name    string
		extra   []string
		set     []string
		want    []string
		wantNot []string
	}{
		{"no API", nil, nil, []string{"WARNING: the cluster has no snapshot.storage.k8s.io/v1 API"}, []string{"is ready"}},
		{"no distributed controller", api, nil, []string{"WARNING: no VolumeSnapshotClass was created",
			"snapshotController.distributedInCluster=true"}, []string{"is ready"}},
		{"installed controller", api, []string{"snapshotController.install=true"},
			[]string{`VolumeSnapshotClass "fastblk" is ready`, "installed by this release"}, []string{"WARNING"}},
		{"declared controller", api, []string{"snapshotController.distributedInCluster=true"},
			[]string{`VolumeSnapshotClass "fastblk" is ready`}, []string{"WARNING"}},
		{"two controllers", api, []string{"snapshotController.install=true", "snapshotController.distributedInCluster=true"},
			[]string{"WARNING: snapshotController.install and .distributedInCluster are both true"}, nil},
		{"snapshots off", nil, []string{"snapshotter.enabled=false"}, nil, []string{"WARNING", "Snapshots need"}},
		{"class off", api, []string{"snapshotClass.create=false", "snapshotController.install=true"},
			[]string{"No VolumeSnapshotClass (snapshotClass.create=false)"}, []string{"WARNING"}},
		{"classes and groups", api, []string{"snapshotController.install=true", "storageClasses[0].name=capped",
			"storageClasses[0].maxIOPS=500", "nodeGroups[0].name=nvme", "nodeGroups[0].nodeSelector.disk=nvme",
			"nodeGroups[0].dataDir=/mnt/fastblk", "nodeGroups[0].reserve=10Gi"},
			[]string{`StorageClass "fastblk" (ext4, WaitForFirstConsumer)`,
				`StorageClass "capped" (ext4, WaitForFirstConsumer, rate-limited: only nodes with the ublk backend get capacity)`,
				`nvme: nodes {"disk":"nvme","kubernetes.io/os":"linux"}, data in /mnt/fastblk, 10Gi reserved`}, []string{"WARNING"}},
		{"reserve", api, []string{"snapshotController.install=true", "reserve=20Gi"},
			[]string{"data directory: /var/lib/csi-fastblk (20Gi reserved)"}, nil},
		{"no lookup", api, []string{"snapshotController.lookup=false", "snapshotController.distributedInCluster=true"},
			[]string{`VolumeSnapshotClass "fastblk" is ready`}, []string{"WARNING"}},
		{"snapshot metadata", []string{"--api-versions", snapshotAPI, "--api-versions", "cbt.storage.k8s.io/v1beta1"},
			[]string{"snapshotController.install=true", "snapshotMetadata.enabled=true"},
			[]string{"served at\ncsi-fastblk-snapshot-metadata.csi-fastblk:6443", `SnapshotMetadataService "fastblk.csi.io"`,
				"csi-fastblk-snapshot-metadata-client-token (RoleBinding"}, []string{"WARNING"}},
		{"snapshot metadata without its API", api, []string{"snapshotController.install=true", "snapshotMetadata.enabled=true"},
			[]string{"WARNING: the cluster has no cbt.storage.k8s.io/v1beta1 API"}, []string{"SnapshotMetadataService \""}},
		{"snapshot metadata off", api, []string{"snapshotController.install=true"}, nil, []string{"Snapshot metadata"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := notes(t, tc.extra, tc.set...)
			for _, w := range tc.want {
				if !strings.Contains(n, w) {
					t.Errorf("NOTES lack %q:\n%s", w, n)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(n, w) {
					t.Errorf("NOTES say %q:\n%s", w, n)
				}
			}
		})
	}
}

// TestAdmission checks the optional Namespace (PodSecurity privileged, kept
// on uninstall) holds every namespaced object of the chart, and the chart's
// own PriorityClass, which the node pods then use instead of
// system-node-critical.
func TestAdmission(t *testing.T) {
	objs := render(t)
	if len(find(objs, "Namespace"))+len(find(objs, "PriorityClass")) != 0 {
		t.Fatal("a Namespace or PriorityClass by default")
	}
	objs = render(t, "namespace.create=true", "namespace.name=fastblk-system", "namespace.labels.team=storage",
		"priorityClass.create=true", "snapshotController.install=true")
	ns := one(t, objs, "Namespace")
	for k, v := range map[string]string{"pod-security.kubernetes.io/enforce": "privileged",
		"pod-security.kubernetes.io/audit": "privileged", "pod-security.kubernetes.io/warn": "privileged", "team": "storage"} {
		if ns.Metadata.Labels[k] != v {
			t.Errorf("namespace label %s=%q, want %q", k, ns.Metadata.Labels[k], v)
		}
	}
	if ns.Metadata.Name != "fastblk-system" || ns.Metadata.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("namespace %s annotations %v: want fastblk-system, kept on uninstall", ns.Metadata.Name, ns.Metadata.Annotations)
	}
	checkNamespace(t, objs, "fastblk-system")
	pc := one(t, objs, "PriorityClass")
	var spec struct {
		Value         int64 `yaml:"value"`
		GlobalDefault bool  `yaml:"globalDefault"`
	}
	if err := pc.decode(&spec); err != nil {
		t.Fatal(err)
	}
	if spec.Value != 1000000000 || spec.GlobalDefault {
		t.Errorf("PriorityClass %+v: want value 1000000000, not global default", spec)
	}
	if p := nodePod(t, objs); p.PriorityClassName != pc.Metadata.Name {
		t.Errorf("node pods use priority class %q, want the chart's %q", p.PriorityClassName, pc.Metadata.Name)
	}
	// Without create, namespace.name still places the objects.
	checkNamespace(t, render(t, "namespace.name=elsewhere"), "elsewhere")
	checkNamespace(t, render(t), "csi-fastblk")
}

// checkNamespace checks every namespaced object, and every ServiceAccount a
// binding names, is in ns.
func checkNamespace(t *testing.T, objs []object, ns string) {
	t.Helper()
	cluster := map[string]bool{"Namespace": true, "PriorityClass": true, "ClusterRole": true, "ClusterRoleBinding": true,
		"CSIDriver": true, "StorageClass": true, "VolumeSnapshotClass": true, "VolumeAttributesClass": true,
		"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}
	for _, o := range objs {
		if !cluster[o.Kind] && o.Metadata.Namespace != ns {
			t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
		if o.Kind == "ClusterRoleBinding" || o.Kind == "RoleBinding" {
			var b struct {
				Subjects []struct{ Namespace string } `yaml:"subjects"`
			}
			if err := o.decode(&b); err != nil {
				t.Fatal(err)
			}
			for _, s := range b.Subjects {
				if s.Namespace != ns {
					t.Errorf("%s %s binds a ServiceAccount of namespace %q, want %q", o.Kind, o.Metadata.Name, s.Namespace, ns)
				}
			}
		}
	}
}

// TestResourcesAndProbes checks every container of the node pod requests
// CPU and memory, the plugin has no CPU limit, and every sidecar with a
// diagnostics endpoint is probed on it.
func TestResourcesAndProbes(t *testing.T) {
	p := nodePod(t, render(t))
	for _, c := range p.Containers {
		if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
			t.Errorf("%s requests %v: want cpu and memory", c.Name, c.Resources.Requests)
		}
		if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil {
			t.Errorf("%s has no HTTP liveness probe", c.Name)
			continue
		}
		port := -1
		for _, cp := range c.Ports {
			if cp.Name == c.LivenessProbe.HTTPGet.Port {
				port = cp.ContainerPort
			}
		}
		if port < 0 {
			t.Errorf("%s probes port %q, which no container declares", c.Name, c.LivenessProbe.HTTPGet.Port)
		}
	}
	plugin := mustContainer(t, p, "csi-fastblk")
	if _, ok := plugin.Resources.Limits["cpu"]; ok {
		t.Error("the plugin has a CPU limit by default")
	}
	want := map[string]struct {
		port, path string
	}{
		"csi-provisioner": {"9812", "/metrics"}, "csi-resizer": {"9813", "/healthz/leader-election"},
		"csi-snapshotter": {"9814", "/metrics"},
	}
	for name, w := range want {
		c := mustContainer(t, p, name)
		if v, _ := c.arg("http-endpoint"); v != ":"+w.port {
			t.Errorf("%s --http-endpoint=%q, want :%s", name, v, w.port)
		}
		if w.path != "" && c.LivenessProbe.HTTPGet.Path != w.path {
			t.Errorf("%s probes %s, want %s", name, c.LivenessProbe.HTTPGet.Path, w.path)
		}
	}
	// The kubelet probes the plugin's own /healthz, served alone on
	// --health-address: no livenessprobe or registrar sidecar.
	for _, name := range []string{"liveness-probe", "node-driver-registrar"} {
		if _, ok := p.container(name); ok {
			t.Errorf("the node pod still runs %s", name)
		}
	}
	lp := plugin.LivenessProbe
	if v, _ := plugin.arg("health-address"); v != ":9808" || lp.HTTPGet.Port != "healthz" || lp.HTTPGet.Path != "/healthz" ||
		lp.TimeoutSeconds != 5 {
		t.Errorf("plugin --health-address=%q, probe %+v: want :9808 probed at /healthz on port healthz within 5s", v, lp)
	}
}

func mustContainer(t *testing.T, p podSpec, name string) container {
	t.Helper()
	c, ok := p.container(name)
	if !ok {
		t.Fatalf("no %s container", name)
	}
	return c
}

// TestSidecarFlags checks the flags upstream recommends for a distributed
// node-local driver: one --timeout, long enough for a copy, on every sidecar
// that calls the plugin's controller; PVC metadata in CreateVolume; the
// DaemonSet, not the pod, owning the node's CSIStorageCapacity objects.
func TestSidecarFlags(t *testing.T) {
	for _, timeout := range []string{"", "3h"} {
		var set []string
		want := "1h"
		if timeout != "" {
			set, want = []string{"csiTimeout=" + timeout}, timeout
		}
		p := nodePod(t, render(t, set...))
		for _, name := range []string{"csi-provisioner", "csi-resizer", "csi-snapshotter"} {
			if v, _ := mustContainer(t, p, name).arg("timeout"); v != want {
				t.Errorf("%s --timeout=%q, want %s", name, v, want)
			}
		}
		prov := mustContainer(t, p, "csi-provisioner")
		for _, f := range []string{"extra-create-metadata", "capacity-ownerref-level=1"} {
			if !hasArg(prov, f) {
				t.Errorf("provisioner lacks --%s", f)
			}
		}
		if hasArg(mustContainer(t, p, "csi-snapshotter"), "extra-create-metadata") {
			t.Error("snapshotter has --extra-create-metadata: the plugin refuses snapshot parameters")
		}
	}
}

// TestNodeGroups checks each node group becomes a DaemonSet of its own on
// its nodes, with its data directory, reserve and hostPath type, that the
// selectors of the DaemonSets never overlap, and that without groups there
// is one DaemonSet for every node.
func TestNodeGroups(t *testing.T) {
	objs := render(t, "reserve=5Gi")
	p := nodePod(t, objs)
	plugin := mustContainer(t, p, "csi-fastblk")
	if v, _ := plugin.arg("reserve"); v != "5Gi" {
		t.Errorf("--reserve=%q, want 5Gi", v)
	}
	if _, ok := mustContainer(t, nodePod(t, render(t)), "csi-fastblk").arg("reserve"); ok {
		t.Error("--reserve without a reserve value")
	}
	objs = render(t, "reserve=5Gi",
		"nodeGroups[0].name=nvme", "nodeGroups[0].nodeSelector.disk=nvme", "nodeGroups[0].dataDir=/mnt/nvme",
		"nodeGroups[0].reserve=10Gi", "nodeGroups[0].createDataDir=false",
		"nodeGroups[1].name=hdd", "nodeGroups[1].nodeSelector.disk=hdd", "nodeGroups[1].dataDir=/srv/fastblk")
	type ds struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template struct {
				Metadata metadata `yaml:"metadata"`
				Spec     podSpec  `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	want := map[string]struct{ disk, dir, reserve, hostType string }{
		"csi-fastblk-node-nvme": {"nvme", "/mnt/nvme", "10Gi", "Directory"},
		"csi-fastblk-node-hdd":  {"hdd", "/srv/fastblk", "5Gi", "DirectoryOrCreate"},
	}
	sets := find(objs, "DaemonSet")
	if len(sets) != len(want) {
		t.Fatalf("%d DaemonSets, want %d", len(sets), len(want))
	}
	for _, o := range sets {
		w, ok := want[o.Metadata.Name]
		if !ok {
			t.Errorf("unexpected DaemonSet %s", o.Metadata.Name)
			continue
		}
		var d ds
		if err := o.decode(&d); err != nil {
			t.Fatal(err)
		}
		p := d.Spec.Template.Spec
		if p.NodeSelector["disk"] != w.disk || p.NodeSelector["kubernetes.io/os"] != "linux" {
			t.Errorf("%s nodeSelector %v: want disk=%s and the top-level kubernetes.io/os", o.Metadata.Name, p.NodeSelector, w.disk)
		}
		if g := d.Spec.Selector.MatchLabels["fastblk.csi.io/node-group"]; g == "" || d.Spec.Template.Metadata.Labels["fastblk.csi.io/node-group"] != g {
			t.Errorf("%s: selector %v does not single out its group's pods", o.Metadata.Name, d.Spec.Selector.MatchLabels)
		}
		c := mustContainer(t, p, "csi-fastblk")
		if v, _ := c.arg("data-dir"); v != w.dir {
			t.Errorf("%s --data-dir=%s, want %s", o.Metadata.Name, v, w.dir)
		}
		if v, _ := c.arg("reserve"); v != w.reserve {
			t.Errorf("%s --reserve=%s, want %s", o.Metadata.Name, v, w.reserve)
		}
		if h := hostPathOf(t, p, c, w.dir); h != w.dir {
			t.Errorf("%s: %s comes from host %s", o.Metadata.Name, w.dir, h)
		}
		v, _ := p.volume("data-dir")
		if v.HostPath.Type != w.hostType {
			t.Errorf("%s data-dir hostPath type %s, want %s", o.Metadata.Name, v.HostPath.Type, w.hostType)
		}
	}
}

// TestStorageClasses checks the extra classes take storageClass's values
// for the keys they leave out, their own (false included) otherwise.
func TestStorageClasses(t *testing.T) {
	objs := render(t, "storageClass.fsType=xfs", "storageClass.isDefault=true",
		"storageClasses[0].name=fast-ext4", "storageClasses[0].fsType=ext4", "storageClasses[0].allowVolumeExpansion=false",
		"storageClasses[1].name=capped", "storageClasses[1].maxIOPS=5000", "storageClasses[1].maxBandwidth=200Mi",
		"storageClasses[1].reclaimPolicy=Retain")
	type class struct {
		ReclaimPolicy        string            `yaml:"reclaimPolicy"`
		AllowVolumeExpansion bool              `yaml:"allowVolumeExpansion"`
		Parameters           map[string]string `yaml:"parameters"`
	}
	want := map[string]struct {
		c         class
		isDefault bool
	}{
		"fastblk":   {class{"Delete", true, map[string]string{"csi.storage.k8s.io/fstype": "xfs"}}, true},
		"fast-ext4": {class{"Delete", false, map[string]string{"csi.storage.k8s.io/fstype": "ext4"}}, false},
		"capped": {class{"Retain", true, map[string]string{"csi.storage.k8s.io/fstype": "xfs",
			"maxIOPS": "5000", "maxBandwidth": "200Mi"}}, false},
	}
	classes := find(objs, "StorageClass")
	if len(classes) != len(want) {
		t.Fatalf("%d StorageClasses, want %d", len(classes), len(want))
	}
	for _, o := range classes {
		var c class
		if err := o.decode(&c); err != nil {
			t.Fatal(err)
		}
		w := want[o.Metadata.Name]
		if c.ReclaimPolicy != w.c.ReclaimPolicy || c.AllowVolumeExpansion != w.c.AllowVolumeExpansion ||
			!slices.Equal(sortedPairs(c.Parameters), sortedPairs(w.c.Parameters)) {
			t.Errorf("class %s: %+v, want %+v", o.Metadata.Name, c, w.c)
		}
		if _, d := o.Metadata.Annotations["storageclass.kubernetes.io/is-default-class"]; d != w.isDefault {
			t.Errorf("class %s default=%v, want %v", o.Metadata.Name, d, w.isDefault)
		}
	}
	if n := len(find(render(t, "storageClass.create=false", "storageClasses[0].name=only"), "StorageClass")); n != 1 {
		t.Errorf("storageClass.create=false with one extra class: %d classes, want 1", n)
	}
}

func sortedPairs(m map[string]string) []string {
	var r []string
	for k, v := range m {
		r = append(r, k+"="+v)
	}
	slices.Sort(r)
	return r
}

// TestReadmeIsFresh fails when the chart README's values table is not what
// hack/chart/valuesdoc makes of values.yaml (make chart-readme), or a value
// has no comment.
func TestReadmeIsFresh(t *testing.T) {
	cmd := exec.Command("go", "run", "./hack/chart/valuesdoc", "-check", "charts/csi-fastblk")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestUpdateStrategy checks the DaemonSets' strategy: RollingUpdate with
// maxUnavailable only, or OnDelete without the rollingUpdate the API server
// forbids beside it (values merge the default rollingUpdate in).
func TestUpdateStrategy(t *testing.T) {
	type strategy struct {
		Spec struct {
			UpdateStrategy struct {
				Type          string            `yaml:"type"`
				RollingUpdate map[string]string `yaml:"rollingUpdate"`
			} `yaml:"updateStrategy"`
		} `yaml:"spec"`
	}
	for _, tc := range []struct {
		set       []string
		typ       string
		unavail   string
		noRolling bool
	}{
		{nil, "RollingUpdate", "1", false},
		{[]string{"updateStrategy.rollingUpdate.maxUnavailable=25%"}, "RollingUpdate", "25%", false},
		{[]string{"updateStrategy.type=OnDelete"}, "OnDelete", "", true},
	} {
		var s strategy
		if err := one(t, render(t, tc.set...), "DaemonSet").decode(&s); err != nil {
			t.Fatal(err)
		}
		u := s.Spec.UpdateStrategy
		if u.Type != tc.typ || u.RollingUpdate["maxUnavailable"] != tc.unavail || (u.RollingUpdate == nil) != tc.noRolling {
			t.Errorf("%v: strategy %+v, want type %s maxUnavailable %q", tc.set, u, tc.typ, tc.unavail)
		}
	}
}

// TestReserveAsNumber checks a reserve given as a number in a values file
// (which reaches the templates as a float64) becomes plain digits, not
// 2.147483648e+10, and 0 passes no flag.
func TestReserveAsNumber(t *testing.T) {
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte("reserve: 21474836480\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := nodePod(t, renderArgs(t, []string{"-f", f}))
	if v, _ := mustContainer(t, p, "csi-fastblk").arg("reserve"); v != "21474836480" {
		t.Errorf("--reserve=%q, want 21474836480", v)
	}
	if v, _ := mustContainer(t, nodePod(t, render(t, "reserve=15%")), "csi-fastblk").arg("reserve"); v != "15%" {
		t.Errorf("reserve=15%%: --reserve=%q, want 15%%", v)
	}
	if _, ok := mustContainer(t, nodePod(t, render(t, "reserve=0")), "csi-fastblk").arg("reserve"); ok {
		t.Error("reserve=0 passes --reserve")
	}
}

// TestOptionalBranches renders every optional value the other tests leave
// out and checks each lands where it belongs.
func TestOptionalBranches(t *testing.T) {
	objs := renderArgs(t, []string{"--api-versions", snapshotAPI},
		"imagePullSecrets[0].name=regcred", "podAnnotations.team=storage", "podLabels.tier=node",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=disk",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
		"snapshotController.install=true", "snapshotController.nodeSelector.role=infra",
		"snapshotController.tolerations[0].operator=Exists", "snapshotClass.isDefault=true",
		"storageClass.mountOptions[0]=noatime", "sidecarsPrivileged=false")
	type pod struct {
		Spec struct {
			Template struct {
				Metadata metadata `yaml:"metadata"`
				Spec     struct {
					ImagePullSecrets []struct{ Name string } `yaml:"imagePullSecrets"`
					NodeSelector     map[string]string       `yaml:"nodeSelector"`
					Tolerations      []map[string]string     `yaml:"tolerations"`
					Affinity         map[string]any          `yaml:"affinity"`
					Containers       []container             `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	var ds, ctrl pod
	if err := one(t, objs, "DaemonSet").decode(&ds); err != nil {
		t.Fatal(err)
	}
	if err := one(t, objs, "Deployment").decode(&ctrl); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]pod{"DaemonSet": ds, "Deployment": ctrl} {
		if s := p.Spec.Template.Spec.ImagePullSecrets; len(s) != 1 || s[0].Name != "regcred" {
			t.Errorf("%s imagePullSecrets %v, want regcred", name, s)
		}
	}
	m := ds.Spec.Template.Metadata
	if m.Annotations["team"] != "storage" || m.Labels["tier"] != "node" || ds.Spec.Template.Spec.Affinity["nodeAffinity"] == nil {
		t.Errorf("node pod annotations %v labels %v affinity %v: want team, tier and a nodeAffinity", m.Annotations, m.Labels, ds.Spec.Template.Spec.Affinity)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "csi-fastblk" {
			continue
		}
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged {
			t.Errorf("sidecar %s privileged with sidecarsPrivileged=false", c.Name)
		}
	}
	if cs := ctrl.Spec.Template.Spec; cs.NodeSelector["role"] != "infra" || len(cs.Tolerations) != 1 {
		t.Errorf("snapshot-controller nodeSelector %v tolerations %v", cs.NodeSelector, cs.Tolerations)
	}
	for _, sa := range find(objs, "ServiceAccount") {
		var a struct {
			ImagePullSecrets []struct{ Name string } `yaml:"imagePullSecrets"`
		}
		if err := sa.decode(&a); err != nil {
			t.Fatal(err)
		}
		if len(a.ImagePullSecrets) != 1 {
			t.Errorf("ServiceAccount %s without the pull secret", sa.Metadata.Name)
		}
	}
	if one(t, objs, "VolumeSnapshotClass").Metadata.Annotations["snapshot.storage.kubernetes.io/is-default-class"] != "true" {
		t.Error("snapshotClass.isDefault=true: no default-class annotation")
	}
	var sc struct {
		MountOptions []string `yaml:"mountOptions"`
	}
	if err := one(t, objs, "StorageClass").decode(&sc); err != nil || len(sc.MountOptions) != 1 || sc.MountOptions[0] != "noatime" {
		t.Errorf("StorageClass mountOptions %v (%v), want [noatime]", sc.MountOptions, err)
	}
	// With the snapshotter the plugin labels hand-made snapshot contents
	// for it; without: no sidecar, no snapshotter RBAC, no labelling
	// (which uses the snapshotter's rights).
	if _, ok := mustContainer(t, nodePod(t, render(t)), "csi-fastblk").arg("label-snapshot-contents"); !ok {
		t.Error("the plugin does not label hand-made snapshot contents for the node's csi-snapshotter")
	}
	objs = render(t, "snapshotter.enabled=false")
	if _, ok := nodePod(t, objs).container("csi-snapshotter"); ok {
		t.Error("snapshotter.enabled=false still runs csi-snapshotter")
	}
	if _, ok := mustContainer(t, nodePod(t, objs), "csi-fastblk").arg("label-snapshot-contents"); ok {
		t.Error("snapshotter.enabled=false: --label-snapshot-contents still set")
	}
	for _, o := range find(objs, "ClusterRole") {
		if strings.HasSuffix(o.Metadata.Name, "-snapshotter") {
			t.Errorf("snapshotter.enabled=false still creates ClusterRole %s", o.Metadata.Name)
		}
	}
}
