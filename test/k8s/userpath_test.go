package k8s

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fbdriver "github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// chartDir is the absolute path of the chart (cluster.sh runs helm from
// another directory).
func chartDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(chartPath)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// snapshotCRDs are the CRDs of the chart's crds/ directory.
var snapshotCRDs = []string{
	"volumesnapshotclasses.snapshot.storage.k8s.io",
	"volumesnapshotcontents.snapshot.storage.k8s.io",
	"volumesnapshots.snapshot.storage.k8s.io",
	"volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io",
	"volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io",
	"volumegroupsnapshots.groupsnapshot.storage.k8s.io",
}

// pluginNamespace creates the plugin's namespace, labelled to admit
// privileged pods, as the chart README says (kept when it exists).
func (c *cluster) pluginNamespace(t *testing.T) {
	t.Helper()
	if _, err := c.kubectl("get", "namespace", pluginNS); err != nil {
		c.k(t, "create", "namespace", pluginNS)
	}
	c.k(t, "label", "--overwrite", "namespace", pluginNS, "pod-security.kubernetes.io/enforce=privileged")
}

// testNamespace creates the tests' namespace unless it exists.
func (c *cluster) testNamespace(t *testing.T) {
	t.Helper()
	if _, err := c.kubectl("get", "namespace", testNS); err != nil {
		c.k(t, "create", "namespace", testNS)
	}
}

// waitPluginPods waits for a Ready plugin pod on each node.
func (c *cluster) waitPluginPods(t *testing.T, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "a Ready plugin pod on each node", func() (bool, string) {
		ready, detail := c.pluginPods(t)
		for _, n := range nodes {
			if ready[n] == "" {
				return false, detail
			}
		}
		return true, ""
	})
}

// TestInstallWithoutSnapshotCRDs: on a cluster without the
// snapshot.storage.k8s.io CRDs, a default install that leaves the chart's
// CRDs out (--skip-crds, as where another component owns them) succeeds,
// creates no VolumeSnapshotClass, says so in its notes, and runs the plugin
// on both nodes; helm uninstall then passes the pre-delete check (no
// volumes) and removes everything but the namespace.
func TestInstallWithoutSnapshotCRDs(t *testing.T) {
	c := requireCluster(t)
	chart := chartDir(t)
	for _, crd := range snapshotCRDs {
		if _, err := c.kubectl("get", "crd", crd); err == nil {
			t.Fatalf("the cluster already has CRD %s: this test needs a fresh cluster", crd)
		}
	}
	c.pluginNamespace(t)
	out, err := c.run("", "helm", "install", release, chart, "--namespace", pluginNS, "--skip-crds")
	if err != nil {
		t.Fatalf("a default install on a cluster without the snapshot CRDs: %v\n%s", err, out)
	}
	if want := "the cluster has no snapshot.storage.k8s.io/v1 API"; !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
		t.Errorf("the notes do not say %q:\n%s", want, out)
	}
	manifest, err := c.run("", "helm", "get", "manifest", release, "--namespace", pluginNS)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(manifest, "kind: VolumeSnapshotClass") {
		t.Errorf("the release has a VolumeSnapshotClass on a cluster without its API")
	}
	c.waitPluginPods(t, 4*time.Minute)
	if got := c.jsonpath(t, "{.metadata.name}", "get", "csidriver", driver); got != driver {
		t.Errorf("CSIDriver %s: got %q", driver, got)
	}

	start := time.Now()
	if out, err := c.run("", "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm uninstall with no volumes: %v\n%s", err, out)
	}
	t.Logf("helm uninstall with the pre-delete check took %v", time.Since(start).Round(time.Second))
	eventually(t, 2*time.Minute, "the plugin pods and the check's Job to go", func() (bool, string) {
		out, _ := c.kubectl("-n", pluginNS, "get", "pods,jobs", "-o", "name")
		return strings.TrimSpace(out) == "", out
	})
	if _, err := c.kubectl("get", "csidriver", driver); err == nil {
		t.Errorf("CSIDriver %s is still there after helm uninstall", driver)
	}
	for _, crd := range snapshotCRDs {
		if _, err := c.kubectl("get", "crd", crd); err == nil {
			t.Errorf("CRD %s appeared though the install skipped the chart's CRDs", crd)
		}
	}
}

// TestNodeGroupOnOneNode installs the chart with one node group that
// selects n1 only, with its own data directory and a reserve: the plugin
// runs on n1 alone, only n1 advertises capacity and lists the driver, and
// an unpinned pod's claim is therefore provisioned on n1, in the group's
// data directory. Then helm uninstall (no volumes left).
func TestNodeGroupOnOneNode(t *testing.T) {
	c := requireCluster(t)
	c.pluginNamespace(t)
	const groupDir = "/var/lib/csi-fastblk/fast" // inside the nodes' data directories
	out, err := c.run("", "helm", "install", release, chartDir(t), "--namespace", pluginNS, "--skip-crds",
		"--set", "storageClass.isDefault=true",
		"--set", "nodeGroups[0].name=fast", "--set", `nodeGroups[0].nodeSelector.kubernetes\.io/hostname=n1`,
		"--set", "nodeGroups[0].dataDir="+groupDir, "--set-string", "nodeGroups[0].reserve=1Gi")
	if err != nil {
		t.Fatalf("helm install with a node group: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "pod,pvc", "--all", "--wait=true", "--timeout=120s")
		if out, err := c.run("", "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "3m"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		eventually(t, 2*time.Minute, "the plugin pods to go", func() (bool, string) {
			out, _ := c.kubectl("-n", pluginNS, "get", "pods", "-o", "name")
			return strings.TrimSpace(out) == "", out
		})
	})
	eventually(t, 4*time.Minute, "a Ready plugin pod on n1 only, and capacity for n1 only", func() (bool, string) {
		ready, detail := c.pluginPods(t)
		caps, err := c.capacities()
		if err != nil {
			return false, err.Error()
		}
		if ready["n2"] != "" || caps["n2"] != 0 {
			t.Fatalf("n2 matches no group but has plugin pod %q and capacity %d:%s", ready["n2"], caps["n2"], detail)
		}
		return ready["n1"] != "" && caps["n1"] > 0, fmt.Sprintf("capacities %v, pods:%s", caps, detail)
	})
	if d := c.jsonpath(t, "{.spec.drivers[*].name}", "get", "csinode", "n2"); strings.Contains(d, driver) {
		t.Errorf("CSINode n2 lists %s though no group selects n2", driver)
	}
	c.testNamespace(t)
	c.apply(t, pvc("grouped", "64Mi", ""))
	c.startPod(t, pod{name: "grouped", claim: "grouped", restartNever: true, script: "echo ok > /data/f && cat /data/f"})
	c.waitPodPhase(t, "grouped", "Succeeded", 3*time.Minute)
	if n := c.volumeNode(t, "grouped"); n != "n1" {
		t.Errorf("the claim was provisioned on %s, want n1 (the only node with capacity)", n)
	}
	handle := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "grouped"))
	// The CSI ID is the store's ID, "-", the node's tag.
	id, _, _ := strings.Cut(handle, "-")
	file := filepath.Join(c.nodeDir("n1"), "data", strings.TrimPrefix(groupDir, "/var/lib/csi-fastblk/"), "volumes", id+".img")
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the volume is not in the group's data directory: %v", err)
	}
	t.Logf("node group fast (n1, %s, 1Gi reserved): claim on n1 in %s", groupDir, file)
}

// TestHelmInstall installs the chart with its defaults, plus the
// snapshot-controller (the cluster has none) and the StorageClass as the
// default class: the images are the locally built ones under the chart's own
// references.
func TestHelmInstall(t *testing.T) {
	c := requireCluster(t)
	chart := chartDir(t)
	c.installChart(t)

	t.Run("server-side validation", func(t *testing.T) {
		manifest, err := c.run("", "helm", "get", "manifest", release, "--namespace", pluginNS)
		if err != nil {
			t.Fatal(err)
		}
		crds, err := c.run("", "helm", "show", "crds", chart)
		if err != nil {
			t.Fatal(err)
		}
		manifest += "\n---\n" + crds
		out, err := c.run(manifest, "kubectl", "apply", "--dry-run=server", "--validate=strict", "-f", "-")
		if err != nil {
			t.Fatalf("the API server rejects the release's manifest: %v\n%s", err, out)
		}
		t.Logf("%d objects accepted with strict field validation", strings.Count(out, "\n"))
	})

	t.Run("server-side validation of optional objects", func(t *testing.T) {
		// What the default install leaves out: the chart's own namespace
		// and PriorityClass, node groups, more classes, rate-limit tiers,
		// the snapshot metadata service, the uninstall check's hook objects (monitoring needs the
		// Prometheus operator's CRDs, which this cluster lacks).
		// (namespace.create wants a release namespace other than its own;
		// the objects go to the existing pluginNS, as the dry run needs.)
		version := c.jsonpath(t, "{.status.nodeInfo.kubeletVersion}", "get", "node", nodes[0])
		manifest, err := c.run("", "helm", "template", release, chartDir(t), "--namespace", "default",
			"--kube-version", version, "--api-versions", "snapshot.storage.k8s.io/v1",
			"--set", "namespace.create=true,namespace.name="+pluginNS+",priorityClass.create=true",
			"--set", `nodeGroups[0].name=fast,nodeGroups[0].nodeSelector.kubernetes\.io/hostname=n1,nodeGroups[0].dataDir=/var/lib/csi-fastblk/fast,nodeGroups[0].reserve=1Gi`,
			"--set", "storageClasses[0].name=fastblk-capped,storageClasses[0].maxIOPS=1000,storageClasses[0].fsType=xfs",
			"--set", "volumeAttributesClasses[0].name=bronze,volumeAttributesClasses[0].maxIOPS=500",
			"--set", "snapshotController.install=true",
			"--api-versions", "cbt.storage.k8s.io/v1beta1", "--set", "snapshotMetadata.enabled=true,snapshotMetadata.service.clusterIP=10.233.0.54")
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.run(manifest, "kubectl", "apply", "--dry-run=server", "--validate=strict", "-f", "-")
		if err != nil {
			t.Fatalf("the API server rejects the optional objects: %v\n%s", err, out)
		}
		for _, want := range []string{"namespace/" + pluginNS, "priorityclass.scheduling.k8s.io/", "daemonset.apps/" + release + "-node-fast", "storageclass.storage.k8s.io/fastblk-capped", "volumeattributesclass.storage.k8s.io/bronze", "job.batch/" + release + "-uninstall-check",
			"service/" + release + "-snapshot-metadata", "snapshotmetadataservice.cbt.storage.k8s.io/" + driver} {
			if !strings.Contains(out, want) {
				t.Errorf("the dry run did not include %s:\n%s", want, out)
			}
		}
	})

	t.Run("snapshot CRDs and class from the chart", func(t *testing.T) {
		for _, crd := range snapshotCRDs {
			c.k(t, "get", "crd", crd)
		}
		if got := c.jsonpath(t, "{.driver}", "get", "volumesnapshotclass", "fastblk"); got != driver {
			t.Errorf("VolumeSnapshotClass fastblk: driver %q, want %s", got, driver)
		}
		if got := c.jsonpath(t, "{.driver}", "get", "volumegroupsnapshotclass", "fastblk"); got != driver {
			t.Errorf("VolumeGroupSnapshotClass fastblk: driver %q, want %s", got, driver)
		}
	})

	t.Run("DaemonSet ready on both nodes", func(t *testing.T) { c.waitPluginPods(t, 4*time.Minute) })

	t.Run("snapshot-controller ready", func(t *testing.T) {
		out := c.k(t, "-n", pluginNS, "get", "deployments", "-o", "name")
		for _, d := range strings.Fields(out) {
			t.Log(strings.TrimSpace(c.k(t, "-n", pluginNS, "rollout", "status", d, "--timeout=180s")))
		}
	})

	t.Run("CSINode lists the driver", func(t *testing.T) {
		for _, n := range nodes {
			eventually(t, time.Minute, "CSINode "+n+" with "+driver, func() (bool, string) {
				out, err := c.kubectl("get", "csinode", n, "-o", "json")
				if err != nil {
					return false, err.Error()
				}
				var cn struct {
					Spec struct {
						Drivers []struct {
							Name         string   `json:"name"`
							NodeID       string   `json:"nodeID"`
							TopologyKeys []string `json:"topologyKeys"`
							Allocatable  *struct {
								Count int `json:"count"`
							} `json:"allocatable"`
						} `json:"drivers"`
					} `json:"spec"`
				}
				if err := json.Unmarshal([]byte(out), &cn); err != nil {
					return false, err.Error()
				}
				for _, d := range cn.Spec.Drivers {
					if d.Name != driver {
						continue
					}
					if d.NodeID != n || len(d.TopologyKeys) != 1 || d.TopologyKeys[0] != topoKey || d.Allocatable == nil || d.Allocatable.Count != 64 {
						t.Fatalf("CSINode %s: driver entry %+v, want nodeID %s, topologyKeys [%s], allocatable 64", n, d, n, topoKey)
					}
					return true, ""
				}
				return false, out
			})
			if got := c.jsonpath(t, "{.metadata.labels.topology\\.fastblk\\.csi\\.io/node}", "get", "node", n); got != n {
				t.Errorf("node %s has topology label %q, want %q", n, got, n)
			}
		}
	})

	t.Run("CSIStorageCapacity per node", func(t *testing.T) {
		eventually(t, 2*time.Minute, "a CSIStorageCapacity of class fastblk for each node", func() (bool, string) {
			caps, err := c.capacities()
			if err != nil {
				return false, err.Error()
			}
			for _, n := range nodes {
				if caps[n] <= 0 {
					return false, fmt.Sprintf("capacities %v", caps)
				}
			}
			t.Logf("capacity per node: %v", caps)
			return true, ""
		})
	})
	if !t.Failed() {
		c.testNamespace(t)
	}
	installed = !t.Failed()
}

