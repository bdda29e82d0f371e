package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPrometheusRule checks the opt-in alerts: absent by default and with
// metrics off, present with the extra labels and thresholds when enabled,
// every expression naming a metric the plugin exports, and the Prometheus
// templates in annotations left for Prometheus (not eaten by Helm).
func TestPrometheusRule(t *testing.T) {
	if n := len(find(render(t), "PrometheusRule")); n != 0 {
		t.Errorf("default render has %d PrometheusRules, want none (opt-in)", n)
	}
	if n := len(find(render(t, "metrics.prometheusRule.enabled=true", "metrics.enabled=false"), "PrometheusRule")); n != 0 {
		t.Errorf("metrics off: %d PrometheusRules, want none", n)
	}
	o := one(t, render(t, "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom",
		"metrics.prometheusRule.pidsHeadroomMin=77"), "PrometheusRule")
	if o.Metadata.Labels["release"] != "prom" || o.Metadata.Namespace != "csi-fastblk" {
		t.Errorf("labels %v, namespace %q; want release=prom in csi-fastblk", o.Metadata.Labels, o.Metadata.Namespace)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string            `yaml:"alert"`
					Expr        string            `yaml:"expr"`
					Annotations map[string]string `yaml:"annotations"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := o.decode(&rule); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "pkg", "metrics", "collector.go"))
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`fastblk_[a-z_]+`)
	alerts := map[string]string{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
			for _, m := range metric.FindAllString(r.Expr, -1) {
				// The collector names each family ns+"_<rest>" with ns "fastblk".
				if !strings.Contains(string(src), `ns+"`+strings.TrimPrefix(m, "fastblk")+`"`) {
					t.Errorf("%s: %s is not a metric pkg/metrics exports", r.Alert, m)
				}
			}
			// absent() has neither labels nor a value worth showing.
			templated := strings.Contains(r.Annotations["summary"], "{{ $labels.") || strings.Contains(r.Annotations["summary"], "{{ $value")
			if !templated && !strings.HasPrefix(r.Expr, "absent(") {
				t.Errorf("%s: summary %q lost its Prometheus template", r.Alert, r.Annotations["summary"])
			}
		}
	}
	for _, a := range []string{"FastblkPluginDown", "FastblkPluginAbsent", "FastblkPluginUnhealthy", "FastblkVolumeIOErrors", "FastblkDeviceNotLive",
		"FastblkDeviceFailingIO", "FastblkPidsHeadroomLow", "FastblkNodeCapacityLow", "FastblkBackendFallback", "FastblkDeviceClassUnavailable"} {
		if _, ok := alerts[a]; !ok {
			t.Errorf("alert %s missing (have %v)", a, alerts)
		}
	}
	if e := alerts["FastblkPidsHeadroomLow"]; !strings.HasSuffix(strings.TrimSpace(e), "< 77") {
		t.Errorf("FastblkPidsHeadroomLow expr %q, want the pidsHeadroomMin value 77", e)
	}
}
