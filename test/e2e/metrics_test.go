package e2e

import (
	"net/http"
	"testing"

	"github.com/fastblk/csi-fastblk/test/internal/monitoring"
)

// TestConditionalFamilies proves that the families test/plugin accepts
// unseen in the chart's dashboard and alerts (monitoring.Conditional:
// served only for ublk devices, rate-limited volumes or under a pids
// limit) are served by a ublk plugin in those conditions: a plugin in a
// pids-limited cgroup with a rate-limited volume that did I/O shows every
// one of them on /metrics.
func TestConditionalFamilies(t *testing.T) {
	requireVM(t)
	_, fd := pidsCgroup(t, 4000)
	p := newPluginIn(t, fd)
	v := p.provision("families", 32<<20, blockCap(), map[string]string{"maxIOPS": "100000", "maxBandwidth": "1Gi"})
	fill(t, p.devLink(v), 1<<20)
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams, err := monitoring.Families(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for name, when := range monitoring.Conditional {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s (served for %s) is not on /metrics of a ublk plugin under a pids limit with a rate-limited volume", name, when)
		}
	}
}