// pluginPods maps each node to its plugin pod when all of that pod's
// containers are ready, and describes every pod.
func (c *cluster) pluginPods(t *testing.T) (map[string]string, string) {
	t.Helper()
	out, err := c.kubectl("-n", pluginNS, "get", "pods", "-l", "app.kubernetes.io/component=node", "-o", "json")
	if err != nil {
		return nil, err.Error()
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				Phase             string `json:"phase"`
				ContainerStatuses []struct {
					Name         string `json:"name"`
					Ready        bool   `json:"ready"`
					RestartCount int    `json:"restartCount"`
				} `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, err.Error()
	}
	ready := map[string]string{}
	var detail strings.Builder
	for _, p := range list.Items {
		ok := p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) > 0 && p.Metadata.DeletionTimestamp == nil
		fmt.Fprintf(&detail, "\n%s on %s: %s", p.Metadata.Name, p.Spec.NodeName, p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			ok = ok && s.Ready
			fmt.Fprintf(&detail, " %s ready=%v restarts=%d", s.Name, s.Ready, s.RestartCount)
		}
		if ok {
			ready[p.Spec.NodeName] = p.Metadata.Name
		}
	}
	return ready, detail.String()
}

// capacities is the available capacity of StorageClass fastblk per node,
// from the CSIStorageCapacity objects the provisioners publish.
func (c *cluster) capacities() (map[string]int64, error) { return c.capacitiesOf("fastblk") }

// capacitiesOf is the available capacity of StorageClass class per node.
func (c *cluster) capacitiesOf(class string) (map[string]int64, error) {
	out, err := c.kubectl("-n", pluginNS, "get", "csistoragecapacities", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			StorageClassName string `json:"storageClassName"`
			Capacity         string `json:"capacity"`
			NodeTopology     struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"nodeTopology"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, err
	}
	caps := map[string]int64{}
	for _, it := range list.Items {
		if it.StorageClassName != class {
			continue
		}
		n, err := parseQuantity(it.Capacity)
		if err != nil {
			return nil, err
		}
		caps[it.NodeTopology.MatchLabels[topoKey]] = n
	}
	return caps, nil
}

// capacityOwners maps the plugin's CSIStorageCapacity objects' UIDs to
// their owners (kind/name).
func (c *cluster) capacityOwners(t *testing.T) map[string]string {
	t.Helper()
	out := c.k(t, "-n", pluginNS, "get", "csistoragecapacities", "-o",
		`jsonpath={range .items[*]}{.metadata.uid} {.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}{"\n"}{end}`)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if uid, owner, ok := strings.Cut(l, " "); ok {
			m[uid] = owner
		}
	}
	if len(m) == 0 {
		t.Fatal("no CSIStorageCapacity objects")
	}
	return m
}

// parseQuantity parses the integer quantities the API server prints for
// capacities ("123456", "10Gi", "3500Mi", "12G").
func parseQuantity(q string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)([KMGTE]i?|k)?$`).FindStringSubmatch(q)
	if m == nil {
		return 0, fmt.Errorf("quantity %q", q)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	mult := map[string]int64{"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "E": 1e18,
		"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Ei": 1 << 60}[m[2]]
	return n * mult, nil
}

func firstLines(s string, n int) string {
	l := strings.SplitN(s, "\n", n+1)
	if len(l) > n {
		l = l[:n]
	}
	return strings.Join(l, "\n")
}

// TestNotesSeeTheClustersSnapshotController: on a live cluster the chart's
// notes look the cluster's snapshot-controllers up and say when the
// combination is wrong. Beside a foreign snapshot-controller Deployment
// (scaled to zero, so it never acts), helm upgrade --dry-run=server warns of
// two controllers while the release installs its own, of a foreign one
// without the distributed flag when distributedInCluster is declared, and
// tells to declare it when the foreign one has the flag.
func TestNotesSeeTheClustersSnapshotController(t *testing.T) {
	c := requireChart(t)
	chart := chartDir(t)
	image := c.jsonpath(t, `{.spec.template.spec.containers[0].image}`, "-n", pluginNS, "get", "deployment", release+"-snapshot-controller")
	foreign := func(args string) string {
		return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: snapshot-controller, namespace: %s}
spec:
  replicas: 0
  selector: {matchLabels: {app: foreign-snapshot-controller}}
  template:
    metadata: {labels: {app: foreign-snapshot-controller}}
    spec:
      containers:
      - name: snapshot-controller
        image: %s
        args: [%s]
`, testNS, image, args)
	}
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "deployment", "snapshot-controller", "--ignore-not-found")
	})
	notes := func(set ...string) string {
		t.Helper()
		args := []string{"upgrade", release, chart, "--namespace", pluginNS, "--reuse-values", "--dry-run=server"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := c.run("", "helm", args...)
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", set, err, out)
		}
		_, n, _ := strings.Cut(out, "NOTES:")
		return strings.Join(strings.Fields(n), " ")
	}
	for _, tc := range []struct {
		foreignArgs string
		set         []string
		want        string
	}{
		{`"--v=2"`, nil, "WARNING: the cluster already runs a snapshot-controller (" + testNS + "/snapshot-controller) besides the one this release installed"},
		{`"--v=2"`, []string{"snapshotController.install=false", "snapshotController.distributedInCluster=true"},
			"WARNING: snapshotController.distributedInCluster=true, but the snapshot-controller " + testNS + "/snapshot-controller runs without --enable-distributed-snapshotting=true"},
		{`"--enable-distributed-snapshotting=true"`, []string{"snapshotController.install=false"},
			"The snapshot-controller " + testNS + "/snapshot-controller runs in distributed mode: set snapshotController.distributedInCluster=true"},
	} {
		c.apply(t, foreign(tc.foreignArgs))
		if got := notes(tc.set...); !strings.Contains(got, tc.want) {
			t.Errorf("foreign controller args [%s], --set %v: the notes do not say %q:\n%s", tc.foreignArgs, tc.set, tc.want, got)
		}
	}
	if st := c.releaseStatus(t); st != "deployed" {
		t.Errorf("release status after dry runs: %q", st)
	}
}

// TestWriteRead: a PVC from the default StorageClass waits for its first
// consumer, a pod writes a file and its checksum with fsGroup applied, and a
// second pod reads the same data.
func TestWriteRead(t *testing.T) {
	c := requireChart(t)
	c.apply(t, pvc("data", "1Gi", ""))
	time.Sleep(2 * time.Second)
	if phase := c.jsonpath(t, "{.status.phase}", "-n", testNS, "get", "pvc", "data"); phase != "Pending" {
		t.Fatalf("PVC data is %s before any pod uses it, want Pending (WaitForFirstConsumer)", phase)
	}
	if sc := c.jsonpath(t, "{.spec.storageClassName}", "-n", testNS, "get", "pvc", "data"); sc != "fastblk" {
		t.Fatalf("PVC without a class got class %q, want the default fastblk", sc)
	}
	c.startPod(t, pod{name: "writer", claim: "data", restartNever: true, fsGroup: 2000, script: `set -e
dd if=/dev/urandom of=/data/file bs=1M count=16 2>/dev/null
sha256sum /data/file > /data/file.sha256
sync
echo "group $(stat -c %g /data) $(stat -c %g /data/file)"
cat /data/file.sha256`})
	c.waitPodPhase(t, "writer", "Succeeded", 3*time.Minute)
	if logs := c.logs(t, "writer"); !strings.Contains(logs, "group 2000 2000") {
		t.Errorf("fsGroup 2000 not applied to the volume or new files:\n%s", logs)
	}
	node := c.volumeNode(t, "data")
	if on := c.jsonpath(t, "{.spec.nodeName}", "-n", testNS, "get", "pod", "writer"); on != node {
		t.Errorf("writer ran on %s, its volume lives on %s", on, node)
	}
	t.Logf("volume of PVC data on node %s", node)
	c.delete(t, "pod", "writer")

	c.startPod(t, pod{name: "reader", claim: "data", restartNever: true, script: "sha256sum -c /data/file.sha256"})
	c.waitPodPhase(t, "reader", "Succeeded", 3*time.Minute)
	if logs := c.logs(t, "reader"); !strings.Contains(logs, "/data/file: OK") {
		t.Fatalf("second pod read different data:\n%s", logs)
	}
	c.delete(t, "pod", "reader")
}

// writtenClaim makes PVC claim (1Gi, the default class) and fills it as
// TestWriteRead's writer does: /data/file, 16 MiB of random bytes, and
// /data/file.sha256, its checksum.
func (c *cluster) writtenClaim(t *testing.T, claim string) {
	t.Helper()
	c.apply(t, pvc(claim, "1Gi", ""))
	name := "w-" + claim
	c.startPod(t, pod{name: name, claim: claim, restartNever: true, script: `set -e
dd if=/dev/urandom of=/data/file bs=1M count=16 2>/dev/null
sha256sum /data/file > /data/file.sha256
sync`})
	c.waitPodPhase(t, name, "Succeeded", 3*time.Minute)
	c.delete(t, "pod", name)
}

// dfSize is the size in bytes of the filesystem at /data in a running pod.
func (c *cluster) dfSize(t *testing.T, podName string) int64 {
	t.Helper()
	out := c.k(t, "-n", testNS, "exec", podName, "--", "df", "-k", "/data")
	f := strings.Fields(lastLine(out))
	if len(f) < 2 {
		t.Fatalf("df in %s: %q", podName, out)
	}
	kb, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df in %s: %q", podName, out)
	}
	return kb << 10
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// TestExpandOnline grows a PVC while a pod has it mounted: the pod sees the
// new size without a restart. Online ext4 growth (resize2fs on a mounted
// filesystem) needs CAP_SYS_RESOURCE, which this machine withholds even from
// root, so the claim is xfs (xfs_growfs needs CAP_SYS_ADMIN) from a second
// StorageClass; the ext4 default class is grown where the host allows it.
func TestExpandOnline(t *testing.T) {
	c := requireChart(t)
	c.xfsClass(t)
	classes := []string{"fastblk-xfs"}
	if hostHasCap(t, capSysResource) {
		classes = append(classes, "fastblk")
	} else {
		t.Log("this host withholds CAP_SYS_RESOURCE: online ext4 growth not tested")
	}
	for _, class := range classes {
		t.Run(class, func(t *testing.T) {
			claim, name := "grow-"+class, "expander-"+class
			c.apply(t, pvc(claim, "1Gi", "  storageClassName: "+class+"\n"))
			c.startPod(t, pod{name: name, claim: claim, script: "sleep 3600"})
			c.waitPodPhase(t, name, "Running", 2*time.Minute)
			c.growTo2Gi(t, claim, name)
			if rc := c.jsonpath(t, "{.status.containerStatuses[0].restartCount}", "-n", testNS, "get", "pod", name); rc != "0" {
				t.Errorf("pod restarted %s times during expansion", rc)
			}
			c.delete(t, "pod", name)
			c.delete(t, "pvc", claim)
		})
	}
}

// xfsClass makes the StorageClass fastblk-xfs: xfs grows online without
// CAP_SYS_RESOURCE, which this host may withhold from containers (ext4's
// online resize needs it).
func (c *cluster) xfsClass(t *testing.T) {
	t.Helper()
	c.apply(t, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: fastblk-xfs}
provisioner: `+driver+`
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
parameters: {csi.storage.k8s.io/fstype: xfs}
`)
}

// growTo2Gi asks for 2Gi on the 1Gi claim that the running pod name uses
// and waits for the PVC's capacity and for the pod to see the grown
// filesystem.
func (c *cluster) growTo2Gi(t *testing.T, claim, name string) {
	t.Helper()
	before := c.dfSize(t, name)
	c.k(t, "-n", testNS, "patch", "pvc", claim, "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	eventually(t, 3*time.Minute, "PVC "+claim+" at 2Gi", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "pvc", claim, "-o", "jsonpath={.status.capacity.storage} {.status.conditions}")
		return strings.HasPrefix(out, "2Gi "), out
	})
	eventually(t, time.Minute, "the pod to see the grown filesystem", func() (bool, string) {
		now := c.dfSize(t, name)
		return now > before+(800<<20), fmt.Sprintf("df size %d, was %d", now, before)
	})
}

const capSysResource = 24

// hostHasCap reports whether this process has capability bit cap in its
// bounding set (and so can give it to containers).
func hostHasCap(t *testing.T, bit uint) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapBnd:\s*([0-9a-f]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no CapBnd in /proc/self/status")
	}
	v, err := strconv.ParseUint(string(m[1]), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v&(1<<bit) != 0
}

// TestSnapshotRestoreAndClone restores a VolumeSnapshot of PVC data into a
// new PVC and clones PVC data: both hold the same file.
func TestSnapshotRestoreAndClone(t *testing.T) {
	c := requireChart(t)
	c.writtenClaim(t, "snap-src")
	c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap, namespace: %s}
spec:
  volumeSnapshotClassName: fastblk
  source: {persistentVolumeClaimName: snap-src}
`, testNS))
	eventually(t, 2*time.Minute, "VolumeSnapshot snap ready", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "volumesnapshot", "snap", "-o", "jsonpath={.status.readyToUse} {.status.error}")
		return strings.HasPrefix(out, "true"), out
	})
	c.apply(t, pvc("restored", "1Gi", "  dataSource: {name: snap, kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"))
	c.apply(t, pvc("clone", "1Gi", "  dataSource: {name: snap-src, kind: PersistentVolumeClaim}\n"))
	source := c.volumeNode(t, "snap-src")
	for _, claim := range []string{"restored", "clone"} {
		name := "check-" + claim
		c.startPod(t, pod{name: name, claim: claim, restartNever: true, script: "sha256sum -c /data/file.sha256"})
		c.waitPodPhase(t, name, "Succeeded", 4*time.Minute)
		if logs := c.logs(t, name); !strings.Contains(logs, "/data/file: OK") {
			t.Errorf("PVC %s holds different data:\n%s", claim, logs)
		}
		t.Logf("PVC %s on node %s (source on %s)", claim, c.volumeNode(t, claim), source)
		c.delete(t, "pod", name)
	}
}

// TestPreProvisionedSnapshot: a VolumeSnapshotContent made by hand for an
// existing snapshot (a pre-provisioned snapshot, as for a snapshot brought
// back from a backup) gets the managed-by label of the snapshot's node from
// that node's plugin, so that the node's csi-snapshotter handles it: its
// VolumeSnapshot becomes ready and a claim restored from it holds the
// data. Before, no sidecar read the unlabelled content and the snapshot
// never became ready (the storage suite's pre-provisioned specs timed out).
func TestPreProvisionedSnapshot(t *testing.T) {
	c := requireChart(t)
	c.writtenClaim(t, "pre-src")
	c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: pre-dyn, namespace: %s}
spec: {volumeSnapshotClassName: fastblk, source: {persistentVolumeClaimName: pre-src}}
`, testNS))
	eventually(t, 2*time.Minute, "VolumeSnapshot pre-dyn ready", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "volumesnapshot", "pre-dyn", "-o", "jsonpath={.status.readyToUse}")
		return out == "true", out
	})
	dyn := c.jsonpath(t, "{.status.boundVolumeSnapshotContentName}", "-n", testNS, "get", "volumesnapshot", "pre-dyn")
	handle := c.jsonpath(t, "{.status.snapshotHandle}", "get", "volumesnapshotcontent", dyn)
	node := c.volumeNode(t, "pre-src")

	content := "pre-static-" + testNS
	c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: %s}
