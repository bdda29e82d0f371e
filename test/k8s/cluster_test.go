package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastblk/csi-fastblk/internal/testgate"
	fbdriver "github.com/fastblk/csi-fastblk/pkg/driver"
)

const (
	release   = "csi-fastblk"
	pluginNS  = "csi-fastblk"
	testNS    = "e2e"
	driver    = "fastblk.csi.io"
	topoKey   = "topology.fastblk.csi.io/node"
	busybox   = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	chartPath = "../../charts/csi-fastblk"
)

var nodes = []string{"n1", "n2"}

// cluster runs kubectl and helm against the harness's cluster through
// hack/k8s/cluster.sh (the API server lives in a network namespace).
type cluster struct {
	script string // hack/k8s/cluster.sh
	work   string // $K8S_WORK: nodes' directories, pids
}

// installed is set once the chart is installed (TestHelmInstall, or the
// first test that needs it when E2E_K8S_RUN leaves TestHelmInstall out);
// after a failed install later tests fail at once rather than time out one
// by one.
var installed, installTried bool

func requireCluster(t *testing.T) *cluster {
	t.Helper()
	script := os.Getenv("FASTBLK_K8S")
	if script == "" {
		testgate.Skip(t, testgate.Cluster, "FASTBLK_K8S is not set: these tests run on the cluster of hack/k8s/e2e.sh (make e2e-k8s)")
	}
	work := os.Getenv("K8S_WORK")
	if work == "" {
		work = "/var/lib/csi-fastblk-k8s"
	}
	return &cluster{script: script, work: work}
}

// requireChart is requireCluster for the tests that need the chart
// installed: it installs it when no test did yet, so that each test runs
// alone (each makes the claims it uses).
func requireChart(t *testing.T) *cluster {
	t.Helper()
	c := requireCluster(t)
	if !installTried {
		c.installChart(t)
		c.waitPluginPods(t, 4*time.Minute)
		c.testNamespace(t)
		installed = !t.Failed()
	}
	if !installed {
		t.Fatal("the chart is not installed (its install failed)")
	}
	return c
}

// installChart installs the chart as the chart README says: a namespace
// that admits privileged pods, then the chart, with the snapshot-controller
// the cluster lacks (the CRDs come from the chart's crds/) and its class as
// the default, and the nodes' two device classes (the xfs and ext4 disks
// node.sh mounts) with a StorageClass each.
func (c *cluster) installChart(t *testing.T) {
	t.Helper()
	installTried = true
	c.pluginNamespace(t)
	out, err := c.run("", "helm", append([]string{"install", release, chartDir(t), "--namespace", pluginNS}, testInstallValues()...)...)
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Logf("helm install:\n%s", firstLines(out, 8))
}

// testInstallValues are the --set flags of every test install of the
// chart: the snapshot-controller, the default StorageClass, and the nodes'
// device classes with a StorageClass each. A test that uninstalls and
// reinstalls the chart uses them too, so the tests after it find the
// cluster as installChart left it.
func testInstallValues() []string {
	args := []string{"--set", "snapshotController.install=true", "--set", "storageClass.isDefault=true"}
	for i, fs := range classDisks {
		args = append(args, "--set", fmt.Sprintf("deviceClasses[%d].name=%s,deviceClasses[%d].path=%s", i, fs, i, classDir+"/"+fs),
			"--set", fmt.Sprintf("storageClasses[%d].name=%s,storageClasses[%d].deviceClass=%s", i, classStorageClass(fs), i, fs))
	}
	return args
}

