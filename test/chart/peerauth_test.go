package chart

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// named returns the object of kind and name or fails.
func named(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range find(objs, kind) {
		if o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return object{}
}

// grants is what the RBAC objects of objs let the service account
// namespace/name do, as "apiGroup/resource:verb[resourceName]" strings,
// one per verb and name, from every Role and ClusterRole bound to it.
func grants(t *testing.T, objs []object, namespace, name string) []string {
	t.Helper()
	var got []string
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, o := range find(objs, kind) {
			var rb roleBinding
			if err := o.decode(&rb); err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(rb.Subjects, func(s struct {
				Kind      string `yaml:"kind"`
				Name      string `yaml:"name"`
				Namespace string `yaml:"namespace"`
			}) bool {
				return s.Kind == "ServiceAccount" && s.Name == name && s.Namespace == namespace
			}) {
				continue
			}
			var role clusterRole
			if err := named(t, objs, rb.RoleRef.Kind, rb.RoleRef.Name).decode(&role); err != nil {
				t.Fatal(err)
			}
			for _, r := range role.Rules {
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							rule := g + "/" + res + ":" + v
							if len(r.ResourceNames) == 0 {
								got = append(got, rule)
							}
							for _, n := range r.ResourceNames {
								got = append(got, rule+"["+n+"]")
							}
						}
					}
				}
			}
		}
	}
	return got
}

// canI answers as `kubectl auth can-i verb resource [name]` would for the
// grants (wildcards included).
func canI(grants []string, group, verb, resource, name string) bool {
	for _, g := range grants {
		gr, rest, _ := strings.Cut(g, "/")
		res, rest, _ := strings.Cut(rest, ":")
		v, names, _ := strings.Cut(rest, "[")
		if (gr == group || gr == "*") && (res == resource || res == "*") && (v == verb || v == "*") &&
			(names == "" || names == name+"]") {
			return true
		}
	}
	return false
}

// TestNodeAccountCreatesNoSecrets: the node service account, whose token
// every node holds, may not create Secrets (a CA of its own, or a token
// Secret of another account), nor mint tokens of any account (which could
// be bound to another node's plugin pod); it reads only the CA Secret,
// and may review tokens. The peer-ca Job's account, which may create the
// Secret, exists only as a hook.
func TestNodeAccountCreatesNoSecrets(t *testing.T) {
	for _, set := range [][]string{nil, {"snapshotter.enabled=false"}} {
		objs := render(t, set...)
		g := grants(t, objs, "csi-fastblk", "csi-fastblk-node")
		for _, deny := range []struct{ group, verb, resource, name string }{
			{"", "create", "secrets", ""},
			{"", "create", "secrets", "csi-fastblk-peer-ca"},
			{"", "update", "secrets", "csi-fastblk-peer-ca"},
			{"", "patch", "secrets", "csi-fastblk-peer-ca"},
			{"", "delete", "secrets", "csi-fastblk-peer-ca"},
			{"", "get", "secrets", "other"},
			{"", "list", "secrets", ""},
			{"", "create", "serviceaccounts/token", "csi-fastblk-node"},
			{"", "patch", "pods", ""},
			{"", "impersonate", "serviceaccounts", ""},
		} {
			if canI(g, deny.group, deny.verb, deny.resource, deny.name) {
				t.Errorf("%v: the node account can %s %s %s", set, deny.verb, deny.resource, deny.name)
			}
		}
		for _, allow := range []struct{ group, verb, resource, name string }{
			{"", "get", "secrets", "csi-fastblk-peer-ca"},
			{"authentication.k8s.io", "create", "tokenreviews", ""},
			{"", "get", "pods", "plugin"},
			{"", "get", "persistentvolumeclaims", "data"},
			{"", "get", "persistentvolumes", "pvc-1"},
			{"snapshot.storage.k8s.io", "get", "volumesnapshots", "snap"},
			{"snapshot.storage.k8s.io", "get", "volumesnapshotcontents", "content"},
			{"storage.k8s.io", "get", "volumeattributesclasses", "gold"},
		} {
			if !canI(g, allow.group, allow.verb, allow.resource, allow.name) {
				t.Errorf("%v: the node account cannot %s %s/%s, which the peer channel needs", set, allow.verb, allow.group, allow.resource)
			}
		}
	}
	off := render(t, "peer.enabled=false", "controllerExpansion=false")
	if g := grants(t, off, "csi-fastblk", "csi-fastblk-node"); canI(g, "", "get", "secrets", "csi-fastblk-peer-ca") || canI(g, "authentication.k8s.io", "create", "tokenreviews", "") {
		t.Errorf("peer.enabled=false still grants the channel's rights: %v", g)
	}
}