spec:
  deletionPolicy: Retain
  driver: fastblk.csi.io
  volumeSnapshotClassName: fastblk
  source: {snapshotHandle: %s}
  volumeSnapshotRef: {name: pre-static, namespace: %s}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: pre-static, namespace: %s}
spec: {source: {volumeSnapshotContentName: %s}}
`, content, handle, testNS, testNS, content))
	start := time.Now()
	eventually(t, 2*time.Minute, "VolumeSnapshot pre-static ready", func() (bool, string) {
		out, _ := c.kubectl("-n", testNS, "get", "volumesnapshot", "pre-static", "-o", "jsonpath={.status.readyToUse} {.status.error}")
		return strings.HasPrefix(out, "true"), out
	})
	label := c.jsonpath(t, `{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}`, "get", "volumesnapshotcontent", content)
	t.Logf("hand-made content of %s's snapshot %s labelled %q, ready after %v", node, handle, label, time.Since(start).Round(time.Second))
	if label != node {
		t.Errorf("content %s labelled managed-by %q, want the snapshot's node %s", content, label, node)
	}

	c.apply(t, pvc("pre-restored", "1Gi", "  dataSource: {name: pre-static, kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"))
	c.startPod(t, pod{name: "check-pre", claim: "pre-restored", restartNever: true, script: "sha256sum -c /data/file.sha256"})
	c.waitPodPhase(t, "check-pre", "Succeeded", 4*time.Minute)
	if logs := c.logs(t, "check-pre"); !strings.Contains(logs, "/data/file: OK") {
		t.Errorf("the claim restored from the pre-provisioned snapshot holds different data:\n%s", logs)
	}
	c.delete(t, "pod", "check-pre")
	c.delete(t, "pvc", "pre-restored")
	c.delete(t, "volumesnapshot", "pre-static")
	// Retain: the content stays, and with it nothing on disk (the snapshot
	// is pre-dyn's, which TestCleanup deletes).
	c.k(t, "delete", "volumesnapshotcontent", content, "--wait=true", "--timeout=120s")
}

// TestRestoreAcrossNodes restores snapshots of a volume on each node, and
// clones it, into pods on the other node and into unpinned pods. The
// plugin of the pod's node pulls the data from the source's node over the
// peer channel (the StorageClass's default crossNodeSource: pull): every
// restore and clone ends up on its pod's node with the source's data.
// Before, the other node's plugin refused with ResourceExhausted and an
// unpinned pod could be sent back to it for ever.
func TestRestoreAcrossNodes(t *testing.T) {
	c := requireChart(t)
	for i, n := range nodes {
		other := nodes[(i+1)%len(nodes)]
		t.Run(n, func(t *testing.T) {
			src, snap := "src-"+n, "snap-"+n
			c.apply(t, pvc(src, "256Mi", ""))
			c.startPod(t, pod{name: "w-" + n, claim: src, node: n, restartNever: true,
				script: "dd if=/dev/urandom of=/data/f bs=1M count=64 2>/dev/null; echo " + n + " >> /data/f; sha256sum /data/f > /data/f.sha256; sync"})
			c.waitPodPhase(t, "w-"+n, "Succeeded", 2*time.Minute)
			c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec: {volumeSnapshotClassName: fastblk, source: {persistentVolumeClaimName: %s}}
`, snap, testNS, src))
			eventually(t, 2*time.Minute, "VolumeSnapshot "+snap+" ready", func() (bool, string) {
				out, _ := c.kubectl("-n", testNS, "get", "volumesnapshot", snap, "-o", "jsonpath={.status.readyToUse}")
				return out == "true", out
			})
			fromSnap := "  dataSource: {name: " + snap + ", kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"
			for _, tc := range []struct{ name, source, node string }{
				{"rp-" + n, fromSnap, other}, // restore pinned to the other node
				{"ru-" + n, fromSnap, ""},    // restore wherever the scheduler likes
				{"cl-" + n, "  dataSource: {name: " + src + ", kind: PersistentVolumeClaim}\n", other}, // clone onto the other node
			} {
				start := time.Now()
				c.apply(t, pvc(tc.name, "256Mi", tc.source))
				c.startPod(t, pod{name: tc.name, claim: tc.name, node: tc.node, restartNever: true, script: "sha256sum -c /data/f.sha256"})
				c.waitPodPhase(t, tc.name, "Succeeded", 4*time.Minute)
				on := c.volumeNode(t, tc.name)
				if tc.node != "" && on != tc.node {
					t.Errorf("%s for a pod pinned to %s was provisioned on %s", tc.name, tc.node, on)
				}
				if logs := c.logs(t, tc.name); !strings.Contains(logs, "/data/f: OK") {
					t.Errorf("%s holds different data:\n%s", tc.name, logs)
				}
				t.Logf("%s of a source on %s: on %s after %v", tc.name, n, on, time.Since(start).Round(time.Second))
				c.delete(t, "pod", tc.name)
			}
		})
	}
}

// TestRestoreHandoff restores n1's snapshot with a StorageClass whose
// crossNodeSource is handoff, for a pod that prefers n2: the scheduler
// first picks n2, whose plugin has n1's make the volume and answers with
// n1's topology; the scheduler then finds the claim bound to a volume of
// n1 and runs the pod there, with the snapshot's data.
func TestRestoreHandoff(t *testing.T) {
	c := requireChart(t)
	c.storageClass(t, "fastblk-handoff", "crossNodeSource: handoff")
	c.writtenSnapshot(t, "ho-snap", "ho-src", "256Mi", "n1", "echo handoff > /data/f; sha256sum /data/f > /data/f.sha256; sync")
	c.apply(t, pvc("ho-r", "256Mi", "  storageClassName: fastblk-handoff\n"+
		"  dataSource: {name: ho-snap, kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"))
	start := time.Now()
	c.startPod(t, pod{name: "ho-r", claim: "ho-r", prefer: "n2", restartNever: true, script: "sha256sum -c /data/f.sha256"})
	c.waitPodPhase(t, "ho-r", "Succeeded", 4*time.Minute)
	if on := c.volumeNode(t, "ho-r"); on != "n1" {
		t.Errorf("the handed-off restore was provisioned on %s, want n1 (the snapshot's node)", on)
	}
	if ran := c.jsonpath(t, "{.spec.nodeName}", "-n", testNS, "get", "pod", "ho-r"); ran != "n1" {
		t.Errorf("the pod ran on %s, want n1", ran)
	}
	if logs := c.logs(t, "ho-r"); !strings.Contains(logs, "/data/f: OK") {
		t.Errorf("the handed-off restore holds different data:\n%s", logs)
	}
	t.Logf("handed-off restore done in %v", time.Since(start).Round(time.Second))
}

