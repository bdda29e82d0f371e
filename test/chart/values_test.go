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
		{"port out of range", "metrics.port=70000", []string{"/metrics/port", "maximum"}},
		{"misspelt key", "backnd=loop", []string{"additional properties 'backnd' not allowed"}},
		{"bad pull policy", "plugin.image.pullPolicy=Sometimes", []string{"/plugin/image/pullPolicy", "must be one of"}},
		{"bad driver name", "driverName=Fast_Blk", []string{"/driverName", "does not match pattern"}},
		{"port clash", "metrics.port=9808", []string{"metrics.port 9808 is already used by healthPort"}},
		{"data dir under kubelet", "dataDir=/var/lib/kubelet/fastblk", []string{"must not be inside kubeletDir"}},
		{"class bandwidth in MB/s", "storageClass.maxBandwidth=100MB", []string{"/storageClass/maxBandwidth", "does not match pattern"}},
		{"negative class iops", "storageClass.maxIOPS=-5", []string{"/storageClass/maxIOPS", "minimum"}},
		{"attributes class without a limit", "volumeAttributesClasses[0].name=empty", []string{"/volumeAttributesClasses/0"}},
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
		"RoleBinding":              "rbac.authorization.k8s.io/v1",
		"CustomResourceDefinition": "apiextensions.k8s.io/v1",
		"PrometheusRule":           "monitoring.coreos.com/v1",
		"VolumeAttributesClass":    "storage.k8s.io/v1",
		"Job":                      "batch/v1",
		"PodMonitor":               "monitoring.coreos.com/v1",
		"ServiceMonitor":           "monitoring.coreos.com/v1",
		"Service":                  "v1",
		"ConfigMap":                "v1",
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
