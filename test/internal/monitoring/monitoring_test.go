package monitoring

import (
	"slices"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`fastblk_healthy == 0`, []string{"fastblk_healthy"}},
		{`absent(up{job="csi-fastblk"} == 1)`, []string{"up"}},
		{`up{job={{ $job | quote }}} == 0`, []string{"up"}},
		{`fastblk_node_pids_headroom < {{ .pidsHeadroomMin }}`, []string{"fastblk_node_pids_headroom"}},
		{`histogram_quantile(0.99, sum by (node, le) (rate(fastblk_volume_io_latency_seconds_bucket{node=~"$node"}[$__rate_interval])))`,
			[]string{"fastblk_volume_io_latency_seconds_bucket"}},
		{`sum by (op) (rate(a_total{op=~"read|write"}[5m])) / on (op) group_left (x) sum without (le) (rate(b_total[5m]))`, []string{"a_total", "b_total"}},
		{`max by (state) (fastblk_volume_device_state{state!="live"}) == 1 and bool fastblk_x offset 5m`, []string{"fastblk_volume_device_state", "fastblk_x"}},
		{`label_values(fastblk_volume_size_bytes{node=~"$node"}, namespace)`, []string{"fastblk_volume_size_bytes"}},
		{`label_values(node)`, nil},
	} {
		if got := MetricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("MetricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