// TestMoveVolumeToAnotherNode follows docs/operations.md's "Moving a volume to another
// node" step by step: a claim on n1 holds a file with its checksum and a
// pattern after a hole; the app stops, n1 is cordoned as a drain does, the
// claim is snapshotted, deleted and made again under the same name from
// the snapshot, and the app's pod, the same spec as before (it prefers n1),
// starts on n2 with the data. The old volume is gone from n1 and the
// snapshot can be deleted after, the moved claim still reading.
func TestMoveVolumeToAnotherNode(t *testing.T) {
	c := requireChart(t)
	const claim, snap = "mv", "mv-move"
	start := time.Now()
	c.apply(t, pvc(claim, "256Mi", ""))
	// The app: writes once (unless the data is there), checks, then runs.
	app := pod{name: "mv-app", claim: claim, prefer: "n1", script: `set -e
if [ ! -e /data/f.sha256 ]; then
  dd if=/dev/urandom of=/data/f bs=1M count=32 2>/dev/null
  sha256sum /data/f > /data/f.sha256
  printf 'fastblk-move' | dd of=/data/sparse bs=1M seek=100 conv=notrunc 2>/dev/null
  sync
fi
sha256sum -c /data/f.sha256
[ "$(dd if=/data/sparse bs=1M skip=100 2>/dev/null)" = fastblk-move ]
[ "$(dd if=/data/sparse bs=1M count=100 2>/dev/null | tr -d '\000' | wc -c)" -eq 0 ]
echo "pattern OK"
sleep 3600`}
	c.startPod(t, app)
	c.waitPodPhase(t, app.name, "Running", 3*time.Minute)
	c.waitLog(t, app.name, "pattern OK", time.Minute)
	if on := c.volumeNode(t, claim); on != "n1" {
		t.Fatalf("the claim was provisioned on %s, want n1 (the app prefers n1)", on)
	}
	oldPV := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", claim)
	oldID, oldFile := c.objectFile("n1", "volumes", c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", oldPV))
	if _, err := os.Stat(oldFile); err != nil {
		t.Fatalf("the volume's file on n1: %v", err)
	}

	// 1. Cordon the node, as kubectl drain does first.
	c.k(t, "cordon", "n1")
	t.Cleanup(func() { _, _ = c.kubectl("uncordon", "n1") })
	// 2. Stop the app.
	down := time.Now()
	c.delete(t, "pod", app.name)
	// 3. Snapshot the claim.
	c.snapshotClaim(t, snap, claim)
	// 4. Delete the claim: its volume on n1 goes with it.
	c.k(t, "-n", testNS, "delete", "pvc", claim, "--timeout=2m")
	// 5. Make it again under the same name from the snapshot.
	c.apply(t, pvc(claim, "256Mi", "  storageClassName: fastblk\n"+
		"  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: "+snap+"}\n"))
	// 6. Start the app: n1 is cordoned, so the scheduler picks n2.
	c.startPod(t, app)
	c.waitPodPhase(t, app.name, "Running", 4*time.Minute)
	c.waitLog(t, app.name, "pattern OK", time.Minute)
	t.Logf("the app was down %v (stop, snapshot, claim again, copy, start)", time.Since(down).Round(time.Second))
	if on := c.volumeNode(t, claim); on != "n2" {
		t.Errorf("the moved claim's volume is on %s, want n2", on)
	}
	if ran := c.jsonpath(t, "{.spec.nodeName}", "-n", testNS, "get", "pod", app.name); ran != "n2" {
		t.Errorf("the app ran on %s after the move, want n2", ran)
	}
	if logs := c.logs(t, app.name); !strings.Contains(logs, "/data/f: OK") {
		t.Errorf("the moved claim holds different data:\n%s", logs)
	}

	// The old volume is gone: its PV, n1's record and file.
	c.waitGone(t, "pv", oldPV)
	for _, v := range c.nodeStatus(t, "n1").Volumes {
		if v.ID == oldID || v.Name == oldPV {
			t.Errorf("n1 still lists the old volume: %+v", v)
		}
	}
	if _, err := os.Stat(oldFile); !os.IsNotExist(err) {
		t.Errorf("the old volume's file is still on n1: %v", err)
	}

	// 7. Delete the snapshot: it goes from n1, and the claim still reads.
	content := c.jsonpath(t, "{.status.boundVolumeSnapshotContentName}", "-n", testNS, "get", "volumesnapshot", snap)
	_, snapFile := c.objectFile("n1", "snapshots", c.jsonpath(t, "{.status.snapshotHandle}", "get", "volumesnapshotcontent", content))
	if _, err := os.Stat(snapFile); err != nil {
		t.Errorf("the snapshot's file on n1: %v", err)
	}
	c.k(t, "-n", testNS, "delete", "volumesnapshot", snap, "--timeout=2m")
	c.waitGone(t, "volumesnapshotcontent", content)
	if _, err := os.Stat(snapFile); !os.IsNotExist(err) {
		t.Errorf("the snapshot's file is still on n1 after its deletion: %v", err)
	}
	c.k(t, "-n", testNS, "exec", app.name, "--", "sha256sum", "-c", "/data/f.sha256")
	c.delete(t, "pod", app.name)
	c.delete(t, "pvc", claim)
	t.Logf("move test took %v", time.Since(start).Round(time.Second))
}

// TestRestoreSurvivesPluginKill restores n1's snapshot onto n2 through a
// class whose transferRate (1Mi) makes the copy of its 20 MiB last about
// 20 s, and kills a plugin in the middle of the copy: n1's (the source's)
// pod is force-deleted, as an eviction or a lost node would take it; n2's
// (the target's) plugin process is killed with SIGKILL, a crash that
// leaves its pod and provisioner. Either way the copy fails, the
// external-provisioner retries once the plugin is back, the next copy
// starts afresh and the claim binds with the snapshot's data; n2 keeps
// nothing of the interrupted copy. While the copy runs its progress shows
// in n2's `csi-fastblk status`, and the failed copy's progress reaches
// the claim as the provisioner's event.
func TestRestoreSurvivesPluginKill(t *testing.T) {
	c := requireChart(t)
	c.storageClass(t, "fastblk-slow", "transferRate: 1Mi")
	c.writtenSnapshot(t, "pk-snap", "pk-src", "128Mi", "n1",
		"dd if=/dev/urandom of=/data/f bs=1M count=20 2>/dev/null; sha256sum /data/f > /data/f.sha256; sync")

	for _, tc := range []struct {
		name, claim string
		kill        func(t *testing.T)
		event       string // in the claim's events after the kill ("" for none)
	}{
		{"source pod deleted", "pk-r1", func(t *testing.T) {
			ready, detail := c.pluginPods(t)
			if ready["n1"] == "" {
				t.Fatalf("no ready plugin pod on n1:%s", detail)
			}
			c.k(t, "-n", pluginNS, "delete", "pod", ready["n1"], "--grace-period=0", "--force")
		}, "bytes of data received"},
		// The provisioner beside the killed plugin exits when it loses
		// the plugin's socket (csi-lib-utils' ExitOnConnectionLoss), so
		// the call it had in flight may leave no event.
		{"target process killed", "pk-r2", func(t *testing.T) {
			ready, _ := c.pluginPods(t)
			restarts := func() int {
				n, _ := strconv.Atoi(c.jsonpath(t, `{.status.containerStatuses[?(@.name=="csi-fastblk")].restartCount}`, "-n", pluginNS, "get", "pod", ready["n2"]))
				return n
			}
			before := restarts()
			pid := c.pluginPID(t, "n2")
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill n2's plugin (pid %d): %v", pid, err)
			}
			eventually(t, 2*time.Minute, "n2's plugin container to restart in its pod", func() (bool, string) {
				return restarts() > before, fmt.Sprintf("restartCount %d", restarts())
			})
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c.apply(t, pvc(tc.claim, "128Mi", "  storageClassName: fastblk-slow\n"+
				"  dataSource: {name: pk-snap, kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"))
			c.startPod(t, pod{name: tc.claim, claim: tc.claim, node: "n2", restartNever: true, script: "sha256sum -c /data/f.sha256"})
			var seen fbdriver.PullStatus
			eventually(t, 2*time.Minute, "n2 to copy "+tc.claim+" (3 MiB in)", func() (bool, string) {
				st, err := c.nodeStatusErr("n2")
				if err != nil {
					return false, err.Error()
				}
				for _, p := range st.Pulls {
					if p.PVCName == tc.claim {
						seen = p
						return p.ReceivedBytes >= 3<<20, fmt.Sprintf("%+v", p)
					}
				}
				return false, fmt.Sprintf("no copy for %s in n2's status: %+v", tc.claim, st.Pulls)
			})
			t.Logf("n2's status in the copy after %v: %d of at most %d bytes received from %s",
				time.Since(start).Round(time.Second), seen.ReceivedBytes, seen.ExpectedBytes, seen.SourceNode)
			killed := time.Now()
			tc.kill(t)
			c.waitPodPhase(t, tc.claim, "Succeeded", 4*time.Minute)
			t.Logf("claim bound and checked %v after the kill (%v in all)",
				time.Since(killed).Round(time.Second), time.Since(start).Round(time.Second))
			if logs := c.logs(t, tc.claim); !strings.Contains(logs, "/data/f: OK") {
				t.Errorf("%s holds different data:\n%s", tc.claim, logs)
			}
			if on := c.volumeNode(t, tc.claim); on != "n2" {
				t.Errorf("%s was provisioned on %s, want n2", tc.claim, on)
			}
			ev := c.claimEvents(tc.claim)
			t.Logf("events of claim %s:\n%s", tc.claim, ev)
			if !strings.Contains(ev, tc.event) { // "" for none
				t.Errorf("no event of claim %s says %q", tc.claim, tc.event)
			}
			c.waitPluginPods(t, 3*time.Minute)
			c.noVolumesWithoutPV(t, "n2")
			c.delete(t, "pod", tc.claim)
		})
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestRawBlock writes and reads a raw block PVC in a pod.
func TestRawBlock(t *testing.T) {
	c := requireChart(t)
	c.apply(t, pvc("blk", "256Mi", "  volumeMode: Block\n"))
	c.startPod(t, pod{name: "block", claim: "blk", block: true, restartNever: true, script: `set -e
echo "size $(blockdev --getsize64 /dev/xvda)"
dd if=/dev/urandom of=/tmp/w bs=1M count=8 2>/dev/null
dd if=/tmp/w of=/dev/xvda bs=1M seek=4 conv=fsync 2>/dev/null
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
dd if=/dev/xvda of=/tmp/r bs=1M skip=4 count=8 iflag=direct 2>/dev/null
echo "w $(sha256sum < /tmp/w)"
echo "r $(sha256sum < /tmp/r)"`})
	c.waitPodPhase(t, "block", "Succeeded", 3*time.Minute)
	logs := c.logs(t, "block")
	if !strings.Contains(logs, fmt.Sprintf("size %d", 256<<20)) {
		t.Errorf("device size wrong:\n%s", logs)
	}
	var w, r string
	for _, l := range strings.Split(logs, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "w" {
			w = f[1]
		} else if len(f) >= 2 && f[0] == "r" {
			r = f[1]
		}
	}
	if w == "" || w != r {
		t.Fatalf("data read from the block device differs from what was written:\n%s", logs)
	}
	c.delete(t, "pod", "block")
}

// TestCapacityTracksVolumes: the CSIStorageCapacity of a node drops by about
// a new volume's size (a sparse volume still reserves what it may fill) and
// comes back when the volume is deleted. The other node's does not move.
func TestCapacityTracksVolumes(t *testing.T) {
	c := requireChart(t)
	const size, slack = 20 << 30, 5 << 30 // slack: the shared disk's own churn
	before, err := c.capacities()
	if err != nil {
		t.Fatal(err)
	}
	c.apply(t, pvc("cap", "20Gi", ""))
	c.startPod(t, pod{name: "cap", claim: "cap", node: "n2", restartNever: true, script: "true"})
	c.waitPodPhase(t, "cap", "Succeeded", 2*time.Minute)
	eventually(t, 3*time.Minute, "n2's capacity to drop by the volume's 20Gi", func() (bool, string) {
		now, err := c.capacities()
		if err != nil {
			return false, err.Error()
		}
		return now["n2"] < before["n2"]-size+slack, fmt.Sprintf("before %v, now %v", before, now)
	})
	if now, _ := c.capacities(); now["n1"] < before["n1"]-slack {
		t.Errorf("n1's capacity dropped for a volume on n2: before %v, now %v", before, now)
	}
	c.delete(t, "pod", "cap")
	c.delete(t, "pvc", "cap")
	eventually(t, 3*time.Minute, "n2's capacity to come back", func() (bool, string) {
		now, err := c.capacities()
		if err != nil {
			return false, err.Error()
		}
		return now["n2"] > before["n2"]-slack, fmt.Sprintf("before %v, now %v", before, now)
	})
}

// TestVolumeStats compares kubelet's kubelet_volume_stats_* for PVC data
// with what df sees in a pod.
func TestVolumeStats(t *testing.T) {
	c := requireChart(t)
	c.apply(t, pvc("stats", "1Gi", ""))
	c.startPod(t, pod{name: "stats", claim: "stats", script: "dd if=/dev/zero of=/data/fill bs=1M count=64 2>/dev/null; sync; sleep 3600"})
	c.waitPodPhase(t, "stats", "Running", 2*time.Minute)
	node := c.volumeNode(t, "stats")
	out := c.k(t, "-n", testNS, "exec", "stats", "--", "sh", "-c", "sleep 2; df -k /data")
	f := strings.Fields(lastLine(out))
	size, _ := strconv.ParseInt(f[1], 10, 64)
	used, _ := strconv.ParseInt(f[2], 10, 64)
	size, used = size<<10, used<<10
	series := regexp.MustCompile(`(?m)^kubelet_volume_stats_(capacity|used|available)_bytes\{([^}]*)\} (\S+)$`)
	eventually(t, 90*time.Second, "kubelet volume stats of PVC data on "+node, func() (bool, string) {
		m, err := c.kubectl("get", "--raw", "/api/v1/nodes/"+node+"/proxy/metrics")
		if err != nil {
			return false, err.Error()
		}
		got := map[string]float64{}
		for _, s := range series.FindAllStringSubmatch(m, -1) {
			if strings.Contains(s[2], `namespace="`+testNS+`"`) && strings.Contains(s[2], `persistentvolumeclaim="stats"`) {
				got[s[1]], _ = strconv.ParseFloat(s[3], 64)
			}
		}
		if len(got) < 3 {
			return false, fmt.Sprintf("series %v", got)
		}
		// Kubelet measures every volumeStatsAggPeriod (10 s here): a
		// figure from before the pod's write is retried, not a failure.
		if int64(got["capacity"]) != size {
			return false, fmt.Sprintf("kubelet_volume_stats_capacity_bytes %v, df says %d", got["capacity"], size)
		}
		if d := got["used"] - float64(used); d < -(8<<20) || d > 8<<20 {
			return false, fmt.Sprintf("kubelet_volume_stats_used_bytes %v, df says %d", got["used"], used)
		}
		if got["used"] < 64<<20 {
			return false, fmt.Sprintf("kubelet_volume_stats_used_bytes %v after writing 64 MiB", got["used"])
		}
		t.Logf("kubelet volume stats %v (df: size %d used %d)", got, size, used)
		return true, ""
	})
	c.delete(t, "pod", "stats")
}

// TestMetricsNameTheClaim scrapes the plugin of a volume's node from a pod
// on that node, as a Prometheus in the cluster would: the volume's series
// carry the PVC's namespace and name (which the provisioner passes with
// --extra-create-metadata) beside the PV name, so they join
// kube-state-metrics without relabelling; the sparse file's allocated bytes,
// the node's free space and the build info are there too.
func TestMetricsNameTheClaim(t *testing.T) {
	c := requireChart(t)
	c.apply(t, pvc("metered", "64Mi", ""))
	c.startPod(t, pod{name: "metered", claim: "metered", restartNever: true,
		script: "dd if=/dev/urandom of=/data/f bs=1M count=4 conv=fsync 2>/dev/null"})
	c.waitPodPhase(t, "metered", "Succeeded", 2*time.Minute)
	node := c.volumeNode(t, "metered")
	pv := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "metered")
	ready, detail := c.pluginPods(t)
	if ready[node] == "" {
		t.Fatalf("no Ready plugin pod on %s:%s", node, detail)
	}
	ip := c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", ready[node])
	port := c.jsonpath(t, `{.spec.containers[?(@.name=="csi-fastblk")].ports[?(@.name=="metrics")].containerPort}`, "-n", pluginNS, "get", "pod", ready[node])
	if ip == "" || port == "" {
		t.Fatalf("plugin pod %s: IP %q, metrics port %q", ready[node], ip, port)
	}
	c.startPod(t, pod{name: "scrape", claim: "metered", node: node, restartNever: true,
		script: fmt.Sprintf("wget -q -O - http://%s/metrics", net.JoinHostPort(ip, port))})
	c.waitPodPhase(t, "scrape", "Succeeded", 2*time.Minute)
	metrics := c.logs(t, "scrape")
	claim := []string{`namespace="` + testNS + `"`, `persistentvolume="` + pv + `"`, `persistentvolumeclaim="metered"`}
	for _, name := range []string{"fastblk_volume_size_bytes", "fastblk_volume_allocated_bytes", "fastblk_volume_bytes_total"} {
		if !hasSeries(metrics, name, claim...) {
			t.Errorf("no %s series with %s in:\n%s", name, claim, grepLines(metrics, name))
		}
	}
	for _, name := range []string{"fastblk_node_filesystem_free_bytes", "fastblk_node_capacity_available_bytes", "fastblk_build_info"} {
		if !hasSeries(metrics, name) {
			t.Errorf("no %s series", name)
		}
	}
	// A new volume's counters count its own I/O only (mkfs, 4 MiB of
	// data): the kernel keeps a loop device's counters across detach and
	// re-attach, so a reused device once showed tens of GB here.
	for _, op := range []string{"read", "write", "discard"} {
		b, ok := sample(metrics, "fastblk_volume_bytes_total", append(claim, `op="`+op+`"`)...)
		if !ok || b > 4*64<<20 {
			t.Errorf("fastblk_volume_bytes_total op=%s of a new 64 MiB volume: %v (found %v), want at most 256 MiB", op, b, ok)
		}
	}
	t.Logf("the volume's series:\n%s", grepLines(metrics, `persistentvolumeclaim="metered"`))
	c.delete(t, "pod", "scrape", "metered")
	c.delete(t, "pvc", "metered")
}

// hasSeries reports whether the exposition text has a sample of metric
// name with every one of labels (each `key="value"`).
func hasSeries(text, name string, labels ...string) bool {
	_, ok := sample(text, name, labels...)
	return ok
}

// sample is the value of the first sample of metric name with every one of
// labels (each `key="value"`).
func sample(text, name string, labels ...string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		var set, value string
		switch {
		case len(labels) == 0 && strings.HasPrefix(l, name+" "):
			value = strings.TrimPrefix(l, name+" ")
		case strings.HasPrefix(l, name+"{"):
			set, value, _ = strings.Cut(strings.TrimPrefix(l, name+"{"), "} ")
		default:
			continue
		}
		have := strings.Split(set, ",")
		if slices.ContainsFunc(labels, func(want string) bool { return !slices.Contains(have, want) }) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		return v, err == nil
	}
	return 0, false
}

// grepLines is the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPluginRestartUnderIO deletes the plugin pod of the volume's node while
// a pod writes and verifies data: the DaemonSet brings it back and the I/O
// goes on without error; the volume can still be unpublished afterwards.
func TestPluginRestartUnderIO(t *testing.T) {
	c := requireChart(t)
	c.apply(t, pvc("io", "1Gi", ""))
	c.startPod(t, pod{name: "io", claim: "io", script: `i=0
while true; do
  i=$((i+1))
  if dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null &&
     dd if=/tmp/src of=/data/io bs=1M conv=fsync 2>/dev/null && cmp /tmp/src /data/io; then
    echo "ok $i"
  else
    echo "IOERROR $i"
  fi
  sleep 0.2
done`})
	c.waitPodPhase(t, "io", "Running", 2*time.Minute)
	node := c.volumeNode(t, "io")
	iterations := func() int { return c.lastIteration(t, "io") }
	eventually(t, time.Minute, "I/O running", func() (bool, string) { return iterations() >= 3, "" })
	ready, detail := c.pluginPods(t)
	old := ready[node]
	if old == "" {
		t.Fatalf("no ready plugin pod on %s:%s", node, detail)
	}
	capsBefore := c.capacityOwners(t)
	c.k(t, "-n", pluginNS, "delete", "pod", old, "--wait=true", "--timeout=120s")
	eventually(t, 3*time.Minute, "a new ready plugin pod on "+node, func() (bool, string) {
		ready, detail := c.pluginPods(t)
		return ready[node] != "" && ready[node] != old, detail
	})
	// The provisioners own their CSIStorageCapacity objects through the
	// DaemonSet (--capacity-ownerref-level=1): a pod restart keeps them.
	if capsAfter := c.capacityOwners(t); !maps.Equal(capsBefore, capsAfter) {
		t.Errorf("CSIStorageCapacity objects (uid: owner) changed across the plugin restart:\nbefore %v\nafter  %v", capsBefore, capsAfter)
	}
	for uid, owner := range capsBefore {
		if !strings.HasPrefix(owner, "DaemonSet/") {
			t.Errorf("CSIStorageCapacity %s is owned by %q, want the DaemonSet", uid, owner)
		}
	}
	after := iterations()
	eventually(t, time.Minute, "I/O to go on after the plugin restart", func() (bool, string) {
		n := iterations()
		return n >= after+5, fmt.Sprintf("iterations %d, at restart %d", n, after)
	})
	if logs := c.logs(t, "io"); strings.Contains(logs, "IOERROR") {
		t.Errorf("the workload saw I/O errors:\n%s", logs)
	}
	c.delete(t, "pod", "io")
}

