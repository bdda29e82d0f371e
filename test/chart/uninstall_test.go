package chart

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

type hookJob struct {
	Spec struct {
		BackoffLimit *int `yaml:"backoffLimit"`
		Template     struct {
			Spec struct {
				podSpec       `yaml:",inline"`
				RestartPolicy string `yaml:"restartPolicy"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type clusterRole struct {
	Rules []struct {
		APIGroups     []string `yaml:"apiGroups"`
		Resources     []string `yaml:"resources"`
		ResourceNames []string `yaml:"resourceNames"`
		Verbs         []string `yaml:"verbs"`
	} `yaml:"rules"`
}

type roleBinding struct {
	RoleRef struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"roleRef"`
	Subjects []struct {
		Kind      string `yaml:"kind"`
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"subjects"`
}

// hooks returns the objects of the pre-delete hook by kind.
func hooks(objs []object) map[string]object {
	m := map[string]object{}
	for _, o := range objs {
		if o.Metadata.Annotations["helm.sh/hook"] == "pre-delete" {
			m[o.Kind] = o
		}
	}
	return m
}

// TestUninstallCheck checks the pre-delete hook that refuses helm uninstall
// while the driver has volumes: a Job in the plugin's image running
// uninstall-check for the chart's driver name, under a ServiceAccount whose
// ClusterRole lists PersistentVolumes and VolumeAttachments and reads the
// driver's own CSIDriver (the override annotation), nothing else; the
// release's name, namespace and revision reach the check for the commands
// it prints; the RBAC objects come first (lower weights); every object is
// replaced by the next attempt and deleted after success; the override
// passes --allow-volumes; disabled, nothing is rendered.
func TestUninstallCheck(t *testing.T) {
	objs := render(t, "driverName=blk.example.com")
	h := hooks(objs)
	weights := map[string]int{}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"} {
		o, ok := h[kind]
		if !ok {
			t.Fatalf("no pre-delete %s (hooks %v)", kind, h)
		}
		if p := o.Metadata.Annotations["helm.sh/hook-delete-policy"]; p != "before-hook-creation,hook-succeeded" {
			t.Errorf("%s hook-delete-policy %q", kind, p)
		}
		w, err := strconv.Atoi(o.Metadata.Annotations["helm.sh/hook-weight"])
		if err != nil {
			t.Errorf("%s hook weight: %v", kind, err)
		}
		weights[kind] = w
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if weights[kind] >= weights["Job"] {
			t.Errorf("%s hook weight %d is not below the Job's %d: Helm would start the Job first", kind, weights[kind], weights["Job"])
		}
	}
	var role clusterRole
	if err := h["ClusterRole"].decode(&role); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			rule := strings.Join(r.APIGroups, ",") + "/" + res + ":" + strings.Join(r.Verbs, ",")
			if len(r.ResourceNames) > 0 {
				rule += "[" + strings.Join(r.ResourceNames, ",") + "]"
			}
			got = append(got, rule)
		}
	}
	slices.Sort(got)
	want := []string{"/persistentvolumes:list", "storage.k8s.io/csidrivers:get[blk.example.com]", "storage.k8s.io/volumeattachments:list"}
	if !slices.Equal(got, want) {
		t.Errorf("ClusterRole grants %v, want exactly %v", got, want)
	}
	var rb roleBinding
	if err := h["ClusterRoleBinding"].decode(&rb); err != nil {
		t.Fatal(err)
	}
	sa := h["ServiceAccount"].Metadata
	if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != h["ClusterRole"].Metadata.Name || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("binding %+v does not bind the ClusterRole to the ServiceAccount %s/%s", rb, sa.Namespace, sa.Name)
	}
	var job hookJob
	if err := h["Job"].decode(&job); err != nil {
		t.Fatal(err)
	}
	spec := job.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Name || spec.RestartPolicy != "Never" || job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 {
		t.Errorf("Job serviceAccount %q restartPolicy %q backoffLimit %v", spec.ServiceAccountName, spec.RestartPolicy, job.Spec.BackoffLimit)
	}
	plugin, _ := nodePod(t, objs).container("csi-fastblk")
	if len(spec.Containers) != 1 || spec.Containers[0].Image != plugin.Image {
		t.Fatalf("Job containers %+v, want one in the plugin's image %s", spec.Containers, plugin.Image)
	}
	c := spec.Containers[0]
	if !slices.Equal(c.Args, []string{"uninstall-check", "--driver-name=blk.example.com",
		"--release=csi-fastblk", "--release-namespace=csi-fastblk", "--release-revision=1"}) {
		t.Errorf("Job args %q", c.Args)
	}
	if c := hooks(render(t, "uninstallCheck.allowWithVolumes=true"))["Job"]; true {
		var j hookJob
		if err := c.decode(&j); err != nil {
			t.Fatal(err)
		}
		if args := j.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--allow-volumes") {
			t.Errorf("allowWithVolumes: args %q lack --allow-volumes", args)
		}
	}
	if h := hooks(render(t, "uninstallCheck.enabled=false")); len(h) != 0 {
		t.Errorf("uninstallCheck.enabled=false still renders hooks %v", h)
	}
}
