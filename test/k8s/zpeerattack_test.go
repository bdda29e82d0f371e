package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/peer"
)

// The peer channel from the adversary's side (issue 53, findings 1, 2, 5
// and 6): n1 is stolen, and the attacker holds what n1's plugin pod holds
// (its peer token and its API token, read from its container, and the
// installation's CA, which every node reads), calls from n1's plugin
// pod's address, and has a tenant's account in a namespace of its own
// (shopNS: claims, pods and snapshots there). The victim is a tenant in
// testNS whose claim lives on n2. Each attack read the victim's data or
// filled n2's disk on the main of 2026-12-10 (a8c7a63); each is refused
// now. The file sorts after userpath_test.go, so it runs after TestCleanup
// and makes and removes its own objects.

const (
	shopNS    = "e2e-shop"
	asTenant  = "--as=system:serviceaccount:" + shopNS + ":tenant"
	noClass   = "e2e-no-such-class" // a class no provisioner serves: the attacker's claims stay Pending
	selectedN = "volume.kubernetes.io/selected-node"
)

// stolenNode is what an attacker holds of node's plugin pod, aimed at
// the plugin of target.
type stolenNode struct {
	c                  *cluster
	node, target, addr string // addr: target's peer port
	pid                int    // node's plugin process (calls go from its pod's network)
	peerToken          string
	creds              *peer.Credentials
	kubeconfig         string // the plugin container's API token, as a kubeconfig
}

func (c *cluster) stealNode(t *testing.T, node, target string) *stolenNode {
	t.Helper()
	s := &stolenNode{c: c, node: node, target: target}
	s.pid, s.peerToken, s.creds = c.pluginPeerCreds(t, node)
	pods, _ := c.pluginPods(t)
	s.addr = c.jsonpath(t, "{.status.podIP}", "-n", pluginNS, "get", "pod", pods[target]) + ":9815"
	api, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/kubernetes.io/serviceaccount/token", s.pid))
	if err != nil {
		t.Fatalf("%s's API token: %v", node, err)
	}
	s.kubeconfig = filepath.Join(t.TempDir(), node+".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {certificate-authority: %s, server: "https://127.0.0.1:6443"}}]
users: [{name: stolen, user: {token: %s}}]
contexts: [{name: e2e, context: {cluster: e2e, user: stolen}}]
current-context: e2e
`, filepath.Join(c.work, "pki", "ca.crt"), strings.TrimSpace(string(api)))
	if err := os.WriteFile(s.kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := s.kubectl("auth", "whoami", "-o", "json")
	var who struct {
		Status struct {
			UserInfo struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err != nil || json.Unmarshal([]byte(out), &who) != nil {
		t.Fatalf("%s's API token: %v\n%s", node, err, out)
	}
	u := who.Status.UserInfo
	t.Logf("the attacker holds %s's plugin pod's tokens: the API server takes its API token for %s of node %v; it calls %s's plugin at %s from %s's pod",
		node, u.Username, u.Extra["authentication.kubernetes.io/node-name"], target, s.addr, node)
	return s
}

// kubectl runs kubectl with the stolen API token (the later --kubeconfig
// wins over cluster.sh's admin one).
func (s *stolenNode) kubectl(args ...string) (string, error) {
	return s.c.kubectl(append([]string{"--kubeconfig=" + s.kubeconfig}, args...)...)
}

// conn is a connection to target's peer port from node's plugin pod.
func (s *stolenNode) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	return peerConn(t, dialFromPod(t, s.pid, s.addr), s.addr, s.creds.ClientConfig(s.target))
}

// read streams source (kind) from target for claim as node and says
// whether its data held marker, and how many bytes came.
func (s *stolenNode) read(t *testing.T, kind peer.SourceKind, source, claim, marker string) (found bool, n int, err error) {
	t.Helper()
	ctx, cancel := asNode(s.peerToken, s.node, claim)
	defer cancel()
	st, err := dataStream(ctx, s.conn(t), &peer.ReadRequest{Kind: kind, ID: source, Target: "pvc-attack", Rate: 200 << 20})
	for err == nil {
		var f peer.Frame
		if err = st.RecvMsg(&f); err == nil && f.Type == peer.FrameData {
			n += len(f.Data)
			found = found || bytes.Contains(f.Data, []byte(marker))
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return found, n, err
}

// attackOutcome reports an attack: refused with PermissionDenied (logged),
// or a failure of the test naming what the attacker got.
func attackOutcome(t *testing.T, tried string, err error, got string) {
	t.Helper()
	if err != nil && status.Code(err) == codes.PermissionDenied {
		t.Logf("tried: %s\n  refused: %v", tried, err)
		return
	}
	t.Errorf("tried: %s\n  NOT REFUSED (%v): %s", tried, err, got)
}

// tenantApply applies manifest as shop's tenant.
func (c *cluster) tenantApply(t *testing.T, manifest string) {
	t.Helper()
	if out, err := c.run(manifest, "kubectl", "apply", asTenant, "-f", "-"); err != nil {
		t.Fatalf("as shop's tenant: %v\n%s\n%s", err, out, manifest)
	}
}

// shopTenant makes shopNS and its tenant's account: claims, pods and
// snapshots in shopNS, nothing else.
func (c *cluster) shopTenant(t *testing.T) {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: tenant, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: tenant, namespace: %[1]s}
rules:
- {apiGroups: [""], resources: [persistentvolumeclaims, pods], verbs: [get, list, watch, create, update, patch, delete]}
- {apiGroups: [snapshot.storage.k8s.io], resources: [volumesnapshots], verbs: [get, list, watch, create, delete]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant, namespace: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}
subjects: [{kind: ServiceAccount, name: tenant, namespace: %[1]s}]
`, shopNS))
}