// TestUpgradeUnderIO: helm upgrade that rolls the plugin DaemonSet (a
// changed pod annotation, as a new image would) while a pod writes 4 KiB
// blocks to a raw block volume and syncs each. On every upgrade the plugin
// pod of the volume's node is replaced; the test prints, per upgrade, how
// long that node had no Ready plugin pod (from the last poll that saw the
// old one Ready to the first that saw the new one: what a ublk volume's I/O
// would wait for at most in a cluster, since the new plugin re-adopts its
// devices before it is Ready) and the writer's longest gap between two
// completed writes (loop devices need no server, so only the writer's own
// jitter), then their medians. The workload must see no error and go on.
func TestUpgradeUnderIO(t *testing.T) {
	c := requireChart(t)
	chart := chartDir(t)
	c.apply(t, pvc("upg", "64Mi", "  volumeMode: Block\n"))
	c.startPod(t, pod{name: "upg", claim: "upg", block: true, script: `i=0
while true; do
  if dd if=/dev/urandom of=/dev/xvda bs=4k count=1 seek=$((i % 4096)) conv=fsync 2>/dev/null; then
    echo "ok $i"
  else
    echo "IOERROR $i"
  fi
  i=$((i+1))
  sleep 0.05
done`})
	c.waitPodPhase(t, "upg", "Running", 2*time.Minute)
	node := c.volumeNode(t, "upg")
	const upgrades = 3
	var windows, gaps []time.Duration
	for i := 1; i <= upgrades; i++ {
		before, detail := c.pluginPods(t)
		old := before[node]
		if old == "" {
			t.Fatalf("no Ready plugin pod on %s:%s", node, detail)
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			out, err := c.run("", "helm", "upgrade", release, chart, "--namespace", pluginNS, "--reuse-values",
				"--set-string", fmt.Sprintf("podAnnotations.e2e-upgrade=%d", i), "--wait", "--timeout", "5m")
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, out)
			}
			done <- err
		}()
		// Poll the node's plugin pod until the new one is Ready.
		lastOld, firstNew := start, time.Time{}
		for firstNew.IsZero() {
			if time.Since(start) > 5*time.Minute {
				t.Fatalf("upgrade %d: no new Ready plugin pod on %s after 5 min", i, node)
			}
			now := time.Now()
			ready, _ := c.pluginPods(t)
			switch p := ready[node]; {
			case p == old:
				lastOld = now
			case p != "":
				firstNew = now
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := <-done; err != nil {
			t.Fatalf("upgrade %d: helm upgrade: %v", i, err)
		}
		end := time.Now()
		gap := c.longestLogGap(t, "upg", start, end)
		windows = append(windows, firstNew.Sub(lastOld))
		gaps = append(gaps, gap)
		t.Logf("upgrade %d: helm upgrade --wait %v; node %s without a Ready plugin pod for %v; the writer's longest gap %v",
			i, end.Sub(start).Round(10*time.Millisecond), node, firstNew.Sub(lastOld).Round(10*time.Millisecond), gap.Round(time.Millisecond))
	}
	t.Logf("%d upgrades: node without a Ready plugin pod, median %v (worst %v); the writer's longest gap, median %v (worst %v)",
		upgrades, median(windows).Round(10*time.Millisecond), slices.Max(windows).Round(10*time.Millisecond),
		median(gaps).Round(time.Millisecond), slices.Max(gaps).Round(time.Millisecond))
	if logs := c.logs(t, "upg"); strings.Contains(logs, "IOERROR") {
		t.Errorf("the workload saw I/O errors during the upgrades:\n%s", lastLines(logs, 5))
	}
	c.delete(t, "pod", "upg")
	c.delete(t, "pvc", "upg")
}

