package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The nodes' device classes (hack/k8s/node.sh mounts an xfs and an ext4
// disk of 512 MiB in each node's mount namespace, below classDir), which
// installChart configures with a StorageClass each.
const classDir = "/var/lib/fastblk-classes"

var classDisks = []string{"xfs", "ext4"}

func classStorageClass(fs string) string { return "fastblk-class-" + fs }

// inNode runs a command in node's mount namespace (where its device-class
// disks are mounted) and returns its output.
func (c *cluster) inNode(t *testing.T, node string, args ...string) string {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(c.work, "pids", "node-"+node))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nsenter", append([]string{"-t", strings.TrimSpace(string(pid)), "-m", "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("on node %s: %s: %v\n%s", node, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestDeviceClasses: two device classes on each node, on an xfs and an
// ext4 disk, with a StorageClass each. Each node publishes each class's own
// capacity (kubectl get csistoragecapacities); a claim of each class lands
// in its class's directory, on its disk, and the plugin's status names
// the class; filling one class on a node leaves the other schedulable
// there, while a claim of the full class waits for storage.
func TestDeviceClasses(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	caps := map[string]map[string]int64{}
	eventually(t, 2*time.Minute, "each class's capacity on each node", func() (bool, string) {
		for _, fs := range classDisks {
			m, err := c.capacitiesOf(classStorageClass(fs))
			if err != nil {
				return false, err.Error()
			}
			caps[fs] = m
			for _, n := range nodes {
				// The class's 512 MiB disk, not the data directory's.
				if m[n] < 256<<20 || m[n] > 512<<20 {
					return false, fmt.Sprintf("%s: %v", fs, caps)
				}
			}
		}
		return true, ""
	})
	t.Logf("kubectl get csistoragecapacities:\n%s", c.k(t, "-n", pluginNS, "get", "csistoragecapacities",
		"-o", "custom-columns=CLASS:.storageClassName,NODE:.nodeTopology.matchLabels.topology\\.fastblk\\.csi\\.io/node,CAPACITY:.capacity"))

	t.Run("a claim of each class lands in its directory", func(t *testing.T) {
		for _, fs := range classDisks {
			claim := "dc-" + fs
			c.apply(t, pvc(claim, "64Mi", "  storageClassName: "+classStorageClass(fs)+"\n"))
			c.startPod(t, pod{name: claim, claim: claim, node: "n1", restartNever: true, script: "echo " + fs + " > /data/f && cat /data/f"})
		}
		for _, fs := range classDisks {
			claim := "dc-" + fs
			c.waitPodPhase(t, claim, "Succeeded", 3*time.Minute)
			handle := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", claim))
			if !strings.HasSuffix(handle, "."+fs+".n1") {
				t.Errorf("claim %s: volume handle %s does not name its class %s", claim, handle, fs)
			}
			file := classDir + "/" + fs + "/volumes/" + handle[:33] + ".img"
			if got := c.inNode(t, "n1", "stat", "-f", "-c", "%T", file); got != map[string]string{"xfs": "xfs", "ext4": "ext2/ext3"}[fs] {
				t.Errorf("claim %s: %s is on a %s filesystem", claim, file, got)
			}
			var class string
			for _, v := range c.nodeStatus(t, "n1").Volumes {
				if v.ID == handle[:33] {
					class = v.Class
				}
			}
			if class != fs {
				t.Errorf("claim %s: status says class %q, want %s", claim, class, fs)
			}
		}
		var served []string
		for _, cl := range c.nodeStatus(t, "n1").Classes {
			served = append(served, cl.Name+"="+cl.Path)
		}
		if got, want := strings.Join(served, " "), "default=/var/lib/csi-fastblk ext4="+classDir+"/ext4 xfs="+classDir+"/xfs"; got != want {
			t.Errorf("status classes %s, want %s", got, want)
		}
		c.delete(t, "pod", "dc-xfs", "dc-ext4")
		c.delete(t, "pvc", "dc-xfs", "dc-ext4")
	})

	t.Run("filling one class leaves the other schedulable", func(t *testing.T) {
		full, other := classDisks[0], classDisks[1]
		now, err := c.capacitiesOf(classStorageClass(full))
		if err != nil {
			t.Fatal(err)
		}
		size := (now["n2"] - 16<<20) >> 20 // MiB, a little short of it all
		c.apply(t, pvc("dc-fill", fmt.Sprintf("%dMi", size), "  storageClassName: "+classStorageClass(full)+"\n"))
		c.startPod(t, pod{name: "dc-fill", claim: "dc-fill", node: "n2", script: "sleep 3600"})
		c.waitPodPhase(t, "dc-fill", "Running", 3*time.Minute)
		eventually(t, 2*time.Minute, full+" full on n2", func() (bool, string) {
			m, err := c.capacitiesOf(classStorageClass(full))
			return err == nil && m["n2"] < 32<<20, fmt.Sprintf("%v %v", m, err)
		})
		for _, fs := range []string{full, other} {
			c.apply(t, pvc("dc-more-"+fs, "64Mi", "  storageClassName: "+classStorageClass(fs)+"\n"))
			c.startPod(t, pod{name: "dc-more-" + fs, claim: "dc-more-" + fs, node: "n2", restartNever: true, script: "echo ok > /data/f"})
		}
		c.waitPodPhase(t, "dc-more-"+other, "Succeeded", 3*time.Minute)
		eventually(t, 2*time.Minute, "the scheduler to say the full class has no room", func() (bool, string) {
			ev := c.describe("dc-more-" + full)
			return strings.Contains(ev, "did not have enough free storage"), ev
		})
		if phase := c.jsonpath(t, "{.status.phase}", "-n", testNS, "get", "pvc", "dc-more-"+full); phase != "Pending" {
			t.Errorf("a claim of the full class %s on n2 is %s", full, phase)
		}
		c.delete(t, "pod", "dc-fill", "dc-more-"+full, "dc-more-"+other)
		c.delete(t, "pvc", "dc-fill", "dc-more-"+full, "dc-more-"+other)
	})
	eventually(t, 2*time.Minute, "the classes' volumes to go", func() (bool, string) {
		pvs, _ := c.kubectl("get", "pv", "-o", "jsonpath={.items[*].spec.storageClassName}")
		return !strings.Contains(pvs, "fastblk-class-"), pvs
	})
	if devs := loopDevicesUnder(t, c.work); len(devs) > 0 {
		t.Errorf("loop devices left attached to volume files: %v", devs)
	}
}

// TestBackendInPlainSight: the harness's nodes have no ublk_drv (the
// machine's kernel has none and loads no modules), so each plugin serves
// loop and says why where kubectl shows it: the Node's backend label and
// reason annotation (with NOTES.txt's own command) and a Warning event on
// the Node; fastblk_backend_fallback counts it, and the chart's alert on it
// fires (its expression evaluated by promtool over the plugin's real
// metrics). A StorageClass with rate limits, which a loop node cannot
// enforce, gets no capacity, and says why in events on the class and on
// its pending claim. The node account, whose token every node holds, may
// change no other node's label, nor other labels of its own.
func TestBackendInPlainSight(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	label, annotation := driver+"/backend", driver+"/backend-reason"
	esc := func(k string) string { return strings.ReplaceAll(k, ".", "\\.") }
	for _, n := range nodes {
		eventually(t, time.Minute, "node "+n+"'s backend label", func() (bool, string) {
			out, err := c.kubectl("get", "node", n, "-o", "jsonpath={.metadata.labels."+esc(label)+"}")
			return err == nil && strings.TrimSpace(out) == "loop", out
		})
		why := c.jsonpath(t, "{.metadata.annotations."+esc(annotation)+"}", "get", "node", n)
		if !strings.HasPrefix(why, "ublk_absent: ") || !strings.Contains(why, "ublk_drv") {
			t.Errorf("node %s: %s is %q, want the reason ublk_absent and the kernel's lack of ublk_drv", n, annotation, why)
		}
		ev := c.k(t, "get", "events", "-A", "--field-selector", "involvedObject.kind=Node,involvedObject.name="+n+",reason=BackendFallback",
			"-o", "custom-columns=TYPE:.type,MESSAGE:.message", "--no-headers")
		if !strings.Contains(ev, "Warning") || !strings.Contains(ev, "ublk_drv") {
			t.Errorf("node %s: BackendFallback events %q", n, ev)
		}
	}

	t.Run("NOTES.txt's command", func(t *testing.T) {
		out, err := c.run("", "helm", "get", "notes", release, "--namespace", pluginNS)
		if err != nil {
			t.Fatal(err)
		}
		var cmd string
		for _, l := range strings.Split(out, "\n") {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "kubectl get nodes -o custom-columns=") {
				cmd = l
			}
		}
		if cmd == "" {
			t.Fatalf("NOTES.txt has no kubectl get nodes command:\n%s", out)
		}
		args := strings.Fields(strings.TrimPrefix(cmd, "kubectl "))
		for i := range args {
			args[i] = strings.Trim(args[i], "'") // as the shell would
		}
		table := c.k(t, args...)
		t.Logf("%s\n%s", cmd, table)
		for _, n := range nodes {
			if !lineWithAll(table, n, "loop", "ublk_absent:") {
				t.Errorf("%s shows no loop backend and reason for %s:\n%s", cmd, n, table)
			}
		}
	})

	t.Run("the alert fires", func(t *testing.T) {
		metrics := c.k(t, "get", "--raw", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:9811/proxy/metrics", pluginNS, c.pluginPod(t, "n1")))
		if v, ok := sample(metrics, "fastblk_backend_fallback", `reason="ublk_absent"`); !ok || v != 1 {
			t.Fatalf("fastblk_backend_fallback{reason=\"ublk_absent\"} = %v (found %v) in:\n%s", v, ok, grepLines(metrics, "fastblk_"))
		}
		c.alertFires(t, "FastblkBackendFallback", metrics, map[string]string{"job": release, "instance": "n1", "node": "n1"})
	})

	t.Run("a rate-limited class on loop nodes says why it has no capacity", func(t *testing.T) {
		const class = "fastblk-capped"
		c.apply(t, pvc("capped", "64Mi", "  storageClassName: "+class+"\n"))
		t.Cleanup(func() { c.delete(t, "pvc", "capped") })
		c.storageClass(t, class, "maxIOPS: \"1000\"")
		for _, kind := range []string{"StorageClass," + "involvedObject.name=" + class, "PersistentVolumeClaim,involvedObject.name=capped"} {
			eventually(t, 2*time.Minute, "a NoCapacity event on the "+kind, func() (bool, string) {
				ev, err := c.kubectl("get", "events", "-A", "--field-selector", "reason=NoCapacity,involvedObject.kind="+kind,
					"-o", "custom-columns=MESSAGE:.message", "--no-headers")
				return err == nil && strings.Contains(ev, "offers no capacity") && strings.Contains(ev, "rate limits") &&
					strings.Contains(ev, "ublk_absent"), ev
			})
		}
		if caps, err := c.capacitiesOf(class); err != nil || caps["n1"] != 0 || caps["n2"] != 0 {
			t.Errorf("capacities of %s: %v, %v; want none on loop nodes", class, caps, err)
		}
	})

	t.Run("the node account labels only its own node's backend", func(t *testing.T) {
		kubeconfig := c.pluginKubeconfig(t, "n1")
		for _, tc := range []struct{ name, node, label, says string }{
			{"another node's backend", "n2", label + "=ublk", "may change only its own Node"},
			{"another label of its own node", "n1", "example.com/pool=x", "may change only the labels " + label},
		} {
			out, err := c.kubectl("--kubeconfig", kubeconfig, "label", "node", tc.node, tc.label, "--overwrite")
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%s: %v %s, want a refusal saying %q", tc.name, err, out, tc.says)
			}
		}
		if _, err := c.kubectl("--kubeconfig", kubeconfig, "label", "node", "n1", label+"=loop", "--overwrite"); err != nil {
			t.Errorf("its own backend label: %v", err)
		}
	})
}

