package k8s

// This file's name sorts after userpath_test.go on purpose (doc.go): its
// tests run after TestCleanup, so each makes its own namespaces and
// removes what it made.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// apiServer is where the harness's API server listens inside the
// cluster's network (hack/k8s/cluster.sh: the control plane's address).
const apiServer = "10.231.0.2:6443"

// victimNS is the tenant whose objects the stolen node attacks.
const victimNS = "bank"

var (
	pvRes       = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}
	pvcRes      = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	contentRes  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	capacityRes = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "csistoragecapacities"}
	leaseRes    = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	nodeRes     = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// stolenToken is one API token of a node's plugin pod, as root on that
// node reads it from a container's file system, and a client that uses
// it from the node's network.
type stolenToken struct {
	container, token string
	api              dynamic.Interface
}

// podTokens are the service account tokens of every container of node's
// plugin pod (the plugin's and each sidecar's), with clients that call the
// API server from node's network namespace, as a thief on the node would.
func (c *cluster) podTokens(t *testing.T, node string) []stolenToken {
	t.Helper()
	ready, detail := c.pluginPods(t)
	if ready[node] == "" {
		t.Fatalf("no ready plugin pod on %s:%s", node, detail)
	}
	uid := c.jsonpath(t, "{.metadata.uid}", "-n", pluginNS, "get", "pod", ready[node])
	ca, err := os.ReadFile(filepath.Join(c.work, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var toks []stolenToken
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !(strings.Contains(string(cg), uid) || strings.Contains(string(cg), strings.ReplaceAll(uid, "-", "_"))) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		name := filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0])
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "root", "var/run/secrets/kubernetes.io/serviceaccount/token"))
		if err != nil || seen[name] {
			continue // the pause container has no token
		}
		seen[name] = true
		tok := strings.TrimSpace(string(b))
		toks = append(toks, stolenToken{container: name, token: tok, api: nodeClient(t, node, tok, ca)})
	}
	sort.Slice(toks, func(i, j int) bool { return toks[i].container < toks[j].container })
	if len(toks) < 2 {
		t.Fatalf("found the tokens of %d containers of %s's plugin pod, want the plugin's and its sidecars'", len(toks), node)
	}
	return toks
}

// nodeClient is a client of the API server with token, connecting from
// node's network namespace.
func nodeClient(t *testing.T, node, token string, ca []byte) dynamic.Interface {
	t.Helper()
	cfg := &rest.Config{
		Host:            "https://" + apiServer,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns("/run/netns/fbk-k8s-"+node, addr)
		},
		Timeout: 30 * time.Second,
	}
	api, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// dialInNetns connects to addr from inside the network namespace of the
// file ns.
func dialInNetns(ns, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, its network namespace changed,
		// ends with this goroutine.
		runtime.LockOSThread()
		f, err := os.Open(ns)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}

// attack is one write a stolen node tries with each of its tokens.
type attack struct {
	name string
	do   func(ctx context.Context, api dynamic.Interface) error
	// resources are the "resource[/subresource]" rights of `kubectl auth
	// can-i --list` that the attack tries (finding 4: each write right
	// the node's account has must be tried).
	resources []string
}

// victims are what the attacks aim at: a tenant's claim on n2 with a pod
// writing to it, its PV and a snapshot's content (both of n2), a claim of
// the tenant that no pod uses yet (no node selected), and n2's capacity.
type victims struct {
	pv, content, capacity string
	pvHandle              string
	pendingUID            string
}

// setUpVictims makes the tenant's objects (namespace bank, removed when
// the test ends).
func (c *cluster) setUpVictims(t *testing.T) victims {
	t.Helper()
	target := nodes[1]
	c.apply(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+victimNS+"}\n")
	t.Cleanup(func() {
		_, _ = c.kubectl("delete", "namespace", victimNS, "--wait=true", "--timeout=180s")
	})
	claim := func(name string) string {
		return strings.Replace(pvc(name, "64Mi", ""), "namespace: "+testNS, "namespace: "+victimNS, 1)
	}
	c.apply(t, claim("ledger"))
	c.apply(t, claim("pending"))
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: ledger, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo ledger > /data/f && sync && sleep 3600"]
    volumeMounts: [{name: v, mountPath: /data}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: ledger}}]