// pendingClaim is a claim manifest in shopNS scheduled (by its tenant) to
// node in a class no provisioner serves, with extra in its spec.
func pendingClaim(name, node, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s, annotations: {%s: %s}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  resources: {requests: {storage: 64Mi}}
%s`, name, shopNS, selectedN, node, noClass, extra)
}

func secretMarker(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "bank-secret-" + hex.EncodeToString(b)
}

// TestStolenNodeChannelAttacks: with n1 stolen and a tenant's account in
// shopNS, the attacker tries to read the data of the victim's claim on
// n2 (a clone through a claim pre-bound to the victim's PV; a restore
// through a snapshot content whose status n1's API token rewrote), to
// fill n2's disk with handoffs of its own size, name and preallocation,
// and to slow n2's plugin's API calls with a flood of invented tokens.
// Each try and its refusal are printed.
func TestStolenNodeChannelAttacks(t *testing.T) {
	c := requireChart(t)
	c.testNamespace(t)
	from, target := nodes[0], nodes[1]
	c.shopTenant(t)
	t.Cleanup(func() {
		_, _ = c.kubectl("delete", "namespace", shopNS, "--wait=true", "--timeout=180s")
		_, _ = c.kubectl("-n", testNS, "delete", "volumesnapshot", "bank-nightly", "--ignore-not-found", "--wait=true", "--timeout=120s")
		_, _ = c.kubectl("-n", testNS, "delete", "pvc", "bank-ledger", "--ignore-not-found", "--wait=true", "--timeout=120s")
		for _, n := range nodes {
			c.noVolumesWithoutPV(t, n)
		}
	})

	// The shop's own volume on n2 and its snapshot, made as its tenant.
	c.tenantApply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: cart, namespace: %[1]s}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: cart-w, namespace: %[1]s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  containers: [{name: c, image: %[3]s, imagePullPolicy: Never, command: [sh, -c, "echo shop > /data/f && sync"], volumeMounts: [{name: v, mountPath: /data}]}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: cart}}]
`, shopNS, target, busybox))
	// The victim's claim on n2, with a secret in it, and its snapshot.
	marker := secretMarker(t)
	c.writtenSnapshot(t, "bank-nightly", "bank-ledger", "64Mi", target, "echo "+marker+" > /data/f && sync")
	c.k(t, "-n", shopNS, "wait", "pod/cart-w", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=2m")
	c.tenantApply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: mine, namespace: %s}
