package k8s

// This file's name sorts after userpath_test.go on purpose: its test
// upgrades the release the earlier tests installed (doc.go), and runs after
// TestCleanup, so it makes its own namespace and removes what it made.

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

const (
	// lister is the backup application's image: the external-snapshot-metadata
	// module's client, built by hack/k8s/install.sh (LISTER_IMAGE in lib.sh).
	lister = "csi-fastblk.local/snapshot-metadata-lister:e2e"
	// smsIP is the snapshot metadata Service's fixed address: the harness's
	// pods resolve no Service names (no cluster DNS), so the
	// SnapshotMetadataService names this address (service range
	// 10.233.0.0/24, hack/k8s/cluster.sh).
	smsIP      = "10.233.0.53"
	smsService = release + "-snapshot-metadata"
	backupSA   = "backup"
	mib        = int64(1) << 20
)

// extent is a byte range [off, off+len) of a volume.
type extent struct{ off, len int64 }

// Known writes: before snapshot 1, and between snapshots 1 and 2 (one
// overwrites a range written before snapshot 1 with new data, the others
// are new). Ranges lie megabytes apart, so that a delta that reports a
// range of the first writes alone cannot pass as a coarse rounding of the
// second's.
var (
	writes1 = []extent{{4 * mib, mib}, {20 * mib, 64 << 10}, {40 * mib, 4 << 10}}
	writes2 = []extent{{8 * mib, 128 << 10}, {40 * mib, 4 << 10}, {50 * mib, mib}}
)

// writeScript writes random data over each extent of the block device.
func writeScript(ws []extent) string {
	var b strings.Builder
	b.WriteString("set -e\n")
	for _, w := range ws {
		// 4 KiB blocks: every extent is a multiple of 4 KiB at a 4 KiB offset.
		fmt.Fprintf(&b, "dd if=/dev/urandom of=/dev/xvda bs=4096 seek=%d count=%d conv=fsync,notrunc 2>/dev/null\n", w.off/4096, w.len/4096)
	}
	b.WriteString("sync\necho written\n")
	return b.String()
}

