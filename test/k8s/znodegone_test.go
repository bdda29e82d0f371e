package k8s

// This file's name sorts after userpath_test.go on purpose (doc.go): its
// test runs after TestCleanup, takes node n2 away and brings it back, and
// removes what it made.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const annRelease = "fastblk.csi.io/release-on-node-deletion"

// statefulSet is a StatefulSet of one busybox pod in testNS whose claim
// "data" (of class) keeps a file: the pod writes "new" into it unless it
// holds something already, prints it, and sleeps.
func statefulSet(name, class string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 1
  serviceName: %[1]s
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: %[3]s
        imagePullPolicy: Never
        command: ["sh", "-c", "[ -s /data/f ] || echo new > /data/f; echo holds $(cat /data/f); sleep 3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: %[4]s
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 64Mi}}
`, name, testNS, busybox, class)
}

// TestNodeGoneReleasesClaims is issue 52's "node gone for good" on the
// cluster. Two StatefulSets have their claim on n2, holding "old": rel's
// in a StorageClass annotated to release claims of deleted nodes, keep's
// in the chart's class (the chart's default: off). While Node n2 exists,
// the controller's account may not delete rel's claim (its admission
// policy). Then n2's kubelet stops and its Node object is deleted: rel's
// claim is released, its PV kept (Released, Retain, annotated), and its
// pod runs on n1 with a new volume ("new"); keep's claim stays bound to
// n2's volume and says so in an event. n2 comes back: keep's pod runs
// there again with its data ("old"), and n2's plugin says (status, log,
// an event on the PV) that it keeps rel's old volume, which the test
// then removes as docs/node-loss.md says (reclaim policy Delete).
func TestNodeGoneReleasesClaims(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	stays, gone := nodes[0], nodes[1]
	c.apply(t, fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fastblk-release
  annotations: {%q: "true"}
provisioner: %s
volumeBindingMode: WaitForFirstConsumer
`, annRelease, driver))
	t.Cleanup(func() { _, _ = c.kubectl("delete", "storageclass", "fastblk-release", "--ignore-not-found") })
	sets := map[string]string{"rel": "fastblk-release", "keep": "fastblk"}
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "statefulset", "rel", "keep", "--ignore-not-found", "--wait=true", "--timeout=120s")
		_, _ = c.kubectl("-n", testNS, "delete", "pvc", "data-rel-0", "data-keep-0", "--ignore-not-found", "--wait=true", "--timeout=120s")
	})
	// The claims first, written on n2 ("old"); each StatefulSet then
	// takes its claim by name, and its pod goes where the volume is.
	for set, class := range sets {
		claim := "data-" + set + "-0"
		c.apply(t, pvc(claim, "64Mi", "  storageClassName: "+class+"\n"))
		w := "w-" + set
		c.startPod(t, pod{name: w, claim: claim, node: gone, restartNever: true, script: "echo old > /data/f && sync"})
		c.waitPodPhase(t, w, "Succeeded", 3*time.Minute)
		c.delete(t, "pod", w)
		c.apply(t, statefulSet(set, class))
	}
	oldPV := map[string]string{}
	oldUID := map[string]string{}
	for set := range sets {
		c.waitPodPhase(t, set+"-0", "Running", 3*time.Minute)
		c.waitLog(t, set+"-0", "holds old", time.Minute)
		oldPV[set] = c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "data-"+set+"-0")
		oldUID[set] = c.jsonpath(t, "{.metadata.uid}", "-n", testNS, "get", "pvc", "data-"+set+"-0")
	}
	oldHandle := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", oldPV["rel"])

	// While the Node exists, the controller's account may not release.
	out, err := c.kubectl("-n", testNS, "delete", "pvc", "data-rel-0", "--dry-run=server",
		"--as=system:serviceaccount:"+pluginNS+":"+release+"-controller")
	if err == nil || !strings.Contains(err.Error(), "names a node that exists") {
		t.Fatalf("the controller's account deleting a claim of a node that exists: %v %s; want the policy's refusal", err, out)
	}
	t.Logf("while %s exists, the controller's account is refused: %s", gone, firstLine(err.Error()))

	if out, err := c.run("", "stop-kubelet", gone); err != nil {
		t.Fatalf("stop %s's kubelet: %v\n%s", gone, err, out)
	}
	back := false
	bringBack := func() {
		if back {
			return
		}
		back = true
		if out, err := c.run("", "start-kubelet", gone); err != nil {
			t.Errorf("start %s's kubelet: %v\n%s", gone, err, out)
		}
		eventually(t, 3*time.Minute, "node "+gone+" Ready", func() (bool, string) {
			s, err := c.kubectl("get", "node", gone, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return err == nil && strings.TrimSpace(s) == "True", s
		})
		c.waitPluginPods(t, 4*time.Minute)
	}
	t.Cleanup(bringBack) // the cluster is shared with the tests after this one
	// A few passes of the controller with the kubelet gone but the Node
	// there: nothing is released.
	time.Sleep(2 * releasePass)
	if got := c.jsonpath(t, "{.metadata.uid}", "-n", testNS, "get", "pvc", "data-rel-0"); got != oldUID["rel"] {
		t.Fatalf("rel's claim changed (uid %s, was %s) while node %s still existed", got, oldUID["rel"], gone)
	}
	c.k(t, "delete", "node", gone, "--wait=true", "--timeout=60s")
	deleted := time.Now()

	eventually(t, 5*time.Minute, "rel's pod to run on "+stays+" with a new volume", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "pod", "rel-0", "-o", "jsonpath={.spec.nodeName} {.status.phase}")
		logs, _ := c.kubectl("-n", testNS, "logs", "rel-0")
		return out == stays+" Running" && strings.Contains(logs, "holds new"),
			fmt.Sprintf("pod %q, log %q\nclaim events:\n%s", out, logs, c.claimEvents("data-rel-0"))
	})
	t.Logf("rel's pod ran on %s with a new volume %v after %s's Node was deleted", stays, time.Since(deleted).Round(time.Second), gone)
	if n := c.volumeNode(t, "data-rel-0"); n != stays {
		t.Errorf("rel's new claim's volume is on %s, want %s", n, stays)
	}
	kept := c.jsonpath(t, `{.status.phase} {.spec.persistentVolumeReclaimPolicy} {.metadata.annotations.fastblk\.csi\.io/released-claim}`, "get", "pv", oldPV["rel"])
	if kept != "Released Retain "+testNS+"/data-rel-0" {
		t.Errorf("rel's old PV %s: %q, want Released, Retain and the claim it held", oldPV["rel"], kept)
	}
	if ev := c.claimEvents("data-keep-0"); !strings.Contains(ev, "NodeDeleted") {
		t.Errorf("keep's claim has no event saying it is kept:\n%s", ev)
	}
	if got := c.jsonpath(t, "{.metadata.uid} {.status.phase} {.spec.volumeName}", "-n", testNS, "get", "pvc", "data-keep-0"); got != oldUID["keep"]+" Bound "+oldPV["keep"] {
		t.Errorf("keep's claim (the policy off) is %q, want still %s Bound to %s", got, oldUID["keep"], oldPV["keep"])
	}

	bringBack()
	c.waitPodPhase(t, "keep-0", "Running", 3*time.Minute)
	c.waitLog(t, "keep-0", "holds old", time.Minute)
	eventually(t, 2*time.Minute, gone+"'s plugin to say it keeps rel's old volume", func() (bool, string) {
		st, err := c.nodeStatusErr(gone)
		if err != nil {
			return false, err.Error()
		}
		why := st.Kept[oldHandle]
		return strings.Contains(why, testNS+"/data-rel-0") && strings.Contains(why, "released"), fmt.Sprintf("kept: %v", st.Kept)
	})
	st := c.nodeStatus(t, gone)
	t.Logf("%s keeps %s: %s", gone, oldHandle, st.Kept[oldHandle])
	ev := c.k(t, "get", "events", "-n", "default", "--field-selector", "involvedObject.name="+oldPV["rel"],
		"-o", "custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers")
	if !strings.Contains(ev, "VolumeKept") {
		t.Errorf("no VolumeKept event on PV %s:\n%s", oldPV["rel"], ev)
	}
	// The data is not wanted: the PV's reclaim policy to Delete, and n2's
	// provisioner removes the volume and the PV.
	c.k(t, "patch", "pv", oldPV["rel"], "--type=merge", "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
	c.waitGone(t, "pv", oldPV["rel"])
}

// releasePass is how often the controller looks for deleted nodes'
// volumes (cmd/csi-fastblk's releaseInterval).
const releasePass = 10 * time.Second