`, victimNS, target, busybox))
	c.k(t, "-n", victimNS, "wait", "pod/ledger", "--for=condition=Ready", "--timeout=3m")
	var v victims
	v.pv = c.jsonpath(t, "{.spec.volumeName}", "-n", victimNS, "get", "pvc", "ledger")
	v.pvHandle = c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", v.pv)
	if !strings.HasSuffix(v.pvHandle, "-"+target) {
		t.Fatalf("the victim's volume %s is not on %s", v.pvHandle, target)
	}
	v.pendingUID = c.jsonpath(t, "{.metadata.uid}", "-n", victimNS, "get", "pvc", "pending")
	c.apply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: ledger, namespace: %s}
spec: {volumeSnapshotClassName: fastblk, source: {persistentVolumeClaimName: ledger}}
`, victimNS))
	c.k(t, "-n", victimNS, "wait", "volumesnapshot/ledger", "--for=jsonpath={.status.readyToUse}=true", "--timeout=2m")
	v.content = c.jsonpath(t, "{.status.boundVolumeSnapshotContentName}", "-n", victimNS, "get", "volumesnapshot", "ledger")
	caps := c.k(t, "-n", pluginNS, "get", "csistoragecapacities", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.nodeTopology.matchLabels.topology\.fastblk\.csi\.io/node}{"\n"}{end}`)
	for _, l := range strings.Split(caps, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] == target {
			v.capacity = f[0]
		}
	}
	if v.capacity == "" {
		t.Fatalf("no CSIStorageCapacity of %s:\n%s", target, caps)
	}
	return v
}

// merge is a JSON merge patch of obj.
func mergePatch(obj map[string]any) []byte {
	b, _ := json.Marshal(obj)
	return b
}

// stolenNodeAttacks are the writes of issue 53 that one stolen node (n1)
// tries on objects that are not its own: another node's (n2's) volume,
// snapshot and capacity, a tenant's claims, the cluster's PVs.
func stolenNodeAttacks(v victims) []attack {
	self, other := nodes[0], nodes[1]
	mergeP := func(res schema.GroupVersionResource, ns, name string, patch map[string]any, sub ...string) func(context.Context, dynamic.Interface) error {
		return func(ctx context.Context, api dynamic.Interface) error {
			_, err := api.Resource(res).Namespace(ns).Patch(ctx, name, types.MergePatchType, mergePatch(patch), metav1.PatchOptions{}, sub...)
			return err
		}
	}
	// update reads the object (the node account may) and writes it back
	// changed: the account may update claims, not patch them.
	update := func(res schema.GroupVersionResource, ns, name string, change func(u *unstructured.Unstructured)) func(context.Context, dynamic.Interface) error {
		return func(ctx context.Context, api dynamic.Interface) error {
			u, err := api.Resource(res).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(u)
			_, err = api.Resource(res).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{})
			return err
		}
	}
	create := func(res schema.GroupVersionResource, ns, manifest string) func(context.Context, dynamic.Interface) error {
		return func(ctx context.Context, api dynamic.Interface) error {
			var obj map[string]any
			if err := json.Unmarshal([]byte(manifest), &obj); err != nil {
				return err
			}
			_, err := api.Resource(res).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
			return err
		}
	}
	csiPV := func(name, handle, node, extra string) string {
		return fmt.Sprintf(`{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": %q},
 "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fastblk",
  "claimRef": {"namespace": %q, "name": "pending", "uid": %q},
  "csi": {"driver": %q, "volumeHandle": %q, "fsType": "ext4"%s},
  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": %q, "operator": "In", "values": [%q]}]}]}}}}`,
			name, victimNS, v.pendingUID, driver, handle, extra, topoKey, node)
	}
	otherHandle := "v" + strings.Repeat("7", 32) + "-" + other
	return []attack{
		{name: "release n2's PV (spec.claimRef.uid)", resources: []string{"persistentvolumes"},
			do: mergeP(pvRes, "", v.pv, map[string]any{"spec": map[string]any{"claimRef": map[string]any{"uid": "00000000-0000-0000-0000-000000000000"}}})},
		{name: "create a hostPath PV of /etc, pre-bound to the tenant's pending claim", resources: []string{"persistentvolumes"},
			do: create(pvRes, "", fmt.Sprintf(`{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "adv-hostpath"},
 "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fastblk", "hostPath": {"path": "/etc"},
  "claimRef": {"namespace": %q, "name": "pending", "uid": %q}}}`, victimNS, v.pendingUID))},
		{name: "create a PV of a volume of n2, pre-bound to the tenant's pending claim", resources: []string{"persistentvolumes"},
			do: create(pvRes, "", csiPV("adv-other-node", otherHandle, other, ""))},
		{name: "create a PV of n1 that names a Secret of kube-system", resources: []string{"persistentvolumes"},
			do: create(pvRes, "", csiPV("adv-secret", "v"+strings.Repeat("8", 32)+"-"+self, self,
				`, "nodePublishSecretRef": {"namespace": "kube-system", "name": "any"}`))},
		{name: "patch n2's snapshot content (spec.deletionPolicy)", resources: []string{"volumesnapshotcontents"},
			do: mergeP(contentRes, "", v.content, map[string]any{"spec": map[string]any{"deletionPolicy": "Retain"}})},
		{name: "take n2's snapshot content (label managed-by n1)", resources: []string{"volumesnapshotcontents"},
			do: mergeP(contentRes, "", v.content, map[string]any{"metadata": map[string]any{"labels": map[string]any{"snapshot.storage.kubernetes.io/managed-by": self}}})},
		{name: "update n2's snapshot content (its finalizers dropped)", resources: []string{"volumesnapshotcontents"},
			do: update(contentRes, "", v.content, func(u *unstructured.Unstructured) { u.SetFinalizers(nil) })},
		{name: "patch n2's snapshot content status (snapshotHandle)", resources: []string{"volumesnapshotcontents/status"},
			do: mergeP(contentRes, "", v.content, map[string]any{"status": map[string]any{"snapshotHandle": "s" + strings.Repeat("9", 32) + "-" + other}}, "status")},
		{name: "clear the selected node of the tenant's claim on n2", resources: []string{"persistentvolumeclaims"},
			do: update(pvcRes, victimNS, "ledger", func(u *unstructured.Unstructured) {
				a := u.GetAnnotations()
				delete(a, "volume.kubernetes.io/selected-node")
				u.SetAnnotations(a)
			})},
		{name: "set the selected node of the tenant's pending claim to n1", resources: []string{"persistentvolumeclaims"},
			do: update(pvcRes, victimNS, "pending", func(u *unstructured.Unstructured) {
				a := u.GetAnnotations()
				if a == nil {
					a = map[string]string{}
				}
				a["volume.kubernetes.io/selected-node"] = self
				u.SetAnnotations(a)
			})},
		{name: "patch the status of the tenant's claim on n2", resources: []string{"persistentvolumeclaims/status"},
			do: mergeP(pvcRes, victimNS, "ledger", map[string]any{"status": map[string]any{"capacity": map[string]any{"storage": "1Ti"}}}, "status")},
		{name: "raise n2's CSIStorageCapacity", resources: []string{"csistoragecapacities"},
			do: mergeP(capacityRes, pluginNS, v.capacity, map[string]any{"capacity": "1Pi"})},
		{name: "create a CSIStorageCapacity for n2", resources: []string{"csistoragecapacities"},
			do: create(capacityRes, pluginNS, fmt.Sprintf(`{"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
 "metadata": {"name": "adv-capacity"}, "storageClassName": "fastblk", "capacity": "1Pi",
 "nodeTopology": {"matchLabels": {%q: %q}}}`, topoKey, other))},
		{name: "delete n2's CSIStorageCapacity", resources: []string{"csistoragecapacities"},
			do: func(ctx context.Context, api dynamic.Interface) error {
				return api.Resource(capacityRes).Namespace(pluginNS).Delete(ctx, v.capacity, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			}},
		{name: "relabel n2's Node (its backend label, and a label pods select)", resources: []string{"nodes"},
			do: mergeP(nodeRes, "", other, map[string]any{"metadata": map[string]any{"labels": map[string]any{driver + "/backend": "loop", "adv-draw": "n1"}}})},
		{name: "take the external-resizer's leader lease", resources: []string{"leases"},
			do: create(leaseRes, pluginNS, `{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "adv-lease"},
 "spec": {"holderIdentity": "n1"}}`)},
		// Last: it ends the victim's PV (its protection finalizer holds
		// it while the claim is bound, then it goes).
		{name: "delete n2's PV", resources: []string{"persistentvolumes"},
			do: func(ctx context.Context, api dynamic.Interface) error {
				return api.Resource(pvRes).Delete(ctx, v.pv, metav1.DeleteOptions{})
			}},
	}
}