// TestSnapshotMetadataLister is issue 42's proof on the cluster: with
// snapshotMetadata enabled, a backup application that this project did not
// write (the external-snapshot-metadata module's client, run in a pod under
// a service account bound to the chart's backup ClusterRoles) lists the
// allocated blocks of a block volume's first snapshot and the blocks
// changed between its first and second, and they match what a pod wrote.
// It lists from each node with the Service sending calls to that node's
// sidecar alone (internalTrafficPolicy Local), so one of the two listings
// reaches the snapshot's node through the peer channel, and both must
// agree.
func TestSnapshotMetadataLister(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	c.enableSnapshotMetadata(t)
	if got := c.jsonpath(t, "{.spec.address}", "get", "snapshotmetadataservices", driver); got != fmt.Sprintf("%s:6443", smsIP) {
		t.Fatalf("SnapshotMetadataService %s names %q, want %s:6443", driver, got, smsIP)
	}
	c.backupAccount(t)

	const claim = "cbt"
	c.apply(t, pvc(claim, "64Mi", "  volumeMode: Block\n"))
	t.Cleanup(func() { c.removeSnapshotsAndClaim(t, claim, "cbt-1", "cbt-2") })
	c.writeBlocks(t, "cbt-w1", claim, nodes[0], writes1)
	c.snapshotClaim(t, "cbt-1", claim)
	c.writeBlocks(t, "cbt-w2", claim, nodes[0], writes2)
	c.snapshotClaim(t, "cbt-2", claim)
	owner := c.volumeNode(t, claim)

	// Each node's sidecar alone: the Service sends a pod's calls to the
	// sidecar of the pod's own node.
	c.k(t, "-n", pluginNS, "patch", "service", smsService, "--type=merge", "-p", `{"spec":{"internalTrafficPolicy":"Local"}}`)
	var firstAlloc, firstDelta []extent
	for _, n := range nodes {
		alloc, capacity := c.listBlocks(t, "cbt-alloc-"+n, n, "-s", "cbt-1")
		delta, _ := c.listBlocks(t, "cbt-delta-"+n, n, "-s", "cbt-2", "-p", "cbt-1")
		t.Logf("from %s (volume on %s): allocated %v, changed %v", n, owner, alloc, delta)
		if capacity != 64*mib {
			t.Errorf("from %s: volume capacity %d, want %d", n, capacity, 64*mib)
		}
		checkAllocated(t, n, alloc, writes1)
		checkDelta(t, n, delta, writes2, writes1)
		if firstAlloc == nil {
			firstAlloc, firstDelta = alloc, delta
		} else if fmt.Sprint(alloc) != fmt.Sprint(firstAlloc) || fmt.Sprint(delta) != fmt.Sprint(firstDelta) {
			t.Errorf("the listings differ between the nodes: %v and %v, %v and %v", firstAlloc, alloc, firstDelta, delta)
		}
	}
	for _, n := range nodes {
		ready, _ := c.pluginPods(t)
		log := c.containerLog(t, ready[n])
		if forwarded := strings.Contains(log, "snapshot metadata forwarded"); forwarded != (n != owner) {
			t.Errorf("node %s (volume on %s): forwarded %v, want %v", n, owner, forwarded, n != owner)
		}
	}

	t.Run("upgrade keeps the CA", func(t *testing.T) {
		ca, crt := c.smsCA(t), c.jsonpath(t, "{.data.tls\\.crt}", "-n", pluginNS, "get", "secret", smsService+"-tls")
		c.upgrade(t, "--set", "snapshotMetadata.certValidityDays=3000")
		if c.smsCA(t) != ca || c.jsonpath(t, "{.data.tls\\.crt}", "-n", pluginNS, "get", "secret", smsService+"-tls") != crt {
			t.Error("helm upgrade changed the CA or the certificate of the snapshot metadata service")
		}
	})
	t.Run("rotation", func(t *testing.T) {
		// As the chart README says: delete both Secrets, upgrade; the
		// sidecars load the new certificate from the refreshed Secret
		// without a restart of the plugin pods.
		before, _ := c.pluginPods(t)
		ca := c.smsCA(t)
		c.k(t, "-n", pluginNS, "delete", "secret", smsService+"-ca", smsService+"-tls")
		c.upgrade(t)
		if c.smsCA(t) == ca {
			t.Fatal("the CA is the same after the Secrets were deleted and the release upgraded")
		}
		var err error
		deadline := time.Now().Add(4 * time.Minute)
		for i := 0; time.Now().Before(deadline); i++ {
			var alloc []extent
			if alloc, _, err = c.tryListBlocks(t, fmt.Sprintf("cbt-rot-%d", i), owner, "-s", "cbt-1"); err == nil {
				checkAllocated(t, owner+" after rotation", alloc, writes1)
				break
			}
			time.Sleep(10 * time.Second)
		}
		if err != nil {
			t.Fatalf("no listing with the new CA within 4 minutes: %v", err)
		}
		if after, _ := c.pluginPods(t); after[owner] != before[owner] {
			t.Errorf("the plugin pod of %s was replaced (%s, then %s): rotation must not restart plugins", owner, before[owner], after[owner])
		}
	})
}

// smsCA is the CA bundle of the driver's SnapshotMetadataService.
func (c *cluster) smsCA(t *testing.T) string {
	t.Helper()
	return c.jsonpath(t, "{.spec.caCert}", "get", "snapshotmetadataservices", driver)
}

// upgrade runs helm upgrade of the release with its values and args.
func (c *cluster) upgrade(t *testing.T, args ...string) {
	t.Helper()
	out, err := c.run("", "helm", append([]string{"upgrade", release, chartDir(t), "--namespace", pluginNS, "--reuse-values",
		"--wait", "--timeout", "5m"}, args...)...)
	if err != nil {
		t.Fatalf("helm upgrade %v: %v\n%s", args, err, out)
	}
}