// run runs cluster.sh TOOL ARGS with stdin, returning stdout; the error
// carries stderr.
func (c *cluster) run(stdin, tool string, args ...string) (string, error) {
	cmd := exec.Command(c.script, append([]string{tool}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (c *cluster) kubectl(args ...string) (string, error) { return c.run("", "kubectl", args...) }

// k runs kubectl and fails the test on error.
func (c *cluster) k(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply creates or updates the objects of a manifest, failing on unknown or
// duplicate fields (the API server's strict field validation).
func (c *cluster) apply(t *testing.T, manifest string) {
	t.Helper()
	if out, err := c.run(manifest, "kubectl", "apply", "--validate=strict", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s\nmanifest:\n%s", err, out, manifest)
	}
}

// jsonpath reads one field of an object ("" when it is absent).
func (c *cluster) jsonpath(t *testing.T, path string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(c.k(t, append(args, "-o", "jsonpath="+path)...))
}

// eventually polls check every second until it reports done or timeout
// passes, then fails with what the last check said.
func eventually(t *testing.T, timeout time.Duration, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, detail := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, detail)
		}
		time.Sleep(time.Second)
	}
}

// waitPodPhase waits for a pod in testNS to reach phase, failing at once
// when it reaches the other terminal phase.
func (c *cluster) waitPodPhase(t *testing.T, pod, phase string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "pod "+pod+" "+phase, func() (bool, string) {
		out, err := c.kubectl("-n", testNS, "get", "pod", pod, "-o", "jsonpath={.status.phase}")
		if err != nil {
			return false, err.Error()
		}
		got := strings.TrimSpace(out)
		if got != phase && (got == "Failed" || got == "Succeeded") {
			t.Fatalf("pod %s is %s, want %s:\n%s", pod, got, phase, c.describe(pod))
		}
		return got == phase, "phase " + got + "\n" + c.describe(pod)
	})
}

// describe is a pod's events and logs, for failure messages.
func (c *cluster) describe(pod string) string {
	ev, _ := c.kubectl("-n", testNS, "get", "events", "--field-selector", "involvedObject.name="+pod,
		"-o", "custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers")
	logs, _ := c.kubectl("-n", testNS, "logs", pod, "--tail=20")
	return "events:\n" + ev + "logs:\n" + logs
}

// logs is a pod's output.
func (c *cluster) logs(t *testing.T, pod string) string {
	t.Helper()
	return c.k(t, "-n", testNS, "logs", pod)
}

// deletePods deletes pods in testNS and waits until they are gone.
func (c *cluster) delete(t *testing.T, kind string, names ...string) {
	t.Helper()
	args := append([]string{"-n", testNS, "delete", kind, "--ignore-not-found", "--wait=true", "--timeout=180s"}, names...)
	c.k(t, args...)
}

// nodeDir is a node's directory on the host (its /var/lib/csi-fastblk is
// nodeDir/data).
func (c *cluster) nodeDir(node string) string { return filepath.Join(c.work, node) }

// nodeMounts is the mount table of a node's mount namespace.
func (c *cluster) nodeMounts(t *testing.T, node string) string {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(c.work, "pids", "node-"+node))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nsenter", "-t", strings.TrimSpace(string(pid)), "-m", "cat", "/proc/self/mountinfo").Output()
	if err != nil {
		t.Fatalf("mounts of node %s: %v", node, err)
	}
	return string(out)
}

// pod is a busybox pod in testNS running script with the PVC claim at
// /data (or, with block, as the device /dev/xvda), and the claim extra, if
// any, at /log.
type pod struct {
	name, claim, script, node string
	extra                     string
	prefer                    string // a node the scheduler should prefer
	block                     bool
	fsGroup                   int
	restartNever              bool
}

func (p pod) manifest() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: %s
`, p.name, testNS, map[bool]string{true: "Never", false: "Always"}[p.restartNever])
	if p.node != "" {
		fmt.Fprintf(&b, "  nodeSelector: {kubernetes.io/hostname: %s}\n", p.node)
	}
	if p.prefer != "" {
		fmt.Fprintf(&b, `  affinity:
    nodeAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%s]}]}