// TestPeerCAJob: the CA Secret is made by a post-install and pre-upgrade
// hook Job in the plugin's image (peer-ca), under an account of its own
// that may read, delete and create the Secret and nothing else; its RBAC
// comes first; without the channel there is none.
func TestPeerCAJob(t *testing.T) {
	objs := render(t)
	h := map[string]object{}
	for _, o := range objs {
		if o.Metadata.Name == "csi-fastblk-peer-ca" && o.Metadata.Annotations["helm.sh/hook"] != "" {
			if hook := o.Metadata.Annotations["helm.sh/hook"]; hook != "post-install,pre-upgrade" {
				t.Errorf("%s hook %q, want post-install,pre-upgrade", o.Kind, hook)
			}
			h[o.Kind] = o
		}
	}
	weight := func(kind string) int {
		w, err := strconv.Atoi(h[kind].Metadata.Annotations["helm.sh/hook-weight"])
		if err != nil {
			t.Fatalf("%s hook weight: %v", kind, err)
		}
		return w
	}
	for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
		if _, ok := h[kind]; !ok {
			t.Fatalf("no peer-ca hook %s", kind)
		}
		if weight(kind) >= weight("Job") {
			t.Errorf("%s weight is not below the Job's", kind)
		}
	}
	g := grants(t, objs, "csi-fastblk", "csi-fastblk-peer-ca")
	slices.Sort(g)
	if want := []string{"/secrets:create", "/secrets:delete[csi-fastblk-peer-ca]", "/secrets:get[csi-fastblk-peer-ca]"}; !slices.Equal(g, want) {
		t.Errorf("the peer-ca account may %v, want exactly %v", g, want)
	}
	var job hookJob
	if err := h["Job"].decode(&job); err != nil {
		t.Fatal(err)
	}
	spec := job.Spec.Template.Spec
	plugin := mustContainer(t, nodePod(t, objs), "csi-fastblk")
	if spec.ServiceAccountName != "csi-fastblk-peer-ca" || len(spec.Containers) != 1 || spec.Containers[0].Image != plugin.Image {
		t.Fatalf("Job account %q containers %+v; want its own account and the plugin's image", spec.ServiceAccountName, spec.Containers)
	}
	c := spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "peer-ca" {
		t.Errorf("Job args %q, want peer-ca", c.Args)
	}
	if s, _ := c.arg("secret"); s != "csi-fastblk-peer-ca" {
		t.Errorf("Job --secret %q", s)
	}
	if s, _ := plugin.arg("peer-ca-secret"); s != "csi-fastblk-peer-ca" {
		t.Errorf("plugin --peer-ca-secret %q, not the Job's Secret", s)
	}
	for _, o := range render(t, "peer.enabled=false", "controllerExpansion=false") {
		if o.Metadata.Name == "csi-fastblk-peer-ca" {
			t.Errorf("peer.enabled=false renders %s %s", o.Kind, o.Metadata.Name)
		}
	}
}

// TestPeerToken: the plugin proves its node with a projected token of the
// installation's own audience and a short life, mounted read-only where
// --peer-token-file reads it; the sidecars do not mount it.
func TestPeerToken(t *testing.T) {
	objs := render(t, "peer.tokenExpirationSeconds=900")
	pod := nodePod(t, objs)
	v, ok := pod.volume("peer-token")
	if !ok || v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil {
		t.Fatalf("peer-token volume %+v, want one projected service account token", v)
	}
	tok := v.Projected.Sources[0].ServiceAccountToken
	plugin := mustContainer(t, pod, "csi-fastblk")
	if aud, _ := plugin.arg("peer-token-audience"); tok.Audience != aud || aud != "fastblk.csi.io/peer/csi-fastblk/csi-fastblk" || tok.ExpirationSeconds != 900 {
		t.Errorf("token audience %q expiration %d, plugin's --peer-token-audience %q", tok.Audience, tok.ExpirationSeconds, aud)
	}
	m, ok := plugin.mountAt("/var/run/secrets/fastblk.csi.io/peer")
	file, _ := plugin.arg("peer-token-file")
	if !ok || m.Name != "peer-token" || !m.ReadOnly || file != m.MountPath+"/"+tok.Path {
		t.Errorf("mount %+v (%v), --peer-token-file %q", m, ok, file)
	}
	for _, c := range pod.Containers {
		if c.Name == plugin.Name {
			continue
		}
		if slices.ContainsFunc(c.VolumeMounts, func(m volumeMount) bool { return m.Name == "peer-token" }) {
			t.Errorf("container %s mounts the peer token", c.Name)
		}
	}
	if _, stderr, err := helm(t, templateArgs("peer.tokenExpirationSeconds=60")...); err == nil {
		t.Errorf("a token of 60 s (below the API's 600): rendered; %s", stderr)
	}
}