// enableSnapshotMetadata upgrades the release with the snapshot metadata
// service at smsIP and waits for every plugin pod, sidecar included, to be
// ready; the test's end turns it off again.
func (c *cluster) enableSnapshotMetadata(t *testing.T) {
	t.Helper()
	c.upgrade(t, "--set", "snapshotMetadata.enabled=true", "--set", "snapshotMetadata.service.clusterIP="+smsIP)
	t.Cleanup(func() {
		if out, err := c.run("", "helm", "upgrade", release, chartDir(t), "--namespace", pluginNS, "--reuse-values",
			"--set", "snapshotMetadata.enabled=false", "--wait", "--timeout", "5m"); err != nil {
			t.Errorf("helm upgrade without snapshotMetadata: %v\n%s", err, out)
		}
	})
	c.waitPluginPods(t, 4*time.Minute)
}

// backupAccount makes the backup application's service account, bound as
// the chart README says: the client ClusterRole cluster-wide, the token
// ClusterRole in its own namespace only.
func (c *cluster) backupAccount(t *testing.T) {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: %[2]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-%[1]s}
subjects: [{kind: ServiceAccount, name: %[1]s, namespace: %[2]s}]
roleRef: {kind: ClusterRole, name: %[3]s-client, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: %[1]s-token, namespace: %[2]s}
subjects: [{kind: ServiceAccount, name: %[1]s, namespace: %[2]s}]
roleRef: {kind: ClusterRole, name: %[3]s-client-token, apiGroup: rbac.authorization.k8s.io}
`, backupSA, testNS, smsService))
	t.Cleanup(func() {
		_, _ = c.kubectl("delete", "clusterrolebinding", "e2e-"+backupSA, "--ignore-not-found")
		_, _ = c.kubectl("-n", testNS, "delete", "rolebinding,serviceaccount", backupSA+"-token", backupSA, "--ignore-not-found")
	})
}

// writeBlocks writes ws over the block claim in a pod on node and waits for
// it to end.
func (c *cluster) writeBlocks(t *testing.T, name, claim, node string, ws []extent) {
	t.Helper()
	c.startPod(t, pod{name: name, claim: claim, node: node, block: true, restartNever: true, script: writeScript(ws)})
	c.waitPodPhase(t, name, "Succeeded", 3*time.Minute)
	c.delete(t, "pod", name)
}

// listBlocks runs the lister with args in a pod on node under the backup
// account and returns the ranges it listed, sorted and merged, and the
// volume's capacity it reported.
func (c *cluster) listBlocks(t *testing.T, name, node string, args ...string) ([]extent, int64) {
	t.Helper()
	c.startLister(t, name, node, args...)
	c.waitPodPhase(t, name, "Succeeded", 2*time.Minute)
	return parseListing(t, c.logs(t, name))
}

// tryListBlocks is listBlocks for a listing that may fail: the pod's
// failure is an error with its output.
func (c *cluster) tryListBlocks(t *testing.T, name, node string, args ...string) ([]extent, int64, error) {
	t.Helper()
	c.startLister(t, name, node, args...)
	var phase string
	eventually(t, 2*time.Minute, "lister pod "+name+" to end", func() (bool, string) {
		phase = c.jsonpath(t, "{.status.phase}", "-n", testNS, "get", "pod", name)
		return phase == "Succeeded" || phase == "Failed", phase
	})
	if phase == "Failed" {
		return nil, 0, fmt.Errorf("lister pod %s failed:\n%s", name, c.describe(name))
	}
	ext, capacity := parseListing(t, c.logs(t, name))
	return ext, capacity, nil
}

// startLister starts the lister with args in a pod on node under the
// backup account; the pod goes when the test ends.
func (c *cluster) startLister(t *testing.T, name, node string, args ...string) {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  serviceAccountName: %s
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, name, testNS, backupSA, node, lister,
		fmt.Sprintf("snapshot-metadata-lister -n %s -o json %s", testNS, strings.Join(args, " "))))
	t.Cleanup(func() { _, _ = c.kubectl("-n", testNS, "delete", "pod", name, "--ignore-not-found", "--wait=false") })
}

// parseListing reads the lister's JSON output: a list of streamed messages,
// each with the volume's capacity and byte ranges.
func parseListing(t *testing.T, out string) ([]extent, int64) {
	t.Helper()
	var msgs []struct {
		Capacity int64 `json:"volume_capacity_bytes"`
		Blocks   []struct {
			Offset int64 `json:"byte_offset"`
			Size   int64 `json:"size_bytes"`
		} `json:"block_metadata"`
	}
	start := strings.Index(out, "[")
	if start < 0 {
		t.Fatalf("no JSON list in the lister's output:\n%s", out)
	}
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(&msgs); err != nil {
		t.Fatalf("the lister's output: %v\n%s", err, out)
	}
	var ext []extent
	var capacity int64
	for _, m := range msgs {
		capacity = m.Capacity
		for _, b := range m.Blocks {
			ext = append(ext, extent{b.Offset, b.Size})
		}
	}
	return merge(ext), capacity
}

// merge sorts extents and joins the ones that overlap or touch.
func merge(ext []extent) []extent {
	sort.Slice(ext, func(i, j int) bool { return ext[i].off < ext[j].off })
	var out []extent
	for _, e := range ext {
		if n := len(out); n > 0 && e.off <= out[n-1].off+out[n-1].len {
			out[n-1].len = max(out[n-1].len, e.off+e.len-out[n-1].off)
			continue
		}
		out = append(out, e)
	}
	return out
}

// covers reports whether the merged extents hold every byte of w.
func covers(ext []extent, w extent) bool {
	for _, e := range ext {
		if e.off <= w.off && w.off+w.len <= e.off+e.len {
			return true
		}
	}
	return false
}

// within reports whether e lies inside one of ws rounded out to whole MiB:
// the reported granularity is the driver's (a filesystem block for
// extent maps, a tracking chunk for deltas), never a megabyte.
func within(e extent, ws []extent) bool {
	for _, w := range ws {
		lo, hi := w.off/mib*mib, (w.off+w.len+mib-1)/mib*mib
		if lo <= e.off && e.off+e.len <= hi {
			return true
		}
	}
	return false
}

// checkAllocated: the allocated blocks of snapshot 1 hold every range
// written before it and nothing far from them (the volume was new: a
// block volume has no filesystem of its own).
func checkAllocated(t *testing.T, from string, alloc, written []extent) {
	t.Helper()
	for _, w := range written {
		if !covers(alloc, w) {
			t.Errorf("from %s: allocated %v misses the written range %v", from, alloc, w)
		}
	}
	for _, e := range alloc {
		if !within(e, written) {
			t.Errorf("from %s: allocated range %v is none of the written ones %v", from, e, written)
		}
	}
}

// checkDelta: the blocks changed between the snapshots hold every range
// written between them, and none written only before snapshot 1.
func checkDelta(t *testing.T, from string, delta, written, before []extent) {
	t.Helper()
	for _, w := range written {
		if !covers(delta, w) {
			t.Errorf("from %s: the delta %v misses the range %v written between the snapshots", from, delta, w)
		}
	}
	for _, e := range delta {
		if !within(e, written) {
			t.Errorf("from %s: the delta reports %v, which was not written between the snapshots (before: %v)", from, e, before)
		}
	}
}

// removeSnapshotsAndClaim deletes the test's snapshots and claim and waits
// until their contents and volume are gone: TestCleanup has already run.
func (c *cluster) removeSnapshotsAndClaim(t *testing.T, claim string, snaps ...string) {
	t.Helper()
	pv, _ := c.kubectl("-n", testNS, "get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}")
	contents := map[string]bool{}
	for _, s := range snaps {
		if vsc, err := c.kubectl("-n", testNS, "get", "volumesnapshot", s, "-o", "jsonpath={.status.boundVolumeSnapshotContentName}"); err == nil && vsc != "" {
			contents[strings.TrimSpace(vsc)] = true
		}
	}
	_, _ = c.kubectl(append([]string{"-n", testNS, "delete", "volumesnapshot", "--ignore-not-found", "--wait=true", "--timeout=180s"}, snaps...)...)
	_, _ = c.kubectl("-n", testNS, "delete", "pvc", claim, "--ignore-not-found", "--wait=true", "--timeout=180s")
	for vsc := range contents {
		c.waitGone(t, "volumesnapshotcontent", vsc)
	}
	if pv = strings.TrimSpace(pv); pv != "" {
		c.waitGone(t, "pv", pv)
	}
}