spec: {volumeSnapshotClassName: fastblk, source: {persistentVolumeClaimName: cart}}
`, shopNS))
	c.k(t, "-n", shopNS, "wait", "volumesnapshot/mine", "--for=jsonpath={.status.readyToUse}=true", "--timeout=2m")
	bankPV := c.jsonpath(t, "{.spec.volumeName}", "-n", testNS, "get", "pvc", "bank-ledger")
	bankVol := c.jsonpath(t, "{.spec.csi.volumeHandle}", "get", "pv", bankPV)
	handle := func(ns, snap string) (content, h string) {
		content = c.jsonpath(t, "{.status.boundVolumeSnapshotContentName}", "-n", ns, "get", "volumesnapshot", snap)
		return content, c.jsonpath(t, "{.status.snapshotHandle}", "get", "volumesnapshotcontent", content)
	}
	_, bankSnap := handle(testNS, "bank-nightly")
	shopContent, shopSnap := handle(shopNS, "mine")
	t.Logf("victim: claim %s/bank-ledger on %s (PV %s, volume %s, snapshot %s), holding %s", testNS, target, bankPV, bankVol, bankSnap, marker)
	n1 := c.stealNode(t, from, target)

	t.Run("clone through a claim pre-bound to the victim's PV", func(t *testing.T) {
		class := c.jsonpath(t, "{.spec.storageClassName}", "get", "pv", bankPV)
		c.tenantApply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: src, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  volumeName: %s
  resources: {requests: {storage: 64Mi}}
---
%s`, shopNS, class, bankPV, pendingClaim("dst", from, "  dataSource: {kind: PersistentVolumeClaim, name: src}\n")))
		t.Logf("shop's tenant made claim src naming the victim's PV %s (its phase: %s) and claim dst cloning src, scheduled to %s",
			bankPV, c.jsonpath(t, "{.status.phase}", "-n", shopNS, "get", "pvc", "src"), from)
		found, n, err := n1.read(t, peer.SourceVolume, bankVol, shopNS+"/dst", marker)
		attackOutcome(t, fmt.Sprintf("%s reads the victim's volume %s for shop's claim dst", from, bankVol), err,
			fmt.Sprintf("%d bytes of the victim's volume came, the secret among them: %v", n, found))
	})

	t.Run("restore through a snapshot content whose status the node rewrote", func(t *testing.T) {
		c.tenantApply(t, pendingClaim("r", from, "  dataSource: {kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io, name: mine}\n"))
		// Put back what the attacker rewrote before shop's snapshot
		// is deleted, which deletes the snapshot its content names.
		t.Cleanup(func() {
			_, _ = c.kubectl("patch", "volumesnapshotcontent", shopContent, "--subresource=status", "--type=merge",
				"-p", fmt.Sprintf(`{"status":{"snapshotHandle":%q}}`, shopSnap))
		})
		// The account may update the status, not get it (which
		// kubectl patch does first): a PUT of the content it reads.
		var content map[string]any
		out, err := n1.kubectl("get", "volumesnapshotcontent", shopContent, "-o", "json")
		if err != nil || json.Unmarshal([]byte(out), &content) != nil {
			t.Fatalf("%s's API token reads %s: %v", from, shopContent, err)
		}
		content["status"].(map[string]any)["snapshotHandle"] = bankSnap
		body, _ := json.Marshal(content)
		_, err = c.run(string(body), "kubectl", "--kubeconfig="+n1.kubeconfig, "replace", "--raw",
			"/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/"+shopContent+"/status", "-f", "-")
		t.Logf("%s's API token sets status.snapshotHandle of %s (shop's snapshot mine) to the victim's %s: %v; it now says %s", from, shopContent, bankSnap,
			err, c.jsonpath(t, "{.status.snapshotHandle}", "get", "volumesnapshotcontent", shopContent))
		found, n, err := n1.read(t, peer.SourceSnapshot, bankSnap, shopNS+"/r", marker)
		attackOutcome(t, fmt.Sprintf("%s reads the victim's snapshot %s for shop's claim r, which restores mine", from, bankSnap), err,
			fmt.Sprintf("%d bytes of the victim's snapshot came, the secret among them: %v", n, found))
	})

	t.Run("handoffs of the caller's size, name and preallocation", func(t *testing.T) {
		c.tenantApply(t, pendingClaim("h", from, "  dataSource: {kind: VolumeSnapshot, apiGroup: snapshot.storage.k8s.io, name: mine}\n"))
		uid := c.jsonpath(t, "{.metadata.uid}", "-n", shopNS, "get", "pvc", "h")
		names := []string{"pvc-" + uid}
		for i := range 6 {
			names = append(names, fmt.Sprintf("attack-%d", i))
		}
		t.Cleanup(func() { n1.deleteOnTarget(t, names) })
		cc := n1.conn(t)
		for _, name := range names {
			ctx, cancel := asNode(n1.peerToken, from, "")
			resp := new(csi.CreateVolumeResponse)
			err := cc.Invoke(ctx, "/fastblk.peer.v1.Peer/CreateVolume", &csi.CreateVolumeRequest{
				Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{{
					AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
					AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
				Parameters: map[string]string{"preallocation": "falloc", "crossNodeSource": "handoff",
					"csi.storage.k8s.io/pvc/namespace": shopNS, "csi.storage.k8s.io/pvc/name": "h"},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: shopSnap}}},
			}, resp)
			cancel()
			attackOutcome(t, fmt.Sprintf("%s has %s make volume %q of 256 MiB, preallocated, from shop's snapshot for shop's claim h (64Mi, a class that does not exist)", from, target, name), err,
				fmt.Sprintf("%s made %s of %d bytes, which no PV holds", target, resp.GetVolume().GetVolumeId(), resp.GetVolume().GetCapacityBytes()))
		}
	})

	t.Run("a flood of invented tokens", func(t *testing.T) { n1.floodReviews(t, bankVol, testNS+"/bank-ledger") })
}

