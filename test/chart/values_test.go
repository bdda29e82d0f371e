package chart

import (
	"slices"
	"strings"
	"testing"
)

// TestBadValuesFail checks that invalid values stop the render with a
// message naming the value and the rule.
func TestBadValuesFail(t *testing.T) {
	cases := []struct {
		name string
		set  string
		want []string
	}{
		{"unknown backend", "backend=floppy", []string{"/backend", "must be one of", "auto", "ublk", "loop"}},
		{"negative queues", "tuning.queues=-1", []string{"/tuning/queues", "minimum"}},
		{"queue depth too large", "tuning.queueDepth=5000", []string{"/tuning/queueDepth", "maximum"}},
		{"poll not a duration", "tuning.poll=fast", []string{"/tuning/poll"}},
		{"poll a bare number", "tuning.poll=500", []string{"/tuning/poll"}},
		{"batch i/o yes", "tuning.batchIO=yes", []string{"/tuning/batchIO", "must be one of", "off", "auto", "on"}},
		{"max i/o size in MB", "tuning.maxIOSize=1MB", []string{"/tuning/maxIOSize", "does not match pattern"}},
		{"class max i/o size in GiB", "storageClass.maxIOSize=1Gi", []string{"/storageClass/maxIOSize", "does not match pattern"}},
		{"unknown fstype", "storageClass.fsType=btrfs", []string{"/storageClass/fsType", "ext4", "xfs"}},
		{"relative kubelet dir", "kubeletDir=var/lib/kubelet", []string{"/kubeletDir", "does not match pattern"}},
		{"dot-dot data dir", "dataDir=/var/../etc", []string{"/dataDir", "does not match pattern"}},
		{"ratio below one", "overProvisionRatio=0.5", []string{"overProvisionRatio 0.5 must be from 1 to 100"}},
		{"ratio not a number", "overProvisionRatio=lots", []string{"/overProvisionRatio"}},
		{"copy budget above 0.9", "copyBudget=0.95", []string{"/copyBudget"}},
		{"copy budget below 0.01", "copyBudget=0.005", []string{"/copyBudget"}},
		{"copy budget in percent", "copyBudget=20%", []string{"/copyBudget"}},
		{"port out of range", "metrics.port=70000", []string{"/metrics/port", "maximum"}},
		{"misspelt key", "backnd=loop", []string{"additional properties 'backnd' not allowed"}},
		{"bad pull policy", "plugin.image.pullPolicy=Sometimes", []string{"/plugin/image/pullPolicy", "must be one of"}},
		{"bad driver name", "driverName=Fast_Blk", []string{"/driverName", "does not match pattern"}},
		{"port clash", "metrics.port=9808", []string{"metrics.port 9808 is already used by healthPort"}},
		{"data dir under kubelet", "dataDir=/var/lib/kubelet/fastblk", []string{"must not be inside kubeletDir"}},
		{"class bandwidth in MB/s", "storageClass.maxBandwidth=100MB", []string{"/storageClass/maxBandwidth", "does not match pattern"}},
		{"negative class iops", "storageClass.maxIOPS=-5", []string{"/storageClass/maxIOPS", "minimum"}},
		{"attributes class without a limit", "volumeAttributesClasses[0].name=empty", []string{"/volumeAttributesClasses/0"}},
		{"max surge", "updateStrategy.rollingUpdate.maxSurge=1", []string{"/updateStrategy/rollingUpdate", "additional properties 'maxSurge' not allowed"}},
		{"zero max unavailable", "updateStrategy.rollingUpdate.maxUnavailable=0", []string{"/updateStrategy/rollingUpdate/maxUnavailable"}},
		{"namespace created as the release's", "namespace.create=true", []string{"namespace.create: set namespace.name to a namespace other than the release's (csi-fastblk)"}},
		{"bad namespace name", "namespace.name=Fast_Blk", []string{"/namespace/name", "does not match pattern"}},
		{"plugin cpu limit", "plugin.resources.limits.cpu=2", []string{"plugin.resources.limits.cpu: a CPU limit throttles"}},
		{"reserve in GB", "reserve=10GB", []string{"/reserve", "does not match pattern"}},
		{"reserve of everything", "reserve=100%", []string{"/reserve", "does not match pattern"}},
		{"timeout not a duration", "csiTimeout=forever", []string{"/csiTimeout", "does not match pattern"}},
		{"probe timeout in ms", "probeTimeout=500ms", []string{"/probeTimeout"}},
		{"port clash with a sidecar", "snapshotter.httpPort=9812", []string{"snapshotter.httpPort 9812 is already used by provisioner.httpPort"}},
		{"priority above user range", "priorityClass.value=2000000000", []string{"/priorityClass/value", "maximum"}},
		{"node group without selector", "nodeGroups[0].name=a,nodeGroups[0].dataDir=/mnt/a", []string{"/nodeGroups/0", "nodeSelector"}},
		{"node group name too long", "nodeGroups[0].name=averyveryverylongnodegroupname,nodeGroups[0].nodeSelector.a=b,nodeGroups[0].dataDir=/mnt/a", []string{"/nodeGroups/0/name"}},
		{"node groups twice", "nodeGroups[0].name=a,nodeGroups[0].nodeSelector.d=x,nodeGroups[0].dataDir=/mnt/a,nodeGroups[1].name=a,nodeGroups[1].nodeSelector.d=y,nodeGroups[1].dataDir=/mnt/b",
			[]string{`nodeGroups: the name "a" is used twice`}},
		{"node groups on the same nodes", "nodeGroups[0].name=a,nodeGroups[0].nodeSelector.d=x,nodeGroups[0].dataDir=/mnt/a,nodeGroups[1].name=b,nodeGroups[1].nodeSelector.d=x,nodeGroups[1].dataDir=/mnt/b",
			[]string{"nodeGroups a and b have the same nodeSelector", "at most one group"}},
		{"node group data dir under kubelet", "nodeGroups[0].name=a,nodeGroups[0].nodeSelector.d=x,nodeGroups[0].dataDir=/var/lib/kubelet/x",
			[]string{"nodeGroups[0].dataDir /var/lib/kubelet/x must not be inside kubeletDir"}},
		{"class without a name", "storageClasses[0].fsType=xfs", []string{"/storageClasses/0", "name"}},
		{"class twice", "storageClasses[0].name=fastblk", []string{`StorageClass "fastblk" is defined twice`}},
		{"two default classes", "storageClass.isDefault=true,storageClasses[0].name=b,storageClasses[0].isDefault=true",
			[]string{"StorageClasses fastblk, b are all marked isDefault"}},
		{"class with a bad fstype", "storageClasses[0].name=b,storageClasses[0].fsType=zfs", []string{"/storageClasses/0/fsType"}},
		{"capacity alert ratio above one", "metrics.prometheusRule.capacityAvailableMinRatio=2", []string{"/metrics/prometheusRule/capacityAvailableMinRatio", "maximum"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helm(t, templateArgs(tc.set)...)
			if err == nil {
				t.Fatalf("--set %s rendered; want a failure", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("--set %s: message lacks %q:\n%s", tc.set, w, stderr)
				}
			}
		})
	}
}