// longestLogGap is the longest time between two lines a pod logged in
// [from, to] (by the container runtime's timestamps), counting from from
// to the first line and from the last line to to.
func (c *cluster) longestLogGap(t *testing.T, pod string, from, to time.Time) time.Duration {
	t.Helper()
	out := c.k(t, "-n", testNS, "logs", pod, "--timestamps", "--since-time="+from.UTC().Format(time.RFC3339))
	prev, longest := from, time.Duration(0)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		ts, _, _ := strings.Cut(l, " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		longest = max(longest, at.Sub(prev))
		prev = at
	}
	return max(longest, to.Sub(prev))
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestUpgradeModifyVolume: helm upgrade to a changed value (a rate-limit
// tier, a VolumeAttributesClass), then an in-use PVC is moved to the tier.
// The external-resizer's one elected instance sends ModifyVolume: where it
// lands on the volume's node and the backend has rate limits (ublk) the
// tier applies; on the loop backend (this host has no ublk) the refusal is
// an event on the PVC naming the backend and the volume's own node, for
// the volume of each node: its plugin answered the controller's plugin
// over the peer channel (issue 33). The PVC keeps its class.
func TestUpgradeModifyVolume(t *testing.T) {
	c := requireChart(t)
	chart := chartDir(t)
	out, err := c.run("", "helm", "upgrade", release, chart, "--namespace", pluginNS, "--reuse-values",
		"--set", "volumeAttributesClasses[0].name=gold", "--set", "volumeAttributesClasses[0].maxIOPS=1000",
		"--set-string", "volumeAttributesClasses[0].maxBandwidth=100Mi")
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	if d := c.jsonpath(t, "{.driverName} {.parameters.maxIOPS}", "get", "volumeattributesclass", "gold"); d != driver+" 1000" {
		t.Fatalf("VolumeAttributesClass gold after the upgrade: %q", d)
	}
	ready, detail := c.pluginPods(t)
	for _, n := range nodes {
		if ready[n] == "" {
			t.Fatalf("plugin pods not ready after the upgrade:%s", detail)
		}
	}
	leader, leaderNode := c.resizerLeader(t)
	t.Logf("external-resizer leader %q on %s", leader, leaderNode)
	// One in-use volume on each node: each node's plugin refuses the tier
	// for its backend, through the peer channel from the controller.
	for _, n := range nodes {
		claim := "vac-" + n
		c.apply(t, pvc(claim, "256Mi", ""))
		// A claim that names the class (or targets it with a pending
		// modify) keeps it from being deleted: gone when the test ends.
		t.Cleanup(func() {
			_, _ = c.kubectl("-n", testNS, "delete", "pvc", claim, "--ignore-not-found", "--wait=true", "--timeout=120s")
		})
		c.startPod(t, pod{name: claim, claim: claim, node: n, script: "sleep 3600"})
	}
	for _, n := range nodes {
		claim := "vac-" + n
		c.waitPodPhase(t, claim, "Running", 2*time.Minute)
		c.k(t, "-n", testNS, "patch", "pvc", claim, "--type=merge", "-p", `{"spec":{"volumeAttributesClassName":"gold"}}`)
	}
	for _, n := range nodes {
		claim := "vac-" + n
		// The answer of the volume's own node, which names itself.
		want := "on node " + n + ": rate limits (maxIOPS, maxBandwidth) need the ublk backend; this node serves volumes with loop"
		eventually(t, 2*time.Minute, "a clear refusal of the tier on PVC "+claim, func() (bool, string) {
			cur := c.jsonpath(t, "{.status.currentVolumeAttributesClassName} {.status.modifyVolumeStatus}", "-n", testNS, "get", "pvc", claim)
			if strings.HasPrefix(cur, "gold ") {
				t.Fatalf("PVC %s on %s reports class gold on the loop backend, which cannot apply it: %s", claim, n, cur)
			}
			ev, _ := c.kubectl("-n", testNS, "get", "events", "--field-selector", "involvedObject.kind=PersistentVolumeClaim,involvedObject.name="+claim,
				"-o", "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message", "--no-headers")
			for _, l := range strings.Split(ev, "\n") {
				if strings.HasPrefix(l, "Warning") && strings.Contains(l, "Modify") && strings.Contains(l, want) {
					t.Logf("%s on %s: refused with an event: %s (status %s)", claim, n, strings.Join(strings.Fields(l), " "), cur)
					return true, ""
				}
			}
			return false, "want an event saying " + want + "; status " + cur + "\nevents:\n" + ev
		})
	}
}

// TestControllerExpansionOnOtherNode: the chart advertises controller
// expansion, so the external-resizer (in the controller's pod) calls
// ControllerExpandVolume on the controller's plugin for every volume. A
// volume in use on the node the controller does not run on grows online:
// the controller's plugin forwards the call over the peer channel, the
// volume's plugin answers it (its log says so), and NodeExpandVolume
// grows the filesystem the pod sees. Before the peer channel this call
// failed with FailedPrecondition, which is why controller expansion was
// off.
func TestControllerExpansionOnOtherNode(t *testing.T) {
	c := requireChart(t)
	leader, leaderNode := c.resizerLeader(t)
	other := nodes[0]
	if other == leaderNode {
		other = nodes[1]
	}
	claim, name := "grow-peer", "grow-peer"
	c.xfsClass(t)
	c.apply(t, pvc(claim, "1Gi", "  storageClassName: fastblk-xfs\n"))
	t.Cleanup(func() {
		_, _ = c.kubectl("-n", testNS, "delete", "pvc", claim, "--ignore-not-found", "--wait=true", "--timeout=120s")
	})
	c.startPod(t, pod{name: name, claim: claim, node: other, script: "sleep 3600"})
	c.waitPodPhase(t, name, "Running", 2*time.Minute)
	if n := c.volumeNode(t, claim); n != other {
		t.Fatalf("volume on %s, want %s", n, other)
	}
	c.growTo2Gi(t, claim, name)
	handle := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", claim))
	pods, _ := c.pluginPods(t)
	leaderLog := c.containerLog(t, leader)
	if !strings.Contains(leaderLog, "forwarding to the volume's node") || !strings.Contains(leaderLog, handle) {
		t.Errorf("the controller's plugin on %s did not log forwarding %s:\n%s", leaderNode, handle, grepLines(leaderLog, "forward"))
	}
	ownerLog := c.containerLog(t, pods[other])
	if !strings.Contains(ownerLog, `"/fastblk.peer.v1.Peer/ExpandVolume"`) || !strings.Contains(ownerLog, "volume expanded") {
		t.Errorf("the plugin on %s did not serve the forwarded expansion:\n%s", other, grepLines(ownerLog, "expand"))
	}
}

// TestPeerRefusesStrangers: each node's plugin serves the peer channel on
// its pod address, and refuses, before any call reaches it, a client
// without a certificate, with one of another CA, with an expired one of
// the installation's CA, and with a valid one naming another namespace or
// another service account. A client with the installation's identity
// gets the plugin's own answer (an ID that is not its volume's refused),
// which proves the refusals are the plugin's and not the network's.
func TestPeerRefusesStrangers(t *testing.T) {
	c := requireChart(t)
	ca := c.peerCA(t)
	other, err := peer.NewCA("another installation", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := c.pluginPods(t)
	target, from := nodes[1], nodes[0]
	ip := c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", pods[target])
	addr := net.JoinHostPort(ip, "9815")
	self := peer.Identity{Namespace: pluginNS, ServiceAccount: release + "-node", Node: from}
	now := time.Now()
	// Every client trusts the installation's CA for the server's
	// certificate, so that what is refused is the certificate it shows.
	creds, err := peer.NewCredentials(ca, self, nil)
	if err != nil {
		t.Fatal(err)
	}
	config := func(issuer *peer.CA, id peer.Identity, from, to time.Time) *tls.Config {
		cfg := creds.ClientConfig(target)
		cert, err := issuer.Issue(id, from, to)
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		return cfg
	}
	valid := func(ca *peer.CA, id peer.Identity) *tls.Config {
		return config(ca, id, now.Add(-time.Minute), now.Add(time.Hour))
	}
	noCert := valid(ca, self)
	noCert.GetClientCertificate = nil
	// The plugin logs every call it serves (-v=2) with its request.
	calls := func() int {
		n := 0
		for _, l := range strings.Split(c.containerLog(t, pods[target]), "\n") {
			if strings.Contains(l, `"/fastblk.peer.v1.Peer/ModifyVolume"`) && strings.Contains(l, "not-a-volume") {
				n++
			}
		}
		return n
	}
	before := calls()
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no certificate", noCert},
		{"another CA", valid(other, self)},
		{"expired", config(ca, self, now.Add(-48*time.Hour), now.Add(-24*time.Hour))},
		{"another namespace", valid(ca, peer.Identity{Namespace: testNS, ServiceAccount: self.ServiceAccount, Node: from})},
		{"another service account", valid(ca, peer.Identity{Namespace: pluginNS, ServiceAccount: "default", Node: from})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := peerCall(t, from, addr, tc.cfg)
			if status.Code(err) != codes.Unavailable {
				t.Errorf("call: %v, want Unavailable (handshake refused)", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	if n := calls(); n != before {
		t.Errorf("the plugin on %s logged %d peer calls from refused clients", target, n-before)
	}
	// The installation's certificate opens the handshake, but without
	// the token of a plugin pod no call is served.
	err = peerCall(t, from, addr, valid(ca, self))
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("call with the installation's certificate and no token: %v, want Unauthenticated", err)
	}
	if n := calls(); n != before+1 {
		t.Errorf("the plugin on %s logged %d peer calls after the one with a certificate, want 1 (refused)", target, n-before)
	}
}

// peerCA is the installation's peer CA from its Secret, which the chart's
// peer-ca Job made of its own type.
func (c *cluster) peerCA(t *testing.T) *peer.CA {
	t.Helper()
	secret := c.k(t, "-n", pluginNS, "get", "secret", release+"-peer-ca", "-o", "jsonpath={.type} {.data.ca\\.crt} {.data.ca\\.key}")
	f := strings.Fields(secret)
	if len(f) != 3 || f[0] != peer.SecretType {
		t.Fatalf("peer CA secret: %.40q..., want type %s and a certificate and key", secret, peer.SecretType)
	}
	crtPEM, err1 := base64.StdEncoding.DecodeString(f[1])
	keyPEM, err2 := base64.StdEncoding.DecodeString(f[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("peer CA secret: %v %v", err1, err2)
	}
	ca, err := peer.ParseCA(crtPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestPeerNodeBoundIdentity runs issue 41's checks of a stolen node: with
// n1's plugin credentials (its projected token, read from its container,
// and the installation's transport certificate), from n1's plugin pod's
// own address, asking n2 for the data of a volume that no claim of n1
// uses is PermissionDenied naming the claim that does not ask for it, as
// is any class change (only the controller's pod may ask one); the same
// token speaking
// for n2 is refused, and so is the token used from anywhere but its pod;
// the node account may not create Secrets, nor move a claim to another
// node or change its spec.
func TestPeerNodeBoundIdentity(t *testing.T) {
	c := requireChart(t)
	from, target := nodes[0], nodes[1]
	c.apply(t, pvc("n2-only", "64Mi", ""))
	t.Cleanup(func() { c.delete(t, "pvc", "n2-only") })
	c.startPod(t, pod{name: "n2-only", claim: "n2-only", node: target, script: "echo ok > /data/f && sleep 3600"})
	c.waitPodPhase(t, "n2-only", "Running", 3*time.Minute)
	pv := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "n2-only")
	vol := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", pv)
	if !strings.HasSuffix(vol, "-"+target) {
		t.Fatalf("volume %s of the claim pinned to %s", vol, target)
	}

	pid, token, creds := c.pluginPeerCreds(t, from)
	pods, _ := c.pluginPods(t)
	addr := net.JoinHostPort(c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", pods[target]), "9815")
	fromPod := func() *grpc.ClientConn {
		return peerConn(t, dialFromPod(t, pid, addr), addr, creds.ClientConfig(target))
	}
	refused := func(what string, err error, code codes.Code, says string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v; want %v saying %q", what, err, code, says)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}

	refused("read of n2's volume for n2's claim", peerRead(fromPod(), token, from, vol, testNS+"/n2-only"),
		codes.PermissionDenied, "claim "+testNS+"/n2-only is not scheduled to node "+from)
	refused("read of n2's volume for no claim", peerRead(fromPod(), token, from, vol, ""), codes.PermissionDenied, "names no claim")
	refused("read for a claim that does not exist", peerRead(fromPod(), token, from, vol, testNS+"/nothing"),
		codes.PermissionDenied, "claim "+testNS+"/nothing does not exist")
	refused("class change by a node (only the controller changes volumes)", peerModify(fromPod(), token, from, vol, map[string]string{"maxIOPS": "10"}),
		codes.PermissionDenied, "only the controller changes and grows volumes")
	refused("n1's token speaking for n2", peerModify(fromPod(), token, target, vol, map[string]string{"maxIOPS": "10"}),
		codes.PermissionDenied, "the token is of node "+from+", not "+target)
	refused("n1's token speaking for n2, reading", peerRead(fromPod(), token, target, vol, testNS+"/n2-only"),
		codes.PermissionDenied, "the token is of node "+from+", not "+target)
	fromNode := peerConn(t, dialFromNode(t, from, addr), addr, creds.ClientConfig(target))
	refused("n1's token from n1's node, not its pod", peerModify(fromNode, token, from, vol, nil), codes.PermissionDenied, "not its address")
	// The token proves n1, and the plugin's own checks answer.
	refused("a name that is no volume", peerRead(fromPod(), token, from, "not-a-volume", testNS+"/n2-only"),
		codes.InvalidArgument, "not a volume ID of node "+target)

	out, err := c.kubectl("auth", "can-i", "create", "secrets", "-n", pluginNS, "--as=system:serviceaccount:"+pluginNS+":"+release+"-node")
	if strings.TrimSpace(out) != "no" {
		t.Errorf("kubectl auth can-i create secrets as the node account: %q (%v), want no", out, err)
	}
	out, err = c.kubectl("auth", "can-i", "create", "tokenreviews.authentication.k8s.io", "--as=system:serviceaccount:"+pluginNS+":"+release+"-node")
	if strings.TrimSpace(out) != "yes" {
		t.Errorf("kubectl auth can-i create tokenreviews as the node account: %q (%v), want yes", out, err)
	}
	// The node account's right to update claims (its sidecars') does not
	// let n1's API token move n2's claim to n1, or change what the claim
	// asks for (the chart's node-claims ValidatingAdmissionPolicy, which
	// reads the node the token names: an impersonated account names none
	// and is refused for that alone).
	// The account may update claims, not patch them: kubectl replace.
	n1 := c.stealNode(t, from, target)
	updateAsNode := func(change func(claim map[string]any)) error {
		var claim map[string]any
		if err := json.Unmarshal([]byte(c.k(t, "-n", testNS, "get", "pvc", "n2-only", "-o", "json")), &claim); err != nil {
			t.Fatal(err)
		}
		change(claim)
		b, err := json.Marshal(claim)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.run(string(b), "kubectl", "--kubeconfig="+n1.kubeconfig, "replace", "-f", "-")
		return err
	}
	err = updateAsNode(func(claim map[string]any) {
		claim["metadata"].(map[string]any)["annotations"].(map[string]any)["volume.kubernetes.io/selected-node"] = from
	})
	if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "selected-node") {
		t.Errorf("the node account moving n2's claim to %s: %v, want the policy's refusal", from, err)
	}
	err = updateAsNode(func(claim map[string]any) {
		claim["spec"].(map[string]any)["resources"] = map[string]any{"requests": map[string]any{"storage": "128Mi"}}
	})
	if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "may not change a claim's spec") {
		t.Errorf("the node account growing n2's claim: %v, want the policy's refusal", err)
	}
	if got := c.jsonpath(t, "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}", "-n", testNS, "get", "pvc", "n2-only"); got != target {
		t.Errorf("n2's claim is selected for %q after the refusals, want %s", got, target)
	}
}

// pluginPeerCreds are what a stolen node has of its plugin's peer
// credentials: its plugin process (pid, in whose pod's network namespace
// it calls), the plugin's projected peer token, read from its container,
// and a transport certificate for node from the installation's CA.
func (c *cluster) pluginPeerCreds(t *testing.T, node string) (pid int, token string, creds *peer.Credentials) {
	t.Helper()
	pid = c.pluginPID(t, node)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/fastblk.csi.io/peer/token", pid))
	if err != nil {
		t.Fatalf("%s's peer token: %v", node, err)
	}
	creds, err = peer.NewCredentials(c.peerCA(t), peer.Identity{Namespace: pluginNS, ServiceAccount: release + "-node", Node: node}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pid, strings.TrimSpace(string(b)), creds
}

// TestPeerFlood runs issue 41's flood on the cluster. With n1's plugin
// credentials, from n1's plugin pod's address, a peer opens 300 data
// streams of n2's snapshot at 1 B/s on 20 connections, for a claim that
// asks for that snapshot on n1 (it stays Pending: its class does not
// exist, so no provisioner takes it). n2's plugin accepts at most its limit
// per peer (4), holds no more open on the snapshot's file, and refuses the
// rest with ResourceExhausted at once; its threads, memory and descriptors
// stay bounded. While the flood holds its places (each accepted stream is
// read to its end at the least rate, 1 MiB/s, and opened again), n2 pulls
// n1's snapshot, restores its own snapshot, and a pod writes to its volume
// on n2; each is timed beside the same without the flood. With two nodes
// the flooder is the only other node: n1's own restore of n2's snapshot
// shares n1's places on n2, so it is refused while the flood holds (its
// claim's event says so; the provisioner retries the Unavailable) and
// completes once the flood stops. The figures are in docs/peer.md
// ("Bounded peers").
func TestPeerFlood(t *testing.T) {
	c := requireChart(t)
	const streams, conns, size = 300, 20, "512Mi"
	from, target := nodes[0], nodes[1]
	srcs := []string{"fl-src-" + from, "fl-src-" + target}
	snapFrom, snapTarget, snapLocal := "fl-snap-"+from, "fl-snap-"+target, "fl-snap-"+target+"-local"
	claims := append([]string{"fl-io", "fl-flood", "fl-pull0", "fl-pull1", "fl-local0", "fl-local1", "fl-own"}, srcs...)
	var snapFiles []string // the snapshots' files on the hosts
	// Registered first, so run last: after the pods' cleanups.
	t.Cleanup(func() { c.floodCleanup(t, claims, []string{snapFrom, snapTarget, snapLocal}, snapFiles) })

	// The sources: 256 MiB of data on each node, snapshotted (n2's twice:
	// one snapshot for the flood, one for n2's own restore, so that the
	// descriptors open on the flood's are the flood's alone), and a
	// volume on n2 for a pod's writes.
	write := "dd if=/dev/urandom of=/data/f bs=1M count=256 2>/dev/null; sha256sum /data/f > /data/f.sha256; sync"
	for i, n := range nodes {
		c.apply(t, pvc(srcs[i], size, ""))
		c.startPod(t, pod{name: "fl-w-" + n, claim: srcs[i], node: n, restartNever: true, script: write})
	}
	c.apply(t, pvc("fl-io", "2Gi", ""))
	c.startPod(t, pod{name: "fl-io", claim: "fl-io", node: target, script: "sleep 3600"})
	for _, n := range nodes {
		c.waitPodPhase(t, "fl-w-"+n, "Succeeded", 2*time.Minute)
		c.delete(t, "pod", "fl-w-"+n)
	}
	c.snapshotClaim(t, snapFrom, srcs[0])
	c.snapshotClaim(t, snapTarget, srcs[1])
	c.snapshotClaim(t, snapLocal, srcs[1])
	c.waitPodPhase(t, "fl-io", "Running", 2*time.Minute)
	handles := map[string]string{}
	for snap, n := range map[string]string{snapFrom: from, snapTarget: target, snapLocal: target} {
		content := c.jsonpath(t, "{.status.boundVolumeSnapshotContentName}", "-n", testNS, "get", "volumesnapshot", snap)
		handles[snap] = c.jsonpath(t, "{.status.snapshotHandle}", "get", "volumesnapshotcontent", content)
		_, file := c.objectFile(n, "snapshots", handles[snap])
		snapFiles = append(snapFiles, file)
	}
	handle := handles[snapTarget]
	fromSnap := func(snap string) string {
		return "  dataSource: {name: " + snap + ", kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io}\n"
	}
	snapID, _ := c.objectFile(target, "snapshots", handle)
	onSnap := "/snapshots/" + snapID + ".img" // the snapshot's file, as n2's plugin sees it

	// The flood's claim: n2's snapshot for n1, which authorizes n1's reads.
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: fl-flood
  namespace: %s
  annotations: {volume.kubernetes.io/selected-node: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: fl-no-such-class
  resources: {requests: {storage: %s}}
%s`, testNS, from, size, fromSnap(snapTarget)))

	// What n2 does beside the flood: a restore of n1's snapshot on n2 (n2
	// pulls from n1), a restore of n2's own snapshot on n2, each timed from
	// the claim to its pod's end and by n2's CreateVolume; and a pod's
	// 1 GiB of writes to its volume on n2, timed in the pod.
	pods, _ := c.pluginPods(t)
	restore := func(claim, snap string) (took, call time.Duration) {
		t.Helper()
		start := time.Now()
		c.apply(t, pvc(claim, size, fromSnap(snap)))
		c.startPod(t, pod{name: claim, claim: claim, node: target, restartNever: true, script: "sha256sum -c /data/f.sha256"})
		c.waitPodPhase(t, claim, "Succeeded", 4*time.Minute)
		took = time.Since(start)
		call = c.createVolumeTook(t, pods[target], claim)
		if logs := c.logs(t, claim); !strings.Contains(logs, "/data/f: OK") {
			t.Errorf("%s holds different data:\n%s", claim, logs)
		}
		if on := c.volumeNode(t, claim); on != target {
			t.Errorf("%s for a pod pinned to %s was provisioned on %s", claim, target, on)
		}
		c.delete(t, "pod", claim)
		c.delete(t, "pvc", claim)
		return took, call
	}
	type figures struct{ pull, pullCall, local, localCall, io time.Duration }
	measure := func(suffix string, between func(what string)) (f figures) {
		t.Helper()
		f.pull, f.pullCall = restore("fl-pull"+suffix, snapFrom)
		between("n2's pull of n1's snapshot")
		f.local, f.localCall = restore("fl-local"+suffix, snapLocal)
		between("n2's restore of its own snapshot")
		// /proc/uptime: seconds to the hundredth.
		out := c.k(t, "-n", testNS, "exec", "fl-io", "--", "sh", "-c", `set -e
a=$(cut -d' ' -f1 /proc/uptime)
dd if=/dev/zero of=/data/io bs=1M count=1024 conv=fsync 2>/dev/null
b=$(cut -d' ' -f1 /proc/uptime)
rm /data/io
echo "$a $b"`)
		var a, b float64
		if _, err := fmt.Sscan(lastLine(out), &a, &b); err != nil {
			t.Fatalf("the writes' times: %q: %v", out, err)
		}
		f.io = time.Duration((b - a) * float64(time.Second))
		between("the writes on n2")
		return f
	}
	srcPID := c.pluginPID(t, target)
	stats := func() procStats {
		t.Helper()
		s, err := readProcStats(srcPID, onSnap)
		if err != nil {
			t.Fatalf("n2's plugin process: %v", err)
		}
		return s
	}
	cpu := func(a, b procStats) string { return (b.CPU - a.CPU).Round(10 * time.Millisecond).String() }
	aloneStart, aloneFrom, aloneSampling := time.Now(), stats(), sampleProc(srcPID, onSnap)
	alone := measure("0", func(string) {})
	aloneTook, aloneCPU := time.Since(aloneStart), cpu(aloneFrom, stats())
	aloneMost, _ := aloneSampling()

	// The flood, from n1's plugin pod with n1's credentials.
	pid, token, creds := c.pluginPeerCreds(t, from)
	addr := net.JoinHostPort(c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", pods[target]), "9815")
	restarts := func() string {
		return c.jsonpath(t, `{.status.containerStatuses[?(@.name=="csi-fastblk")].restartCount}`, "-n", pluginNS, "get", "pod", pods[target])
	}
	restartsBefore := restarts()
	served := func() int { // the streams of the flood n2's plugin opened its source for
		return strings.Count(c.containerLog(t, pods[target]), `for="fl-flood-`)
	}
	servedBefore := served()
	// n2's plugin's CPU time in a quiet while, and in as long from the
	// flood's start (its streams answered, and the accepted ones sent).
	const window = 5 * time.Second
	quietFrom := stats()
	time.Sleep(window)
	before := stats()
	// Connected just before the flood: n2 closes a connection whose
	// handshake has not come within 10 s.
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i] = peerConn(t, dialFromPod(t, pid, addr), addr, creds.ClientConfig(target))
	}
	floodStart := time.Now()
	fl := startFlood(func(ctx context.Context) context.Context { return withPeerMD(ctx, token, from, testNS+"/fl-flood") },
		ccs, peer.ReadRequest{Kind: peer.SourceSnapshot, ID: handle, Target: "fl-flood", Rate: 1}, streams)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			fl.stop()
		}
	})
	burst := stats()
	sampling := sampleProc(srcPID, onSnap)
	time.Sleep(time.Until(floodStart.Add(window)))
	floodWindow := stats()
	t.Logf("flood: %d streams of n2's snapshot at 1 B/s from n1's plugin pod on %d connections, all answered in %v: %d accepted, refused %v (the slowest refusal %v): %s",
		streams, conns, fl.Answered.Round(time.Millisecond), fl.Accepted, fl.Refused, fl.Slowest.Round(time.Millisecond), fl.Refusal)
	limit := peer.DefaultLimits.MaxStreamsPerPeer
	if fl.Accepted < 1 || fl.Accepted > limit || fl.Refused[codes.ResourceExhausted] != streams-fl.Accepted {
		t.Fatalf("%d accepted, refused %v; want at most %d (and some) accepted, the rest ResourceExhausted", fl.Accepted, fl.Refused, limit)
	}
	if burst.OnFile != fl.Accepted {
		t.Errorf("n2's plugin has %d descriptors open on the snapshot's file after the flood's streams were answered, want %d (the accepted)", burst.OnFile, fl.Accepted)
	}
	holding := func(what string) {
		t.Helper()
		eventually(t, 10*time.Second, "the flood to hold its places after "+what, func() (bool, string) {
			h := fl.held.Load()
			return h == int64(fl.Accepted), fmt.Sprintf("%d streams held, %d accepted", h, fl.Accepted)
		})
	}
	floodedStart, floodedFrom := time.Now(), stats()
	flooded := measure("1", holding)
	floodedTook, floodedCPU := time.Since(floodedStart), cpu(floodedFrom, stats())

	// n1's own restore of n2's snapshot, in n1's places on n2.
	ownStart := time.Now()
	c.apply(t, pvc("fl-own", size, fromSnap(snapTarget)))
	c.startPod(t, pod{name: "fl-own", claim: "fl-own", node: from, restartNever: true, script: "sha256sum -c /data/f.sha256"})
	var refusal string
	eventually(t, 2*time.Minute, "n1's restore to be refused by n2 (its claim's event) or to complete", func() (bool, string) {
		ev := c.claimEvents("fl-own")
		if l := grepLines(ev, "data streams of this node"); l != "" {
			refusal = l
			return true, ""
		}
		phase, _ := c.kubectl("-n", testNS, "get", "pod", "fl-own", "-o", "jsonpath={.status.phase}")
		return phase == "Succeeded", "pod " + phase + ", claim's events:\n" + ev
	})
	stopAt := time.Now()
	most, least := sampling()
	during := stats()
	fl.stop()
	stopped = true
	floodTook := stopAt.Sub(floodStart)
	c.waitPodPhase(t, "fl-own", "Succeeded", 4*time.Minute)
	ownDone := time.Now()
	if logs := c.logs(t, "fl-own"); !strings.Contains(logs, "/data/f: OK") {
		t.Errorf("fl-own holds different data:\n%s", logs)
	}
	if on := c.volumeNode(t, "fl-own"); on != from {
		t.Errorf("fl-own for a pod pinned to %s was provisioned on %s", from, on)
	}
	c.delete(t, "pod", "fl-own")
	eventually(t, 30*time.Second, "n2's plugin to let go of the flood's connections", func() (bool, string) {
		s, err := readProcStats(srcPID, onSnap)
		return err == nil && s.OnFile == 0 && s.Sockets <= before.Sockets+5, fmt.Sprintf("%v, %d open on the snapshot: %v", s, s.OnFile, err)
	})
	after := stats()

	servedFlood := served() - servedBefore
	reopened := fl.reopened.Load()
	t.Logf("the flood held n2's places for %v: streams ended before the stop %v, opened again %d times; n2's plugin opened its source for %d of the flood's streams",
		floodTook.Round(time.Second), fl.Ended(), reopened, servedFlood)
	t.Logf("n2's plugin: most during the measurements below alone %v; before the flood %v; after its streams were answered %v, %d open on the snapshot; most during the flood (and the same measurements) %v, %d..%d open on the snapshot; after %v",
		aloneMost, before, burst, burst.OnFile, most, least, most.OnFile, after)
	t.Logf("n2's plugin's CPU time: %v in %v before the flood, %v in its first %v; %v in the %v of the measurements below alone, %v in their %v during the flood; %v in the whole flood (%v)",
		cpu(quietFrom, before), window, cpu(before, floodWindow), window, aloneCPU, aloneTook.Round(time.Second),
		floodedCPU, floodedTook.Round(time.Second), cpu(before, during), floodTook.Round(time.Second))
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("on n2, alone / during the flood: restore of n1's snapshot (a pull of 256 MiB of data) %v / %v (n2's CreateVolume %v / %v); restore of its own snapshot %v / %v (CreateVolume %v / %v); a pod's 1 GiB of writes (dd conv=fsync) %v / %v",
		alone.pull.Round(time.Second), flooded.pull.Round(time.Second), ms(alone.pullCall), ms(flooded.pullCall),
		alone.local.Round(time.Second), flooded.local.Round(time.Second), ms(alone.localCall), ms(flooded.localCall),
		ms(alone.io), ms(flooded.io))
	if refusal != "" {
		t.Logf("n1's own restore of n2's snapshot: refused during the flood (%s), bound and checked %v after the flood stopped (%v in all)",
			strings.Join(strings.Fields(refusal), " "), ownDone.Sub(stopAt).Round(time.Second), ownDone.Sub(ownStart).Round(time.Second))
	} else {
		t.Logf("n1's own restore of n2's snapshot completed during the flood, in %v (it took a place a flood's stream left at its end)",
			stopAt.Sub(ownStart).Round(time.Second))
	}
	if most.OnFile > limit {
		t.Errorf("n2's plugin had %d descriptors open on the snapshot's file during the flood, more than the %d streams one peer may have", most.OnFile, limit)
	}
	if servedFlood != fl.Accepted+int(reopened) {
		t.Errorf("n2's plugin logs %d of the flood's streams sent, the flood had %d accepted and %d opened again", servedFlood, fl.Accepted, reopened)
	}
	if r := restarts(); r != restartsBefore {
		t.Errorf("n2's plugin container restarted during the flood (restartCount %s, was %s)", r, restartsBefore)
	}
}

// createVolumeTook is how long the CreateVolume call that made claim's
// volume took in the plugin of pod (its log, at -v=2; the request names
// the claim, --extra-create-metadata).
func (c *cluster) createVolumeTook(t *testing.T, pod, claim string) time.Duration {
	t.Helper()
	for _, l := range strings.Split(c.containerLog(t, pod), "\n") {
		if !strings.Contains(l, `"call" method="/csi.v1.Controller/CreateVolume"`) || !strings.Contains(l, `\"`+claim+`\"`) {
			continue
		}
		if m := regexp.MustCompile(` duration="([^"]+)"`).FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatalf("CreateVolume of %s: %v", claim, err)
			}
			return d
		}
	}
	t.Fatalf("no CreateVolume of %s in the log of %s", claim, pod)
	return 0
}

// floodCleanup deletes TestPeerFlood's claims and snapshots (their pods
// are gone by then) and checks that nothing of them is left: no PV, no
// snapshot content, none of the snapshots' files, no volume on the nodes
// without a PV.
func (c *cluster) floodCleanup(t *testing.T, claims, snaps, snapFiles []string) {
	t.Helper()
	if _, err := c.kubectl(append([]string{"-n", testNS, "delete", "pvc", "--ignore-not-found", "--wait=true", "--timeout=180s"}, claims...)...); err != nil {
		t.Errorf("delete the flood test's claims: %v", err)
	}
	if _, err := c.kubectl(append([]string{"-n", testNS, "delete", "volumesnapshot", "--ignore-not-found", "--wait=true", "--timeout=180s"}, snaps...)...); err != nil {
		t.Errorf("delete the flood test's snapshots: %v", err)
	}
	ours := func(names string) []string {
		var left []string
		for _, n := range strings.Fields(names) {
			if slices.Contains(claims, n) || slices.Contains(snaps, n) {
				left = append(left, n)
			}
		}
		return left
	}
	eventually(t, 3*time.Minute, "the PVs and snapshot contents of the flood test to go", func() (bool, string) {
		pvs, err1 := c.kubectl("get", "pv", "-o", `jsonpath={range .items[*]}{.spec.claimRef.name}{"\n"}{end}`)
		vscs, err2 := c.kubectl("get", "volumesnapshotcontents", "-o", `jsonpath={range .items[*]}{.spec.volumeSnapshotRef.name}{"\n"}{end}`)
		left := append(ours(pvs), ours(vscs)...)
		return err1 == nil && err2 == nil && len(left) == 0, fmt.Sprintf("PVs or contents of %v left (%v %v)", left, err1, err2)
	})
	for _, f := range snapFiles {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("a snapshot's file of the flood test is left: %s (%v)", f, err)
		}
	}
	for _, n := range nodes {
		c.noVolumesWithoutPV(t, n)
	}
}