`, p.prefer)
	}
	if p.fsGroup != 0 {
		fmt.Fprintf(&b, "  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: %d}\n", p.fsGroup)
	}
	fmt.Fprintf(&b, `  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, busybox, p.script)
	switch {
	case p.block:
		b.WriteString("    volumeDevices: [{name: v, devicePath: /dev/xvda}]\n")
	case p.extra != "":
		b.WriteString("    volumeMounts: [{name: v, mountPath: /data}, {name: x, mountPath: /log}]\n")
	default:
		b.WriteString("    volumeMounts: [{name: v, mountPath: /data}]\n")
	}
	fmt.Fprintf(&b, "  volumes:\n  - {name: v, persistentVolumeClaim: {claimName: %s}}\n", p.claim)
	if p.extra != "" {
		fmt.Fprintf(&b, "  - {name: x, persistentVolumeClaim: {claimName: %s}}\n", p.extra)
	}
	return b.String()
}

// startPod creates p and deletes it when the test ends, so that a failed
// test leaves no pod holding a volume for the next ones.
func (c *cluster) startPod(t *testing.T, p pod) {
	t.Helper()
	c.apply(t, p.manifest())
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "pod", p.name, "--ignore-not-found", "--wait=true", "--timeout=120s")
	})
}

// pvc is a PersistentVolumeClaim manifest in testNS; class "" means the
// default StorageClass, extra is appended to spec (a dataSource, ...).
func pvc(name, size, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: %s}}
%s`, name, testNS, size, extra)
}

// volumeNode is the node a bound PVC's volume lives on (the PV's node
// affinity on the driver's topology key).
func (c *cluster) volumeNode(t *testing.T, claim string) string {
	t.Helper()
	pv := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", claim)
	if pv == "" {
		t.Fatalf("PVC %s is not bound", claim)
	}
	n := c.jsonpath(t, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}", "get", "pv", pv)
	if n == "" {
		t.Fatalf("PV %s of PVC %s has no node affinity", pv, claim)
	}
	return n
}

// waitLog waits for a running pod's log to contain s.
func (c *cluster) waitLog(t *testing.T, pod, s string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "pod "+pod+" to log "+s, func() (bool, string) {
		out, err := c.kubectl("-n", testNS, "logs", pod)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, s), out + "\n" + c.describe(pod)
	})
}

// claimEvents are a PVC's events, oldest first.
func (c *cluster) claimEvents(claim string) string {
	ev, err := c.kubectl("-n", testNS, "get", "events", "--sort-by=.lastTimestamp",
		"--field-selector", "involvedObject.kind=PersistentVolumeClaim,involvedObject.name="+claim,
		"-o", "custom-columns=REASON:.reason,COUNT:.count,FROM:.source.component,MESSAGE:.message", "--no-headers")
	if err != nil {
		return err.Error()
	}
	return ev
}

// nodeStatus is `csi-fastblk status --json` in node's plugin container.
func (c *cluster) nodeStatus(t *testing.T, node string) fbdriver.NodeStatus {
	t.Helper()
	st, err := c.nodeStatusErr(node)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (c *cluster) nodeStatusErr(node string) (fbdriver.NodeStatus, error) {
	var st fbdriver.NodeStatus
	out, err := c.kubectl("-n", pluginNS, "get", "pods", "-l", "app.kubernetes.io/component=node",
		"--field-selector", "spec.nodeName="+node+",status.phase=Running", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil || strings.TrimSpace(out) == "" {
		return st, fmt.Errorf("no running plugin pod on %s: %v", node, err)
	}
	raw, err := c.kubectl("-n", pluginNS, "exec", strings.TrimSpace(out), "-c", "csi-fastblk", "--", "csi-fastblk", "status", "--json")
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", node, err)
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return st, fmt.Errorf("status of %s: %w: %q", node, err, raw)
	}
	return st, nil
}

// pluginPID is the host's PID of node's plugin process: `csi-fastblk
// serve --node-id=<node>` in the cgroup of node's plugin pod (the nodes'
// containers share the host's PID namespace).
func (c *cluster) pluginPID(t *testing.T, node string) int {
	t.Helper()
	ready, detail := c.pluginPods(t)
	if ready[node] == "" {
		t.Fatalf("no ready plugin pod on %s:%s", node, detail)
	}
	uid := c.jsonpath(t, "{.metadata.uid}", "-n", pluginNS, "get", "pod", ready[node])
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err1 := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, err2 := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err1 != nil || err2 != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "csi-fastblk" && args[1] == "serve" &&
			slices.Contains(args, "--node-id="+node) &&
			(strings.Contains(string(cg), uid) || strings.Contains(string(cg), strings.ReplaceAll(uid, "-", "_"))) {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("want one plugin process of pod %s (uid %s) on %s, found %v", ready[node], uid, node, pids)
	}
	return pids[0]
}