// groupContentVictim makes a VolumeGroupSnapshotContent of n2 (as an
// administrator, pre-provisioned: no group snapshot needs to exist for
// the attacks on it), where the cluster serves them, and returns its
// resource and name.
func (c *cluster) groupContentVictim(t *testing.T) (groupVictim, bool) {
	t.Helper()
	ver, err := c.kubectl("get", "crd", "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io",
		"-o", `jsonpath={range .spec.versions[?(@.storage==true)]}{.name}{end}`)
	if err != nil || strings.TrimSpace(ver) == "" {
		return groupVictim{}, false
	}
	g := groupVictim{res: schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: strings.TrimSpace(ver),
		Resource: "volumegroupsnapshotcontents"}, name: "adv-group-" + nodes[1],
		classRes: schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: strings.TrimSpace(ver),
			Resource: "volumegroupsnapshotclasses"}, class: "adv-group-class"}
	// A group snapshot class of the driver that no node may rewrite
	// (the chart's own, fastblk, the plugins take in turn).
	c.apply(t, fmt.Sprintf(`apiVersion: groupsnapshot.storage.k8s.io/%s
kind: VolumeGroupSnapshotClass
metadata: {name: %s}
driver: %s
deletionPolicy: Retain
parameters: {tier: gold}
`, g.res.Version, g.class, driver))
	t.Cleanup(func() { _, _ = c.kubectl("delete", "volumegroupsnapshotclasses", g.class, "--ignore-not-found") })
	c.apply(t, fmt.Sprintf(`apiVersion: groupsnapshot.storage.k8s.io/%s
kind: VolumeGroupSnapshotContent
metadata: {name: %s}
spec:
  deletionPolicy: Retain
  driver: %s
  source: {groupSnapshotHandles: {volumeGroupSnapshotHandle: g%s-%s, volumeSnapshotHandles: [s%s-%s]}}
  volumeGroupSnapshotRef: {name: adv-group, namespace: %s}
`, g.res.Version, g.name, driver, strings.Repeat("1", 32), nodes[1], strings.Repeat("2", 32), nodes[1], victimNS))
	t.Cleanup(func() { _, _ = c.kubectl("delete", "volumegroupsnapshotcontents", g.name, "--ignore-not-found") })
	return g, true
}

