package chart

import (
	"os"
	"path/filepath"
	"testing"
)

type scrapeObject struct {
	Spec struct {
		NamespaceSelector struct {
			MatchNames []string `yaml:"matchNames"`
		} `yaml:"namespaceSelector"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		PodMetricsEndpoints []scrapeEndpoint `yaml:"podMetricsEndpoints"`
		Endpoints           []scrapeEndpoint `yaml:"endpoints"`
	} `yaml:"spec"`
}

type scrapeEndpoint struct {
	Port          string `yaml:"port"`
	Path          string `yaml:"path"`
	Interval      string `yaml:"interval"`
	ScrapeTimeout string `yaml:"scrapeTimeout"`
	HonorLabels   bool   `yaml:"honorLabels"`
	Relabelings   []struct {
		SourceLabels []string `yaml:"sourceLabels"`
		TargetLabel  string   `yaml:"targetLabel"`
		Replacement  string   `yaml:"replacement"`
	} `yaml:"relabelings"`
}

type service struct {
	Spec struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string `yaml:"name"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// matches reports whether every selector label is on the object.
func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// TestMonitor checks the opt-in PodMonitor and ServiceMonitor: absent by
// default and with metrics off; when enabled, they select the node pods
// (through a headless Service for ServiceMonitor) on the plugin's named
// metrics port, keep the volumes' namespace label (honorLabels), and set
// the job label the absence alerts look for and a node label.
func TestMonitor(t *testing.T) {
	for _, kind := range []string{"PodMonitor", "ServiceMonitor"} {
		if n := len(find(render(t), kind)); n != 0 {
			t.Errorf("default render has %d %s, want none (opt-in)", n, kind)
		}
		if n := len(find(render(t, "metrics.monitor.enabled=true", "metrics.monitor.kind="+kind, "metrics.enabled=false"), kind)); n != 0 {
			t.Errorf("metrics off: %d %s, want none", n, kind)
		}
	}
	var podLabels map[string]string
	for _, kind := range []string{"PodMonitor", "ServiceMonitor"} {
		t.Run(kind, func(t *testing.T) {
			objs := render(t, "metrics.monitor.enabled=true", "metrics.monitor.kind="+kind, "metrics.monitor.labels.release=prom",
				"metrics.monitor.scrapeTimeout=15s", "metrics.prometheusRule.enabled=true")
			var ds workload
			if err := one(t, objs, "DaemonSet").decode(&ds); err != nil {
				t.Fatal(err)
			}
			podLabels = ds.Spec.Template.Metadata.Labels
			o := one(t, objs, kind)
			if o.Metadata.Labels["release"] != "prom" || o.Metadata.Namespace != "csi-fastblk" {
				t.Errorf("labels %v, namespace %q; want release=prom in csi-fastblk", o.Metadata.Labels, o.Metadata.Namespace)
			}
			var m scrapeObject
			if err := o.decode(&m); err != nil {
				t.Fatal(err)
			}
			eps := m.Spec.PodMetricsEndpoints
			target := podLabels
			if kind == "ServiceMonitor" {
				eps = m.Spec.Endpoints
				var svc service
				so := one(t, objs, "Service")
				if err := so.decode(&svc); err != nil {
					t.Fatal(err)
				}
				if svc.Spec.ClusterIP != "None" || !matches(svc.Spec.Selector, podLabels) {
					t.Errorf("Service clusterIP %q selector %v; want headless over the node pods %v", svc.Spec.ClusterIP, svc.Spec.Selector, podLabels)
				}
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort != "metrics" {
					t.Errorf("Service ports %+v, want metrics -> metrics", svc.Spec.Ports)
				}
				target = so.Metadata.Labels
			}
			if !matches(m.Spec.Selector.MatchLabels, target) {
				t.Errorf("selector %v does not select %v", m.Spec.Selector.MatchLabels, target)
			}
			if len(m.Spec.NamespaceSelector.MatchNames) != 1 || m.Spec.NamespaceSelector.MatchNames[0] != "csi-fastblk" {
				t.Errorf("namespaceSelector %v, want the release namespace", m.Spec.NamespaceSelector.MatchNames)
			}
			if len(eps) != 1 {
				t.Fatalf("%d endpoints, want 1", len(eps))
			}
			ep := eps[0]
			if ep.Port != "metrics" || ep.Path != "/metrics" || !ep.HonorLabels || ep.Interval != "30s" || ep.ScrapeTimeout != "15s" {
				t.Errorf("endpoint %+v", ep)
			}
			found := false
			for _, c := range nodePod(t, objs).Containers {
				for _, p := range c.Ports {
					found = found || (c.Name == "csi-fastblk" && p.Name == "metrics")
				}
			}
			if !found {
				t.Error("the plugin container has no port named metrics")
			}
			labels := map[string]string{}
			for _, r := range ep.Relabelings {
				labels[r.TargetLabel] = r.Replacement
				if r.TargetLabel == "node" && (len(r.SourceLabels) != 1 || r.SourceLabels[0] != "__meta_kubernetes_pod_node_name") {
					t.Errorf("node relabeling %+v", r)
				}
			}
			if _, ok := labels["node"]; !ok || labels["job"] != "csi-fastblk" {
				t.Errorf("relabelings set %v, want job=csi-fastblk and node", labels)
			}
			if j := ruleExprs(t, objs)["FastblkPluginAbsent"]; j != `absent(up{job="csi-fastblk"} == 1)` {
				t.Errorf("FastblkPluginAbsent expr %q does not look for the monitor's job csi-fastblk", j)
			}
		})
	}
	objs := render(t, "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.job=kubernetes-pods")
	if j := ruleExprs(t, objs)["FastblkPluginDown"]; j != `up{job="kubernetes-pods"} == 0` {
		t.Errorf("FastblkPluginDown expr %q, want the job of metrics.prometheusRule.job", j)
	}
}

// TestDashboardConfigMap checks the opt-in dashboard ConfigMap carries the
// chart's dashboard file unchanged, with the sidecar's label, in the
// release namespace or the one asked for.
func TestDashboardConfigMap(t *testing.T) {
	isDashboard := func(o object) bool { return o.Metadata.Name == "csi-fastblk-dashboard" }
	for _, o := range find(render(t), "ConfigMap") {
		if isDashboard(o) {
			t.Error("default render has the dashboard ConfigMap, want it opt-in")
		}
	}
	want, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "csi-fastblk", "dashboards", "csi-fastblk.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set       []string
		namespace string
		label     [2]string
	}{
		{[]string{"metrics.dashboard.enabled=true"}, "csi-fastblk", [2]string{"grafana_dashboard", "1"}},
		{[]string{"metrics.dashboard.enabled=true", "metrics.dashboard.namespace=monitoring",
			"metrics.dashboard.labels.grafana_dashboard=null", "metrics.dashboard.labels.dashboards=storage"}, "monitoring", [2]string{"dashboards", "storage"}},
	} {
		var cm *object
		for _, o := range find(render(t, tc.set...), "ConfigMap") {
			if isDashboard(o) {
				cm = &o
			}
		}
		if cm == nil {
			t.Fatalf("%v: no dashboard ConfigMap", tc.set)
		}
		if cm.Metadata.Namespace != tc.namespace || cm.Metadata.Labels[tc.label[0]] != tc.label[1] {
			t.Errorf("%v: namespace %q labels %v; want %q and %s=%s", tc.set, cm.Metadata.Namespace, cm.Metadata.Labels, tc.namespace, tc.label[0], tc.label[1])
		}
		var data struct {
			Data map[string]string `yaml:"data"`
		}
		if err := cm.decode(&data); err != nil {
			t.Fatal(err)
		}
		if data.Data["csi-fastblk.json"] != string(want) {
			t.Errorf("%v: ConfigMap data differs from dashboards/csi-fastblk.json", tc.set)
		}
	}
}

// ruleExprs returns the PrometheusRule's expressions by alert name.
func ruleExprs(t *testing.T, objs []object) map[string]string {
	t.Helper()
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := one(t, objs, "PrometheusRule").decode(&rule); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			m[r.Alert] = r.Expr
		}
	}
	return m
}