// admissionPolicy is what the tests read of a ValidatingAdmissionPolicy.
type admissionPolicy struct {
	Spec struct {
		FailurePolicy    string `yaml:"failurePolicy"`
		MatchConstraints struct {
			ResourceRules []struct {
				APIGroups  []string `yaml:"apiGroups"`
				Operations []string `yaml:"operations"`
				Resources  []string `yaml:"resources"`
			} `yaml:"resourceRules"`
		} `yaml:"matchConstraints"`
		ParamKind       *struct{ Kind string }              `yaml:"paramKind"`
		MatchConditions []struct{ Expression string }       `yaml:"matchConditions"`
		Variables       []struct{ Name, Expression string } `yaml:"variables"`
		Validations     []struct{ Expression string }       `yaml:"validations"`
	} `yaml:"spec"`
}

// policiesOf are the ValidatingAdmissionPolicies of objs whose match
// conditions name the account user, each bound to deny, by name.
func policiesOf(t *testing.T, objs []object, user string) map[string]admissionPolicy {
	t.Helper()
	bound := map[string]bool{}
	for _, o := range find(objs, "ValidatingAdmissionPolicyBinding") {
		var b struct {
			Spec struct {
				PolicyName        string   `yaml:"policyName"`
				ValidationActions []string `yaml:"validationActions"`
			} `yaml:"spec"`
		}
		if err := o.decode(&b); err != nil {
			t.Fatal(err)
		}
		bound[b.Spec.PolicyName] = slices.Equal(b.Spec.ValidationActions, []string{"Deny"})
	}
	got := map[string]admissionPolicy{}
	for _, o := range find(objs, "ValidatingAdmissionPolicy") {
		var p admissionPolicy
		if err := o.decode(&p); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(p.Spec.MatchConditions, func(c struct{ Expression string }) bool {
			return c.Expression == "request.userInfo.username == '"+user+"'"
		}) {
			continue
		}
		if !bound[o.Metadata.Name] || p.Spec.FailurePolicy != "Fail" {
			t.Errorf("policy %s: bound to deny %v, failurePolicy %q; want a Deny binding and Fail", o.Metadata.Name, bound[o.Metadata.Name], p.Spec.FailurePolicy)
		}
		got[o.Metadata.Name] = p
	}
	return got
}

// writeOps are the admission operations of the RBAC write verbs.
var writeOps = map[string]string{"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}

// TestNodeAccountWritesScopedByPolicy is issue 53's measure on the
// rendered chart: every write right of the node account (whose tokens
// every node holds) is covered by a ValidatingAdmissionPolicy of the
// node account that scopes it to the writer's own node (from the token's
// node claim), but for events (as every kubelet may write) and reviews
// (TokenReview, SubjectAccessReview: answered, not stored). The account
// holds no right of the external-resizer (claims' status, leases: the
// controller's), and the controller's own writes are bounded by policies
// of its account.
func TestNodeAccountWritesScopedByPolicy(t *testing.T) {
	for _, set := range [][]string{nil, {"snapshotMetadata.enabled=true"}, {"snapshotter.enabled=false"}} {
		objs := render(t, set...)
		policies := policiesOf(t, objs, "system:serviceaccount:csi-fastblk:csi-fastblk-node")
		for name, p := range policies {
			if p.Spec.ParamKind != nil {
				continue // a lookup of another object, beside a policy that reads the node
			}
			all := ""
			for _, v := range p.Spec.Variables {
				all += v.Expression
			}
			if !strings.Contains(all, "request.userInfo.extra['authentication.kubernetes.io/node-name']") {
				t.Errorf("%v: policy %s does not read the token's node", set, name)
			}
		}
		covered := func(group, resource, op string) bool {
			for _, p := range policies {
				for _, r := range p.Spec.MatchConstraints.ResourceRules {
					if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Operations, op) {
						return true
					}
				}
			}
			return false
		}
		for _, g := range grants(t, objs, "csi-fastblk", "csi-fastblk-node") {
			group, rest, _ := strings.Cut(g, "/")
			resource, verb, _ := strings.Cut(rest, ":")
			verb, _, _ = strings.Cut(verb, "[")
			op, write := writeOps[verb]
			switch {
			case !write:
			case resource == "events", resource == "tokenreviews", resource == "subjectaccessreviews":
			case !covered(group, resource, op):
				t.Errorf("%v: the node account may %s %s/%s, and no policy of its account scopes it", set, verb, group, resource)
			}
		}
		g := grants(t, objs, "csi-fastblk", "csi-fastblk-node")
		for _, deny := range []struct{ group, verb, resource string }{
			{"", "patch", "persistentvolumeclaims/status"},
			{"coordination.k8s.io", "update", "leases"},
			{"coordination.k8s.io", "create", "leases"},
			{"", "delete", "persistentvolumeclaims"},
			{"", "patch", "persistentvolumeclaims"},
		} {
			if canI(g, deny.group, deny.verb, deny.resource, "") {
				t.Errorf("%v: the node account can %s %s/%s", set, deny.verb, deny.group, deny.resource)
			}
		}
	}
	objs := render(t)
	ctl := policiesOf(t, objs, "system:serviceaccount:csi-fastblk:csi-fastblk-controller")
	for _, w := range []struct{ group, verb, resource string }{
		{"", "patch", "persistentvolumes"}, {"", "patch", "persistentvolumeclaims/status"}, {"", "delete", "persistentvolumeclaims"},
	} {
		if !canI(grants(t, objs, "csi-fastblk", "csi-fastblk-controller"), w.group, w.verb, w.resource, "") {
			t.Errorf("the controller's account cannot %s %s, which the resizer and the release need", w.verb, w.resource)
		}
		res, sub, _ := strings.Cut(w.resource, "/")
		found := false
		for _, p := range ctl {
			for _, r := range p.Spec.MatchConstraints.ResourceRules {
				found = found || (slices.Contains(r.Resources, w.resource) || (sub == "" && slices.Contains(r.Resources, res))) && slices.Contains(r.Operations, writeOps[w.verb])
			}
		}
		if !found {
			t.Errorf("no policy of the controller's account scopes its %s of %s", w.verb, w.resource)
		}
	}
}