// groupVictim is a VolumeGroupSnapshotContent of n2 and a group
// snapshot class of the driver.
type groupVictim struct {
	res, classRes schema.GroupVersionResource
	name, class   string
}

// groupContentAttacks change n2's group snapshot content.
func groupContentAttacks(g groupVictim) []attack {
	patch := func(p map[string]any, sub ...string) func(context.Context, dynamic.Interface) error {
		return func(ctx context.Context, api dynamic.Interface) error {
			_, err := api.Resource(g.res).Patch(ctx, g.name, types.MergePatchType, mergePatch(p), metav1.PatchOptions{}, sub...)
			return err
		}
	}
	return []attack{
		{name: "patch n2's group snapshot content (spec.deletionPolicy)", resources: []string{"volumegroupsnapshotcontents"},
			do: patch(map[string]any{"spec": map[string]any{"deletionPolicy": "Delete"}})},
		{name: "patch n2's group snapshot content status (its handle)", resources: []string{"volumegroupsnapshotcontents/status"},
			do: patch(map[string]any{"status": map[string]any{"volumeGroupSnapshotHandle": "g" + strings.Repeat("3", 32) + "-" + nodes[1]}}, "status")},
		// Parameters and deletion policy are immutable by the CRD; the
		// default-class annotation would send every group snapshot that
		// names no class to this one.
		{name: "make a group snapshot class the default", resources: []string{"volumegroupsnapshotclasses"},
			do: func(ctx context.Context, api dynamic.Interface) error {
				_, err := api.Resource(g.classRes).Patch(ctx, g.class, types.MergePatchType,
					mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
						"groupsnapshot.storage.kubernetes.io/is-default-class": "true"}}}), metav1.PatchOptions{})
				return err
			}},
	}
}