// TestLint runs helm lint --strict with default and non-default values.
func TestLint(t *testing.T) {
	for name, set := range valueSets {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", "charts/csi-fastblk", "--kube-version", kubeVersion}
			for _, s := range set {
				args = append(args, "--set", s)
			}
			out, stderr, err := helm(t, args...)
			if err != nil {
				t.Fatalf("helm lint %v: %v\n%s%s", set, err, out, stderr)
			}
		})
	}
}

// valueSets are the non-default configurations every structural test renders.
var valueSets = map[string][]string{
	"default": nil,
	"k0s":     {"kubeletDir=/var/lib/k0s/kubelet"},
	"custom images": {"plugin.image.repository=registry.local/fastblk", "plugin.image.tag=v9",
		"provisioner.image.repository=registry.local/prov"},
	"metrics off":         {"metrics.enabled=false"},
	"snapshot controller": {"snapshotController.install=true"},
	"tuned": {"backend=loop", "tuning.queues=4", "tuning.queueDepth=256", "tuning.poll=0", "tuning.maxIOSize=512Ki", "tuning.batchIO=auto",
		"storageClass.queues=2", "storageClass.queueDepth=64", "storageClass.maxIOSize=256Ki", "storageClass.fsType=xfs", "storageClass.isDefault=true", "logLevel=5",
		"overProvisionRatio=1.5", "maxVolumesPerNode=0"},
	"no snapshots": {"snapshotter.enabled=false", "storageClass.create=false"},
	"alerts":       {"metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom"},
	"admission":    {"namespace.create=true", "namespace.name=fastblk-system", "priorityClass.create=true", "priorityClass.value=1000"},
	"node groups": {"nodeGroups[0].name=nvme", "nodeGroups[0].nodeSelector.disk=nvme", "nodeGroups[0].dataDir=/mnt/nvme",
		"nodeGroups[0].reserve=10Gi", "nodeGroups[0].createDataDir=false", "nodeGroups[1].name=rest",
		"nodeGroups[1].nodeSelector.disk=none", "nodeGroups[1].dataDir=/var/lib/csi-fastblk", "reserve=1Gi"},
	"device classes": {"deviceClasses[0].name=nvme", "deviceClasses[0].path=/mnt/fastblk/nvme", "deviceClasses[0].reserve=5%",
		"deviceClasses[1].name=hdd", "deviceClasses[1].path=/srv/hdd/fastblk", "deviceClasses[1].overProvisionRatio=2",
		"storageClasses[0].name=fastblk-nvme", "storageClasses[0].deviceClass=nvme"},
	"classes": {"storageClasses[0].name=fastblk-xfs", "storageClasses[0].fsType=xfs",
		"storageClasses[1].name=capped", "storageClasses[1].maxIOPS=100", "storageClasses[1].isDefault=true"},
	"sizing": {"csiTimeout=4h", "probeTimeout=10s", "plugin.resources.limits.memory=1Gi",
		"updateStrategy.type=OnDelete", "snapshotController.distributedInCluster=true"},
	"rolling percent": {"updateStrategy.rollingUpdate.maxUnavailable=25%"},
	"monitoring": {"metrics.prometheusRule.enabled=true", "metrics.monitor.enabled=true", "metrics.dashboard.enabled=true",
		"uninstallCheck.allowWithVolumes=true"},
	"service monitor": {"metrics.monitor.enabled=true", "metrics.monitor.kind=ServiceMonitor", "uninstallCheck.enabled=false"},
	"rate limits": {"storageClass.maxIOPS=5000", "storageClass.maxBandwidth=200Mi",
		"volumeAttributesClasses[0].name=gold", "volumeAttributesClasses[0].maxIOPS=20000",
		"volumeAttributesClasses[1].name=capped", "volumeAttributesClasses[1].maxBandwidth=100Mi"},
}