// resizerLeader waits for the controller's pod, where the
// external-resizer runs, to hold the resizer's lease, and returns the pod
// and its node. The lease may still name a pod an earlier test deleted,
// until the live one takes it over.
func (c *cluster) resizerLeader(t *testing.T) (leader, leaderNode string) {
	t.Helper()
	eventually(t, 2*time.Minute, "a running controller pod holding the external-resizer's lease", func() (bool, string) {
		out, err := c.kubectl("-n", pluginNS, "get", "lease", "external-resizer-"+strings.ReplaceAll(driver, ".", "-"), "-o", "jsonpath={.spec.holderIdentity}")
		if err != nil {
			return false, err.Error()
		}
		holder := strings.TrimSpace(out)
		pods, err := c.kubectl("-n", pluginNS, "get", "pods", "-l", "app.kubernetes.io/component=controller", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{"\n"}{end}`)
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Split(pods, "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[2] == "Running" && holder != "" && strings.HasPrefix(holder, f[0]) {
				leader, leaderNode = f[0], f[1]
			}
		}
		return leaderNode != "", "lease holder " + holder + ", controller pods:\n" + pods
	})
	return leader, leaderNode
}

// TestUninstallWithVolumeInUse: helm uninstall while a pod writes to a
// volume is refused by the chart's pre-delete check, which names the
// volume in its Job's log with the ways on. Helm then lists the release as
// "uninstalling" (it records a failed pre-delete hook) and refuses helm
// upgrade, but the plugin keeps serving; helm rollback to the printed
// revision makes it deployed again without restarting the plugin pods. The
// override that works after a refusal (the CSIDriver's annotation) then lets
// helm uninstall through: the plugin pods go, the workload keeps its
// mounted volume and its I/O goes on (on the loop backend the kernel's loop
// device needs no server), and the PV stays Bound. The chart is installed
// again on a cluster whose snapshot CRDs another owner manages (Helm leaves
// them alone), adopts the volume, and the pod and the PVC are deleted as
// usual (TestCleanup checks nothing is left).
func TestUninstallWithVolumeInUse(t *testing.T) {
	c := requireChart(t)
	chart := chartDir(t)
	c.apply(t, pvc("kept", "256Mi", ""))
	c.startPod(t, pod{name: "keeper", claim: "kept", script: `i=0
while true; do
  i=$((i+1))
  if dd if=/dev/urandom of=/tmp/src bs=64k count=16 2>/dev/null &&
     dd if=/tmp/src of=/data/io bs=64k conv=fsync 2>/dev/null && cmp /tmp/src /data/io; then
    echo "ok $i"
  else
    echo "IOERROR $i"
  fi
  sleep 0.2
done`})
	c.waitPodPhase(t, "keeper", "Running", 2*time.Minute)
	node := c.volumeNode(t, "kept")
	pv := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "kept")
	iterations := func() int { return c.lastIteration(t, "keeper") }
	ioGoesOn := func(t *testing.T, when string) {
		t.Helper()
		at := iterations()
		time.Sleep(10 * time.Second)
		if n := iterations(); n < at+5 {
			t.Errorf("I/O of the pod stopped %s: %d iterations, %d before", when, n, at)
		} else {
			t.Logf("%s the pod's I/O goes on: %d iterations in 10 s", when, n-at)
		}
		if logs := c.logs(t, "keeper"); strings.Contains(logs, "IOERROR") {
			t.Errorf("the workload saw I/O errors %s:\n%s", when, lastLines(logs, 5))
		}
	}
	revision := c.releaseRevision(t)
	uninstall := func() (string, error) {
		return c.run("", "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "3m")
	}

	t.Run("refused while a volume exists", func(t *testing.T) {
		before, _ := c.pluginPods(t)
		start := time.Now()
		out, err := uninstall()
		if err == nil {
			t.Fatalf("helm uninstall succeeded with volume %s in use:\n%s", pv, out)
		}
		t.Logf("helm uninstall refused after %v: %v", time.Since(start).Round(time.Second), err)
		if !strings.Contains(err.Error(), "uninstall-check") {
			t.Errorf("helm's error does not name the check's Job: %v", err)
		}
		logs := c.k(t, "-n", pluginNS, "logs", "job/"+release+"-uninstall-check")
		for _, want := range []string{"pv " + pv, "claim " + testNS + "/kept",
			"kubectl annotate csidriver " + driver + " fastblk.csi.io/allow-uninstall-with-volumes=true",
			fmt.Sprintf("helm rollback %s %d -n %s", release, revision, pluginNS)} {
			if !strings.Contains(logs, want) {
				t.Errorf("the check's log does not say %q:\n%s", want, logs)
			}
		}
		t.Logf("the check's log:\n%s", logs)
		if _, err := c.kubectl("get", "csidriver", driver); err != nil {
			t.Errorf("CSIDriver gone after a refused uninstall: %v", err)
		}
		if after, detail := c.pluginPods(t); after[node] == "" || after[node] != before[node] {
			t.Errorf("plugin pod on %s was %q, after the refused uninstall %q:%s", node, before[node], after[node], detail)
		}
		ioGoesOn(t, "after the refused uninstall")

		// What Helm leaves, as docs/upgrades.md and the check's log say
		// (a change here means they need updating), and the way back.
		if st := c.releaseStatus(t); st != "uninstalling" {
			t.Errorf("release status after the refused uninstall: %q; docs/upgrades.md says Helm leaves it \"uninstalling\"", st)
		}
		if out, err := c.run("", "helm", "upgrade", release, chart, "--namespace", pluginNS, "--reuse-values"); err == nil {
			t.Errorf("helm upgrade accepted the release after a refused uninstall; docs/upgrades.md says it refuses:\n%s", firstLines(out, 3))
		} else if !strings.Contains(err.Error(), "has no deployed releases") {
			t.Errorf("helm upgrade after the refused uninstall: %v; docs/upgrades.md quotes \"has no deployed releases\"", err)
		}
		if out, err := c.run("", "helm", "rollback", release, strconv.Itoa(revision), "--namespace", pluginNS, "--wait"); err != nil {
			t.Fatalf("helm rollback %d: %v\n%s", revision, err, out)
		}
		if st := c.releaseStatus(t); st != "deployed" {
			t.Errorf("release status after helm rollback %d: %q, want deployed", revision, st)
		}
		if after, detail := c.pluginPods(t); after[node] != before[node] {
			t.Errorf("helm rollback replaced the plugin pod on %s (%q, now %q):%s", node, before[node], after[node], detail)
		}
		if out, err := c.run("", "helm", "upgrade", release, chart, "--namespace", pluginNS, "--reuse-values"); err != nil {
			t.Errorf("helm upgrade after the rollback: %v\n%s", err, out)
		}
	})

	t.Run("override by the CSIDriver annotation", func(t *testing.T) {
		if _, err := uninstall(); err == nil {
			t.Fatal("helm uninstall went through after the rollback, without an override")
		}
		c.k(t, "annotate", "csidriver", driver, "fastblk.csi.io/allow-uninstall-with-volumes=true")
		if out, err := uninstall(); err != nil {
			vacs, _ := c.kubectl("get", "volumeattributesclasses", "-o", "custom-columns=NAME:.metadata.name,DELETING:.metadata.deletionTimestamp,FINALIZERS:.metadata.finalizers", "--no-headers")
			t.Fatalf("helm uninstall with the annotation: %v\n%s\nVolumeAttributesClasses:\n%s", err, out, vacs)
		}
		eventually(t, 2*time.Minute, "the plugin pods and the check's Job to go", func() (bool, string) {
			out, _ := c.kubectl("-n", pluginNS, "get", "pods,jobs", "-o", "name")
			return strings.TrimSpace(out) == "", out
		})
		ioGoesOn(t, "after helm uninstall with the override")
		for _, kind := range []string{"storageclass/fastblk", "csidriver/" + driver} {
			if _, err := c.kubectl("get", kind); err == nil {
				t.Errorf("%s is still there after helm uninstall", kind)
			}
		}
		if phase := c.jsonpath(t, "{.status.phase}", "get", "pv", pv); phase != "Bound" {
			t.Errorf("PV %s is %s after helm uninstall, want Bound (uninstall does not touch volumes)", pv, phase)
		}
		t.Logf("after helm uninstall: PV %s on %s still Bound, StorageClass and CSIDriver gone", pv, node)
	})
	if t.Failed() {
		return
	}

	// The CRDs the first install created are left by helm uninstall; mark
	// them as another release's, as on a cluster where a separate chart
	// installed them: helm install skips CRDs that exist, whoever owns them.
	for _, crd := range snapshotCRDs {
		c.k(t, "annotate", "--overwrite", "crd", crd, "meta.helm.sh/release-name=snapshot-crds", "meta.helm.sh/release-namespace=kube-system")
		c.k(t, "label", "--overwrite", "crd", crd, "app.kubernetes.io/managed-by=Helm")
	}
	out, err := c.run("", "helm", append([]string{"install", release, chart, "--namespace", pluginNS}, testInstallValues()...)...)
	if err != nil {
		t.Fatalf("helm install on a cluster whose snapshot CRDs another release owns: %v\n%s", err, out)
	}
	for _, crd := range snapshotCRDs {
		if owner := c.jsonpath(t, `{.metadata.annotations.meta\.helm\.sh/release-name}`, "get", "crd", crd); owner != "snapshot-crds" {
			t.Errorf("CRD %s changed owner to %q", crd, owner)
		}
	}
	c.waitPluginPods(t, 4*time.Minute)
	if logs := c.logs(t, "keeper"); strings.Contains(logs, "IOERROR") {
		t.Errorf("the workload saw I/O errors while the chart was reinstalled:\n%s", lastLines(logs, 5))
	}
	c.delete(t, "pod", "keeper")
	c.delete(t, "pvc", "kept")
	eventually(t, 2*time.Minute, "PV "+pv+" to go", func() (bool, string) {
		out, err := c.kubectl("get", "pv", pv, "-o", "name")
		return err != nil && strings.Contains(err.Error(), "NotFound"), out
	})
}

// helmStatus is what helm status says of the chart's release.
type helmStatus struct {
	Version int `json:"version"`
	Info    struct {
		Status string `json:"status"`
	} `json:"info"`
}

func (c *cluster) helmStatus(t *testing.T) helmStatus {
	t.Helper()
	out, err := c.run("", "helm", "status", release, "--namespace", pluginNS, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st helmStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("helm status: %v\n%s", err, out)
	}
	return st
}

// lastIteration is N of the last "ok N" or "IOERROR N" line a pod running
// an I/O loop printed (0 before the first).
func (c *cluster) lastIteration(t *testing.T, pod string) int {
	t.Helper()
	out, _ := c.kubectl("-n", testNS, "logs", pod, "--tail=1")
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// releaseStatus is the release's status (deployed, uninstalling, ...).
func (c *cluster) releaseStatus(t *testing.T) string { return c.helmStatus(t).Info.Status }

// releaseRevision is the release's current revision.
func (c *cluster) releaseRevision(t *testing.T) int { return c.helmStatus(t).Version }

// TestKubeletRegistration: the plugin registers itself with the kubelet
// (no node-driver-registrar): the driver is in each node's CSINode; a
// restarted kubelet registers it again from the socket the running plugin
// serves (no plugin restart); a new plugin pod registers too.
func TestKubeletRegistration(t *testing.T) {
	c := requireChart(t)
	registrations := func(n string) int {
		b, err := os.ReadFile(filepath.Join(c.work, "logs", n+"-kubelet.log"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "Register new plugin with name: "+driver)
	}
	restarts := func(pod string) string {
		return c.jsonpath(t, `{.status.containerStatuses[?(@.name=="csi-fastblk")].restartCount}`, "-n", pluginNS, "get", "pod", pod)
	}
	for _, n := range nodes {
		if d := c.jsonpath(t, "{.spec.drivers[*].name}", "get", "csinode", n); !strings.Contains(d, driver) {
			t.Fatalf("CSINode %s lists drivers %q, want %s", n, d, driver)
		}
	}

	t.Run("kubelet restart", func(t *testing.T) {
		ready, _ := c.pluginPods(t)
		pod, before, regs := ready["n1"], restarts(ready["n1"]), registrations("n1")
		if out, err := c.run("", "restart-kubelet", "n1"); err != nil {
			t.Fatalf("restart kubelet: %v\n%s", err, out)
		}
		eventually(t, 2*time.Minute, "n1's new kubelet to register the running plugin", func() (bool, string) {
			return registrations("n1") > regs, "no new registration in the kubelet's log"
		})
		c.k(t, "wait", "--for=condition=Ready", "node/n1", "--timeout=60s")
		if after := restarts(pod); after != before {
			t.Errorf("plugin pod %s restarted (%s -> %s) across a kubelet restart", pod, before, after)
		}
	})

	t.Run("new plugin pod", func(t *testing.T) {
		ready, _ := c.pluginPods(t)
		regs := registrations("n2")
		c.k(t, "-n", pluginNS, "delete", "pod", ready["n2"], "--wait=true", "--timeout=120s")
		c.waitPluginPods(t, 3*time.Minute)
		eventually(t, time.Minute, "n2's kubelet to register the new plugin pod", func() (bool, string) {
			return registrations("n2") > regs, "no new registration in the kubelet's log"
		})
	})
}

// TestLivenessRestartsUnregisteredPlugin: the kubelet probes the plugin's
// own /healthz. With its registration socket removed from the node's
// plugins_registry (the kubelet then drops the driver) the plugin is
// really unhealthy ("kubelet: not registered"): the kubelet restarts the
// container after its probe failed three times, and the new one registers
// again.
func TestLivenessRestartsUnregisteredPlugin(t *testing.T) {
	c := requireChart(t)
	ready, _ := c.pluginPods(t)
	pod := ready["n1"]
	if pod == "" {
		t.Fatal("no Ready plugin pod on n1")
	}
	restarts := func() int {
		n, _ := strconv.Atoi(c.jsonpath(t, `{.status.containerStatuses[?(@.name=="csi-fastblk")].restartCount}`, "-n", pluginNS, "get", "pod", pod))
		return n
	}
	before := restarts()
	sock := filepath.Join(c.nodeDir("n1"), "kubelet", "plugins_registry", driver+"-reg.sock")
	if err := os.Remove(sock); err != nil {
		t.Fatalf("remove the registration socket: %v", err)
	}
	start := time.Now()
	eventually(t, 3*time.Minute, "the kubelet to restart the plugin container", func() (bool, string) {
		return restarts() > before, fmt.Sprintf("restartCount %d", restarts())
	})
	t.Logf("plugin container restarted %v after its registration socket was removed", time.Since(start).Round(time.Second))
	ev := c.k(t, "-n", pluginNS, "get", "events", "--field-selector", "involvedObject.name="+pod, "-o",
		"custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers")
	if !strings.Contains(ev, "Liveness probe failed") {
		t.Errorf("no liveness failure in the pod's events:\n%s", ev)
	}
	c.waitPluginPods(t, 3*time.Minute)
	eventually(t, time.Minute, "the registration socket again", func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	})
	// The kubelet's plugin watcher finds the new socket, asks it for its
	// info and only then writes CSINode: the socket comes first.
	eventually(t, time.Minute, "CSINode n1 to list the driver again", func() (bool, string) {
		d := c.jsonpath(t, "{.spec.drivers[*].name}", "get", "csinode", "n1")
		return strings.Contains(d, driver), fmt.Sprintf("drivers %q", d)
	})
}

// TestCleanup deletes every pod, snapshot and PVC: no PV, snapshot content,
// volume file, mount or loop device may remain on the nodes.
func TestCleanup(t *testing.T) {
	c := requireChart(t)
	c.k(t, "-n", testNS, "delete", "pods", "--all", "--wait=true", "--timeout=180s")
	// PVCs first: one still being restored holds its snapshot.
	c.k(t, "-n", testNS, "delete", "pvc", "--all", "--wait=false")
	c.k(t, "-n", testNS, "delete", "volumesnapshots", "--all", "--wait=true", "--timeout=180s")
	eventually(t, 3*time.Minute, "every PVC, PV and VolumeSnapshotContent to go", func() (bool, string) {
		pvcs, _ := c.kubectl("-n", testNS, "get", "pvc", "-o", "name")
		pvs, _ := c.kubectl("get", "pv", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{\"\\n\"}{end}")
		vscs, _ := c.kubectl("get", "volumesnapshotcontents", "-o", "name")
		return strings.TrimSpace(pvcs+pvs+vscs) == "", "left: " + pvcs + pvs + vscs
	})
	for _, n := range nodes {
		for _, sub := range []string{"volumes", "snapshots"} {
			dir := filepath.Join(c.nodeDir(n), "data", sub)
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Errorf("node %s: %v", n, err)
				continue
			}
			for _, e := range ents {
				t.Errorf("node %s: %s/%s left behind", n, sub, e.Name())
			}
		}
		for _, l := range strings.Split(c.nodeMounts(t, n), "\n") {
			if strings.Contains(l, "kubernetes.io~csi") || strings.Contains(l, "/plugins/kubernetes.io/csi/") {
				t.Errorf("node %s: CSI mount left: %s", n, l)
			}
		}
	}
	if devs := loopDevicesUnder(t, c.work); len(devs) > 0 {
		t.Errorf("loop devices still attached to volume files: %v", devs)
	}
	if devs := staleLoopDevices(t, c.work); len(devs) > 0 {
		t.Errorf("loop devices left attached to deleted volume files (the plugin deleted the file, not the device): %v", devs)
	}
	c.k(t, "delete", "namespace", testNS, "--wait=true", "--timeout=120s")
}