// outcome runs a on every token and says how each ended; refused is true
// when every token was refused (403: RBAC or an admission policy).
func (a attack) outcome(toks []stolenToken) (refused bool, how []string) {
	refused = true
	if a.do == nil {
		return true, []string{"not tried"}
	}
	for _, tok := range toks {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := a.do(ctx, tok.api)
		cancel()
		switch {
		case err == nil:
			refused = false
			how = append(how, tok.container+": SUCCEEDED")
		case apierrors.IsForbidden(err):
			how = append(how, tok.container+": refused: "+firstLine(err.Error()))
		default:
			refused = false
			how = append(how, tok.container+": not refused but failed: "+firstLine(err.Error()))
		}
	}
	return refused, how
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// canIList is `kubectl auth can-i --list` with token, in the plugin's
// namespace and in a tenant's ("default"), each rule as "<namespace>:
// resource [urls] [names] [verbs]" (the cluster-wide rules show in both).
func (c *cluster) canIList(t *testing.T, token string) []string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {certificate-authority: %s, server: "https://127.0.0.1:6443"}}]
users: [{name: stolen, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: stolen}}]
current-context: e2e
`, filepath.Join(c.work, "pki", "ca.crt"), token)), 0o600); err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, ns := range []string{pluginNS, "default"} {
		// The last --kubeconfig wins over cluster.sh's admin one.
		out := c.k(t, "auth", "can-i", "--list", "-n", ns, "--kubeconfig="+kc)
		for i, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if i > 0 { // the header
				rules = append(rules, ns+": "+strings.Join(strings.Fields(l), " "))
			}
		}
	}
	return rules
}

// writeVerbs are the verbs that change objects.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "*"}

// writeRights are the resources of rules that grant a write verb (rules
// as canIList gives them: "<namespace>: resource [urls] [names] [verbs]").
func writeRights(rules []string) []string {
	var res []string
	for _, r := range rules {
		_, r, _ = strings.Cut(r, ": ")
		if strings.HasPrefix(r, "[") { // a non-resource URL
			continue
		}
		verbs := strings.Fields(strings.Trim(r[strings.LastIndex(r, "["):], "[]"))
		if slices.ContainsFunc(verbs, func(v string) bool { return slices.Contains(writeVerbs, v) }) {
			res = append(res, strings.Fields(r)[0])
		}
	}
	return res
}

// notObjects are write rights that change no object of a node or a
// tenant: reviews the API server answers and forgets, and events, which
// every kubelet may write too (the bar NodeRestriction sets).
var notObjects = []string{"tokenreviews.authentication.k8s.io", "subjectaccessreviews.authorization.k8s.io",
	"selfsubjectaccessreviews.authorization.k8s.io", "selfsubjectrulesreviews.authorization.k8s.io",
	"selfsubjectreviews.authentication.k8s.io", "events", "events.events.k8s.io"}

// TestStolenNodeWritesOnlyItsOwn is issue 53's adversary suite on the API
// side: with every API token of n1's plugin pod (the plugin's and each
// sidecar's, read from the containers' files as root on n1 would) and
// from n1's network, each write of the issue on objects that are not n1's
// is tried: n2's PV released (its claimRef's uid) and deleted, PVs made
// (a hostPath of /etc, a volume of n2, one naming a Secret) pre-bound to a
// tenant's pending claim, n2's snapshot content changed (spec, labels,
// finalizers, status), the claim policy walked around (the selected node
// cleared, then set where there is none; the claim's status), n2's
// capacity raised, made and deleted, the resizer's lease taken. Each must
// be refused (403) with every token. Every write right that `kubectl auth
// can-i --list` shows for a token must be tried by one of the attacks
// (finding 4), but for the rights that change no node's or tenant's
// object (reviews, events).
func TestStolenNodeWritesOnlyItsOwn(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	v := c.setUpVictims(t)
	toks := c.podTokens(t, nodes[0])
	t.Cleanup(func() {
		for _, pv := range []string{"adv-hostpath", "adv-other-node", "adv-secret"} {
			_, _ = c.kubectl("delete", "pv", pv, "--ignore-not-found", "--wait=false")
		}
		_, _ = c.kubectl("-n", pluginNS, "delete", "csistoragecapacities", "adv-capacity", "--ignore-not-found")
		_, _ = c.kubectl("-n", pluginNS, "delete", "lease", "adv-lease", "--ignore-not-found")
	})
	for _, tok := range toks {
		if node := c.tokenNode(t, tok.token); node != nodes[0] {
			t.Errorf("the token of %s names node %q, want %s: admission scopes a node's writes by it", tok.container, node, nodes[0])
		}
	}
	attacks := stolenNodeAttacks(v)
	if group, ok := c.groupContentVictim(t); ok {
		attacks = append(attacks, groupContentAttacks(group)...)
	} else {
		t.Log("the cluster serves no VolumeGroupSnapshotContents: the attacks on them are left out, their rights moot")
		attacks = append(attacks, attack{name: "(VolumeGroupSnapshotContents: not served)",
			resources: []string{"volumegroupsnapshotcontents", "volumegroupsnapshotcontents/status", "volumegroupsnapshotclasses"}})
	}
	tried := map[string]bool{}
	for _, a := range attacks {
		for _, r := range a.resources {
			tried[r] = true
		}
	}
	for _, tok := range toks {
		rules := c.canIList(t, tok.token)
		t.Logf("kubectl auth can-i --list with the token of %s:\n  %s", tok.container, strings.Join(rules, "\n  "))
		for _, r := range writeRights(rules) {
			if slices.Contains(notObjects, r) {
				continue
			}
			// The attacks name a resource without its group.
			res, sub, _ := strings.Cut(r, "/")
			res, _, _ = strings.Cut(res, ".")
			if sub != "" {
				res += "/" + sub
			}
			if !tried[res] {
				t.Errorf("the token of %s may write %s, and no attack tries it", tok.container, r)
			}
		}
	}
	var report strings.Builder
	for _, a := range attacks {
		refused, how := a.outcome(toks)
		verdict := "REFUSED"
		if !refused {
			verdict = "NOT REFUSED"
			t.Errorf("%s: not refused:\n  %s", a.name, strings.Join(how, "\n  "))
		}
		fmt.Fprintf(&report, "\n%-11s %s\n  %s", verdict, a.name, strings.Join(how, "\n  "))
	}
	t.Logf("what n1's tokens tried, from n1's network:%s", report.String())
	if got := c.jsonpath(t, "{.status.phase}", "-n", victimNS, "get", "pvc", "ledger"); got != "Bound" {
		t.Errorf("the tenant's claim is %s after the attacks, want Bound", got)
	}
	if got := c.jsonpath(t, "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}", "-n", victimNS, "get", "pvc", "pending"); got != "" {
		t.Errorf("the tenant's pending claim is selected for %q after the attacks, want no node", got)
	}
}