// TestRenders checks every value set renders objects with the API versions a
// current API server serves.
func TestRenders(t *testing.T) {
	apiVersion := map[string]string{
		"DaemonSet": "apps/v1", "Deployment": "apps/v1", "CSIDriver": "storage.k8s.io/v1",
		"StorageClass": "storage.k8s.io/v1", "VolumeSnapshotClass": "snapshot.storage.k8s.io/v1",
		"ServiceAccount": "v1", "ClusterRole": "rbac.authorization.k8s.io/v1",
		"ClusterRoleBinding": "rbac.authorization.k8s.io/v1", "Role": "rbac.authorization.k8s.io/v1",
		"RoleBinding":                      "rbac.authorization.k8s.io/v1",
		"CustomResourceDefinition":         "apiextensions.k8s.io/v1",
		"PrometheusRule":                   "monitoring.coreos.com/v1",
		"VolumeAttributesClass":            "storage.k8s.io/v1",
		"Namespace":                        "v1",
		"PriorityClass":                    "scheduling.k8s.io/v1",
		"Job":                              "batch/v1",
		"PodMonitor":                       "monitoring.coreos.com/v1",
		"ServiceMonitor":                   "monitoring.coreos.com/v1",
		"Service":                          "v1",
		"ConfigMap":                        "v1",
		"NetworkPolicy":                    "networking.k8s.io/v1",
		"ValidatingAdmissionPolicy":        "admissionregistration.k8s.io/v1",
		"ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io/v1",
	}
	for name, set := range valueSets {
		t.Run(name, func(t *testing.T) {
			objs := render(t, set...)
			for _, o := range objs {
				want, ok := apiVersion[o.Kind]
				if !ok {
					t.Errorf("unexpected kind %s (%s)", o.Kind, o.Metadata.Name)
				} else if o.APIVersion != want {
					t.Errorf("%s %s: apiVersion %s, want %s", o.Kind, o.Metadata.Name, o.APIVersion, want)
				}
				if o.Metadata.Name == "" {
					t.Errorf("%s without a name", o.Kind)
				}
			}
			if slices.Contains(set, "metrics.enabled=false") {
				checkMetricsOff(t, objs)
			}
		})
	}
}

func checkMetricsOff(t *testing.T, objs []object) {
	t.Helper()
	var w workload
	if err := one(t, objs, "DaemonSet").decode(&w); err != nil {
		t.Fatal(err)
	}
	plugin, _ := w.Spec.Template.Spec.container("csi-fastblk")
	if v, ok := plugin.arg("metrics-address"); !ok || v != "" {
		t.Errorf("metrics off: --metrics-address=%q (present %v), want empty", v, ok)
	}
	for _, p := range plugin.Ports {
		if p.Name == "metrics" {
			t.Error("metrics off: the plugin still exposes a metrics port")
		}
	}
	if _, ok := w.Spec.Template.Metadata.Annotations["prometheus.io/scrape"]; ok {
		t.Error("metrics off: the pod still carries prometheus.io/scrape")
	}
}