// deleteOnTarget deletes the volumes of names on target through its
// plugin's CSI socket: what a handoff made there (none, when refused).
func (s *stolenNode) deleteOnTarget(t *testing.T, names []string) {
	t.Helper()
	sock := fmt.Sprintf("unix:///proc/%d/root/csi/csi.sock", s.c.pluginPID(t, s.target))
	cc, err := grpc.NewClient(sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Errorf("the CSI socket of %s: %v", s.target, err)
		return
	}
	defer cc.Close()
	st := s.c.nodeStatus(t, s.target)
	for _, v := range st.Volumes {
		if !slices.Contains(names, v.Name) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := csi.NewControllerClient(cc).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.ID + "-" + s.target})
		cancel()
		if err != nil {
			t.Errorf("delete the handoff's volume %s (%s) on %s: %v", v.ID, v.Name, s.target, err)
		}
	}
}

// apiTokenReviews is the API server's count of TokenReviews created.
func (c *cluster) apiTokenReviews(t *testing.T) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(c.k(t, "get", "--raw", "/metrics"), "\n") {
		if strings.HasPrefix(l, "apiserver_request_total{") && strings.Contains(l, `resource="tokenreviews"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

// invented are tokens no one issued: junk, and copies of the stolen
// peer token with a fresh jti and a signature of random bytes (a shape,
// audience and expiry that pass any check short of the signature).
func (s *stolenNode) invented(t *testing.T, n int) []string {
	t.Helper()
	parts := strings.Split(s.peerToken, ".")
	var claims map[string]any
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(payload, &claims) != nil {
		t.Fatalf("the peer token is no JWT: %v", err)
	}
	out := make([]string, n)
	for i := range out {
		r := make([]byte, 256)
		if _, err := rand.Read(r); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			out[i] = hex.EncodeToString(r[:32])
			continue
		}
		claims["jti"] = hex.EncodeToString(r[:16])
		p, _ := json.Marshal(claims)
		out[i] = parts[0] + "." + base64.RawURLEncoding.EncodeToString(p) + "." + base64.RawURLEncoding.EncodeToString(r)
	}
	return out
}

// floodReviews is finding 6: from n1's pod, 600 calls to n2's peer port,
// each with a token no one issued, on 20 connections at once, while n1's
// real token asks n2 for the victim's volume for the victim's claim every
// 250 ms, which n2 answers only after a read from the API server (the
// claim; it refuses the read: the claim is not scheduled to n1). Those
// answers are timed with and without the flood, and the API server
// counts the TokenReviews made meanwhile. (A class change, which n2
// answered after its reads on main, is now refused to any node before
// any read: only the controller's pod may ask for one.)
func (s *stolenNode) floodReviews(t *testing.T, victimVol, victimClaim string) {
	const flood, conns, calls = 600, 20, 20
	cc := s.conn(t)
	// other times n2's answers to n1's real token, calls of them at
	// most, until stop.
	other := func(stop <-chan struct{}) (took []time.Duration) {
		for range calls {
			start := time.Now()
			err := peerRead(cc, s.peerToken, s.node, victimVol, victimClaim)
			took = append(took, time.Since(start))
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not scheduled to node "+s.node) {
				t.Errorf("%s's read of %s for %s: %v, want n2's refusal after its read of the claim", s.node, victimVol, victimClaim, err)
			}
			select {
			case <-stop:
				return took
			case <-time.After(250 * time.Millisecond):
			}
		}
		return took
	}
	alone := other(nil)
	tokens := s.invented(t, flood)
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i] = s.conn(t)
	}
	reviewsBefore := s.c.apiTokenReviews(t)
	var (
		mu       sync.Mutex
		answered = map[string]int{}
		example  = map[string]string{}
		wg       sync.WaitGroup
	)
	start := time.Now()
	for i, tok := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := peerModify(ccs[i%conns], tok, s.node, victimVol, nil)
			k := map[bool]string{true: "junk", false: "forged JWT"}[i%2 == 0] + " " + status.Code(err).String()
			mu.Lock()
			answered[k]++
			example[k] = status.Convert(err).Message()
			mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	during := other(done)
	<-done
	took := time.Since(start)
	reviews := s.c.apiTokenReviews(t) - reviewsBefore
	ms := func(d []time.Duration) string {
		return fmt.Sprintf("%d calls, median %v, slowest %v", len(d), median(d).Round(time.Millisecond), slices.Max(d).Round(time.Millisecond))
	}
	t.Logf("tried: %d calls to %s from %s's pod with tokens no one issued (half junk, half the stolen token's claims with a forged signature) on %d connections at once",
		flood, s.target, s.node, conns)
	t.Logf("  answered in %v: %v; TokenReviews the API server got meanwhile: %d", took.Round(time.Millisecond), answered, reviews)
	for k, m := range example {
		t.Logf("  %s, e.g.: %s", k, m)
	}
	t.Logf("  %s's reads refused by %s after its API read: alone %s; during the flood %s", s.node, s.target, ms(alone), ms(during))
	// Every invented token is refused, and the reviews are bounded:
	// n2 reviews at most 5 tokens at once and one a second from one
	// address; the flooder's own token is reviewed at most once more.
	if bound := 5 + int(took.Seconds()+1) + 2; reviews > bound {
		t.Errorf("the flood cost %d TokenReviews in %v, more than the %d one peer may ask for", reviews, took.Round(time.Millisecond), bound)
	}
	for k := range answered {
		if !strings.HasSuffix(k, "Unauthenticated") && !strings.HasSuffix(k, "Unavailable") {
			t.Errorf("an invented token was answered %s, want Unauthenticated (or Unavailable: too many reviews)", k)
		}
	}
}
