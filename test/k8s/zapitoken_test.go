package k8s

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// apiTokenLife is the plugin's API token lifetime the test sets: the
// least the API allows.
const apiTokenLife = 600

// TestAPITokenRenewal (make e2e-k8s-long, about 35 minutes): the plugin's
// own token for the Kubernetes API lives 10 minutes
// (plugin.apiTokenExpirationSeconds=600; the cluster's API server extends
// no token's life), and the kubelet renews it at 80% of that. 25 minutes
// after the plugin pods started, a VolumeAttributesClass change of a
// volume on the node that does not run the controller (the
// external-resizer's) still reaches it: the controller's plugin finds the
// volume's node from the API and forwards the call, and that node's
// plugin reviews the caller's
// token and reads the claim before it answers. A plugin that read its
// token once fails all three with 401 Unauthorized after 10 minutes.
// FASTBLK_K8S_TOKEN_WAIT (a Go duration, 25m by default) sets the wait.
func TestAPITokenRenewal(t *testing.T) {
	if os.Getenv("FASTBLK_K8S_LONG") != "1" {
		testgate.Skip(t, testgate.ClusterLong, "FASTBLK_K8S_LONG is not 1: this test takes half an hour (make e2e-k8s-long)")
	}
	wait := 25 * time.Minute
	if v := os.Getenv("FASTBLK_K8S_TOKEN_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FASTBLK_K8S_TOKEN_WAIT=%q: %v", v, err)
		}
		wait = d
	}
	c := requireChart(t)
	c.testNamespace(t)
	c.upgrade(t, "--set", fmt.Sprintf("plugin.apiTokenExpirationSeconds=%d", apiTokenLife),
		"--set", "volumeAttributesClasses[0].name=gold", "--set", "volumeAttributesClasses[0].maxIOPS=1000",
		"--set-string", "volumeAttributesClasses[0].maxBandwidth=100Mi")
	t.Cleanup(func() {
		if out, err := c.run("", "helm", "upgrade", release, chartDir(t), "--namespace", pluginNS, "--reuse-values",
			"--set", "plugin.apiTokenExpirationSeconds=3607", "--wait", "--timeout", "5m"); err != nil {
			t.Errorf("helm upgrade back to the default token lifetime: %v\n%s", err, out)
		}
	})
	c.waitPluginPods(t, 4*time.Minute)
	started := time.Now()

	first := map[string]apiToken{}
	for _, n := range nodes {
		tok := c.pluginAPIToken(t, n)
		if life := tok.Exp - tok.Iat; life != apiTokenLife {
			t.Fatalf("the plugin's API token on %s lives %d s, want %d", n, life, apiTokenLife)
		}
		first[n] = tok
	}
	_, leaderNode := c.resizerLeader(t)
	other := nodes[0]
	if other == leaderNode {
		other = nodes[1]
	}
	claim := "token-renewal"
	c.apply(t, pvc(claim, "64Mi", ""))
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "pod", claim, "--ignore-not-found", "--wait=true", "--timeout=120s")
		_, _ = c.kubectl("-n", testNS, "delete", "pvc", claim, "--ignore-not-found", "--wait=true", "--timeout=120s")
	})
	c.startPod(t, pod{name: claim, claim: claim, node: other, script: "sleep 3600"})
	c.waitPodPhase(t, claim, "Running", 2*time.Minute)

	for time.Since(started) < wait {
		time.Sleep(min(5*time.Minute, wait-time.Since(started)))
		t.Logf("%v since the plugin pods started", time.Since(started).Round(time.Second))
	}
	for _, n := range nodes {
		tok := c.pluginAPIToken(t, n)
		if tok.Iat == first[n].Iat {
			t.Errorf("the kubelet did not renew the plugin's API token on %s in %v", n, wait)
		}
		t.Logf("%s: the plugin's API token was issued %v ago (the first, %v ago)", n,
			time.Since(time.Unix(tok.Iat, 0)).Round(time.Second), time.Since(time.Unix(first[n].Iat, 0)).Round(time.Second))
	}
	if _, now := c.resizerLeader(t); now != leaderNode {
		t.Logf("the resizer's leader moved from %s to %s", leaderNode, now)
	}

	c.k(t, "-n", testNS, "patch", "pvc", claim, "--type=merge", "-p", `{"spec":{"volumeAttributesClassName":"gold"}}`)
	// The answer of the volume's own node, which names itself: the call
	// was forwarded and authorized (on the loop backend it refuses rate
	// limits, which is the answer this cluster can give).
	want := "on node " + other + ": rate limits (maxIOPS, maxBandwidth) need the ublk backend"
	eventually(t, 2*time.Minute, "the forwarded class change's answer on PVC "+claim, func() (bool, string) {
		ev, _ := c.kubectl("-n", testNS, "get", "events", "--field-selector", "involvedObject.kind=PersistentVolumeClaim,involvedObject.name="+claim,
			"-o", "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message", "--no-headers")
		for _, l := range strings.Split(ev, "\n") {
			if strings.Contains(l, "Modify") && strings.Contains(l, want) {
				t.Logf("answered after %v: %s", time.Since(started).Round(time.Second), strings.Join(strings.Fields(l), " "))
				return true, ""
			}
		}
		return false, "want an event saying " + want + "\nevents:\n" + ev
	})
	pods, _ := c.pluginPods(t)
	for _, n := range nodes {
		if l := grepLines(c.containerLog(t, pods[n]), "Unauthorized"); l != "" {
			t.Errorf("the plugin on %s was refused by the API server:\n%s", n, l)
		}
	}
}

// apiToken is what the test reads of a service account token's claims.
type apiToken struct {
	Iat, Exp int64
}

// pluginAPIToken reads the claims of the API token the plugin container
// on node sees now.
func (c *cluster) pluginAPIToken(t *testing.T, node string) apiToken {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/kubernetes.io/serviceaccount/token", c.pluginPID(t, node)))
	if err != nil {
		t.Fatalf("the plugin's API token on %s: %v", node, err)
	}
	parts := strings.Split(strings.TrimSpace(string(b)), ".")
	if len(parts) != 3 {
		t.Fatalf("the plugin's API token on %s is no JWT", node)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("the plugin's API token on %s: %v", node, err)
	}
	var tok apiToken
	if err := json.Unmarshal(payload, &struct {
		Iat *int64 `json:"iat"`
		Exp *int64 `json:"exp"`
	}{&tok.Iat, &tok.Exp}); err != nil {
		t.Fatalf("the plugin's API token on %s: %v", node, err)
	}
	return tok
}