// noVolumesWithoutPV fails for a volume on node, in its data directory or
// in its plugin's status, that no PV holds (a copy's remains).
func (c *cluster) noVolumesWithoutPV(t *testing.T, node string) {
	t.Helper()
	held := map[string]bool{}
	out := c.k(t, "get", "pv", "-o", `jsonpath={range .items[*]}{.spec.csi.volumeHandle}{"\n"}{end}`)
	for _, h := range strings.Fields(out) {
		if id, ok := strings.CutSuffix(h, "-"+node); ok {
			held[id] = true
		}
	}
	ents, err := os.ReadDir(filepath.Join(c.nodeDir(node), "data", "volumes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".img"); !ok || !held[id] {
			t.Errorf("node %s: volumes/%s belongs to no PV", node, e.Name())
		}
	}
	st := c.nodeStatus(t, node)
	for _, v := range st.Volumes {
		if !held[v.ID] {
			t.Errorf("node %s lists volume %s (%s), which no PV holds", node, v.ID, v.Name)
		}
	}
	if len(st.Pulls) > 0 {
		t.Errorf("node %s still copies: %+v", node, st.Pulls)
	}
}

// writtenSnapshot makes claim (size, the default class) on node, runs
// script on it in a pod there, and takes VolumeSnapshot snap of it.
func (c *cluster) writtenSnapshot(t *testing.T, snap, claim, size, node, script string) {
	t.Helper()
	c.apply(t, pvc(claim, size, ""))
	w := "w-" + claim
	c.startPod(t, pod{name: w, claim: claim, node: node, restartNever: true, script: script})
	c.waitPodPhase(t, w, "Succeeded", 2*time.Minute)
	c.delete(t, "pod", w)
	c.snapshotClaim(t, snap, claim)
}

// snapshotClaim takes VolumeSnapshot snap of claim in the chart's class
// and waits until it is ready, with the README's kubectl wait.
func (c *cluster) snapshotClaim(t *testing.T, snap, claim string) {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec: {volumeSnapshotClassName: fastblk, source: {persistentVolumeClaimName: %s}}
`, snap, testNS, claim))
	c.k(t, "-n", testNS, "wait", "volumesnapshot/"+snap, "--for=jsonpath={.status.readyToUse}=true", "--timeout=2m")
}

// objectFile is the data directory's ID of node's volume or snapshot
// (sub "volumes" or "snapshots") of CSI handle, and its file on the host.
func (c *cluster) objectFile(node, sub, handle string) (id, file string) {
	id = strings.TrimSuffix(handle, "-"+node)
	return id, filepath.Join(c.nodeDir(node), "data", sub, id+".img")
}

// waitGone waits for a cluster-scoped object to be deleted.
func (c *cluster) waitGone(t *testing.T, kind, name string) {
	t.Helper()
	eventually(t, 2*time.Minute, kind+" "+name+" to go", func() (bool, string) {
		out, err := c.kubectl("get", kind, name, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", out
	})
}

// storageClass makes StorageClass name of the driver, binding at the first
// consumer, with params ("key: value, ..."), and deletes it when the test
// ends.
func (c *cluster) storageClass(t *testing.T, name, params string) {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: %s
volumeBindingMode: WaitForFirstConsumer
parameters: {%s}
`, name, driver, params))
	t.Cleanup(func() { _, _ = c.kubectl("delete", "storageclass", name, "--ignore-not-found") })
}