// TestControllerDeployment: the external-resizer runs in the controller
// Deployment, not in the node pods, beside `csi-fastblk controller` under
// the controller's own account, unprivileged, with a projected token for
// the peer channel's audience; the nodes take volume changes from that
// account and pod only, and the NetworkPolicy lets the controller's pod
// reach the peer port.
func TestControllerDeployment(t *testing.T) {
	objs := render(t, "nodeLoss.releaseClaims=true")
	if _, ok := nodePod(t, objs).container("csi-resizer"); ok {
		t.Error("the node pods still run the external-resizer")
	}
	p := controllerPod(t, objs)
	if p.ServiceAccountName != "csi-fastblk-controller" {
		t.Errorf("controller runs as %q", p.ServiceAccountName)
	}
	plugin := mustContainer(t, p, "csi-fastblk")
	if len(plugin.Args) == 0 || plugin.Args[0] != "controller" {
		t.Errorf("controller's plugin args %v, want the controller command", plugin.Args)
	}
	for _, f := range []string{"release-claims-of-deleted-nodes=true", "controller-expansion", "peer-service-account=csi-fastblk-node",
		"peer-token-audience=fastblk.csi.io/peer/csi-fastblk/csi-fastblk", "peer-port=9815"} {
		if !hasArg(plugin, f) {
			t.Errorf("controller's plugin lacks --%s: %v", f, plugin.Args)
		}
	}
	for _, c := range p.Containers {
		if c.SecurityContext == nil || c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			t.Errorf("controller container %s is privileged or has no security context", c.Name)
		}
	}
	if v, ok := p.volume("peer-token"); !ok || v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil || v.Projected.Sources[0].ServiceAccountToken.Audience != "fastblk.csi.io/peer/csi-fastblk/csi-fastblk" {
		t.Errorf("controller's peer token volume %+v", v)
	}
	node := mustContainer(t, nodePod(t, objs), "csi-fastblk")
	for _, f := range []string{"peer-controller-service-account=csi-fastblk-controller",
		"peer-controller-selector=app.kubernetes.io/name=csi-fastblk,app.kubernetes.io/instance=csi-fastblk,app.kubernetes.io/component=controller"} {
		if !hasArg(node, f) {
			t.Errorf("node plugin lacks --%s", f)
		}
	}
	np := named(t, objs, "NetworkPolicy", "csi-fastblk-peer")
	var pol struct {
		Spec struct {
			Ingress []struct {
				From []struct {
					PodSelector struct {
						MatchLabels map[string]string `yaml:"matchLabels"`
					} `yaml:"podSelector"`
				} `yaml:"from"`
			} `yaml:"ingress"`
		} `yaml:"spec"`
	}
	if err := np.decode(&pol); err != nil {
		t.Fatal(err)
	}
	if from := pol.Spec.Ingress[0].From; len(from) != 2 || from[1].PodSelector.MatchLabels["app.kubernetes.io/component"] != "controller" {
		t.Errorf("the peer port admits %+v, want the plugin pods and the controller's", from)
	}
}