// tokenNode is the node a token names to the API server (a TokenReview's
// user extra authentication.kubernetes.io/node-name), which the node
// policies read from the request's user.
func (c *cluster) tokenNode(t *testing.T, token string) string {
	t.Helper()
	out, err := c.run(fmt.Sprintf(`{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": %q}}`, token),
		"kubectl", "create", "-f", "-", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Status struct {
			Authenticated bool
			User          struct{ Extra map[string][]string }
		}
	}
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		t.Fatal(err)
	}
	if n := tr.Status.User.Extra["authentication.kubernetes.io/node-name"]; tr.Status.Authenticated && len(n) == 1 {
		return n[0]
	}
	return ""
}

// TestNodeAccountRights compares what each API token of n1's plugin pod
// may do (`kubectl auth can-i --list` in the plugin's namespace and in a
// tenant's) with the allowlist kept in testdata/node-account.can-i, whose
// comments say which admission policy scopes each write to the writer's
// own node.
func TestNodeAccountRights(t *testing.T) {
	c := requireChart(t)
	b, err := os.ReadFile("testdata/node-account.can-i")
	if err != nil {
		t.Error(err) // and show what the tokens may do
	}
	var want []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			want = append(want, strings.Join(strings.Fields(l), " "))
		}
	}
	for _, tok := range c.podTokens(t, nodes[0]) {
		got := rightsOf(c.canIList(t, tok.token))
		if !slices.Equal(got, want) {
			t.Errorf("kubectl auth can-i --list with the token of %s differs from testdata/node-account.can-i:\n  %s\nwant:\n  %s",
				tok.container, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}

// rightsOf turns canIList's rules into one line per namespace, resource
// (or URL) and resource names, its verbs merged and sorted, the lines
// sorted: "<namespace> <resource> [names]: verb ...".
func rightsOf(rules []string) []string {
	verbs := map[string]map[string]bool{}
	for _, r := range rules {
		ns, r, _ := strings.Cut(r, ": ")
		// "resource [urls] [names] [verbs]", or "[urls] [names] [verbs]".
		var groups []string
		rest := r
		for {
			i := strings.Index(rest, "[")
			j := strings.Index(rest, "]")
			if i < 0 || j < i {
				break
			}
			groups = append(groups, rest[i+1:j])
			rest = rest[j+1:]
		}
		if len(groups) < 3 {
			continue
		}
		what := strings.TrimSpace(r[:strings.Index(r, "[")])
		if what == "" { // a non-resource URL
			what = groups[0]
		}
		key := ns + " " + what + " [" + groups[len(groups)-2] + "]"
		if verbs[key] == nil {
			verbs[key] = map[string]bool{}
		}
		for _, v := range strings.Fields(groups[len(groups)-1]) {
			verbs[key][v] = true
		}
	}
	var out []string
	for k, vs := range verbs {
		out = append(out, k+": "+strings.Join(slices.Sorted(maps.Keys(vs)), " "))
	}
	sort.Strings(out)
	return out
}