// lineWithAll reports whether a line of text has every one of words.
func lineWithAll(text string, words ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		ok := len(f) > 0
		for _, w := range words {
			found := false
			for _, x := range f {
				found = found || x == w
			}
			ok = ok && found
		}
		if ok {
			return true
		}
	}
	return false
}

// pluginPod is the name of node's Ready plugin pod.
func (c *cluster) pluginPod(t *testing.T, node string) string {
	t.Helper()
	ready, detail := c.pluginPods(t)
	if ready[node] == "" {
		t.Fatalf("no Ready plugin pod on %s:%s", node, detail)
	}
	return ready[node]
}

// pluginKubeconfig is a kubeconfig that reaches the API server as node's
// plugin does: with its pod's own token (projected, bound to the pod).
func (c *cluster) pluginKubeconfig(t *testing.T, node string) string {
	t.Helper()
	tok, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/kubernetes.io/serviceaccount/token", c.pluginPID(t, node)))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "plugin.kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {certificate-authority: %s, server: "https://127.0.0.1:6443"}}]
users: [{name: plugin, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: plugin}}]
current-context: e2e
`, filepath.Join(c.work, "pki", "ca.crt"), strings.TrimSpace(string(tok)))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// alertFires evaluates, with promtool, the expression of the chart's alert
// on the samples of a plugin's /metrics, labelled as the chart's PodMonitor
// labels its targets: each sample the expression keeps must come out
// (the alert fires for it), and none from metrics without its families (a
// node where it does not fire).
func (c *cluster) alertFires(t *testing.T, alert, metrics string, target map[string]string) {
	t.Helper()
	promtool := os.Getenv("FASTBLK_PROMTOOL")
	if promtool == "" {
		promtool = "/var/cache/csi-fastblk-k8s/bin/promtool"
	}
	// helm template checks the chart's kubeVersion against its own
	// default (v1.20) unless told the cluster's.
	version := c.jsonpath(t, "{.status.nodeInfo.kubeletVersion}", "get", "node", nodes[0])
	manifest, err := c.run("", "helm", "template", release, chartDir(t), "--namespace", pluginNS, "--kube-version", version,
		"--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Name  string           `yaml:"name"`
				Rules []map[string]any `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &rule); err != nil {
		t.Fatal(err)
	}
	var expr string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r["alert"] == alert {
				expr, _ = r["expr"].(string)
			}
		}
	}
	if expr == "" {
		t.Fatalf("the chart's PrometheusRule has no alert %s", alert)
	}
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	series, want := promSeries(t, metrics, target, expr)
	if len(want) == 0 {
		t.Fatalf("no sample of the metrics %s reads in:\n%s", expr, grepLines(metrics, "fastblk_"))
	}
	test := map[string]any{
		"rule_files":          []string{"rules.yaml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": series,
			"promql_expr_test": []any{map[string]any{
				"expr": expr, "eval_time": "15m", "exp_samples": want,
			}},
		}, map[string]any{
			// Where the families are absent (a node that serves ublk),
			// the expression keeps nothing.
			"interval":         "1m",
			"input_series":     []any{map[string]any{"series": `fastblk_healthy{instance="n2"}`, "values": "1x20"}},
			"promql_expr_test": []any{map[string]any{"expr": expr, "eval_time": "15m", "exp_samples": []any{}}},
		}},
	}
	b, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", filepath.Join(dir, "test.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules (%s):\n%s\n%s", expr, out, b)
	}
	t.Logf("promtool: %s fires: %s", alert, strings.TrimSpace(string(out)))
}

// promSeries turns the samples of the families expr names in metrics into
// promtool input series (each sample constant for 20 minutes), labelled
// with target, and the samples expr is expected to keep: those with value
// 1 (the alerts on these families compare with 1).
func promSeries(t *testing.T, metrics string, target map[string]string, expr string) (series, want []any) {
	t.Helper()
	names := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`).FindAllString(expr, -1)
	for _, l := range strings.Split(metrics, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, rest, _ := strings.Cut(l, "{")
		labels, value := "", ""
		if rest != "" {
			labels, value, _ = strings.Cut(rest, "} ")
		} else {
			name, value, _ = strings.Cut(l, " ")
		}
		if !slices.Contains(names, name) {
			continue
		}
		var all []string
		if labels != "" {
			all = append(all, labels)
		}
		for k, v := range target {
			all = append(all, fmt.Sprintf("%s=%q", k, v))
		}
		s := name + "{" + strings.Join(all, ",") + "}"
		series = append(series, map[string]any{"series": s, "values": strings.TrimSpace(value) + "x20"})
		if strings.TrimSpace(value) == "1" {
			want = append(want, map[string]any{"labels": s, "value": 1})
		}
	}
	return series, want
}
