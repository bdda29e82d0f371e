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

// admissionPolicy is the part of a ValidatingAdmissionPolicy the tests read.
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
		MatchConditions []struct{ Expression string }       `yaml:"matchConditions"`
		Variables       []struct{ Name, Expression string } `yaml:"variables"`
		Validations     []struct{ Expression string }       `yaml:"validations"`
	} `yaml:"spec"`
}

// TestNodeClaimPolicy: an admission policy, bound to deny, covers every
// update of a claim (not its status) by the node account alone: the
// selected node kept, removed or set to the requester's own node where
// there is none, and the spec unchanged. peer.claimPolicy=false drops it.
func TestNodeClaimPolicy(t *testing.T) {
	objs := render(t)
	var p admissionPolicy
	policy := named(t, objs, "ValidatingAdmissionPolicy", "csi-fastblk-node-claims")
	if err := policy.decode(&p); err != nil {
		t.Fatal(err)
	}
	s := p.Spec
	if r := s.MatchConstraints.ResourceRules; s.FailurePolicy != "Fail" || len(r) != 1 || !slices.Equal(r[0].APIGroups, []string{""}) ||
		!slices.Equal(r[0].Operations, []string{"UPDATE"}) || !slices.Equal(r[0].Resources, []string{"persistentvolumeclaims"}) {
		t.Errorf("policy failurePolicy %q rules %+v: want Fail on UPDATE of persistentvolumeclaims", s.FailurePolicy, r)
	}
	if len(s.MatchConditions) != 1 || s.MatchConditions[0].Expression != "request.userInfo.username == 'system:serviceaccount:csi-fastblk:csi-fastblk-node'" {
		t.Errorf("policy matches %+v, want the node account alone", s.MatchConditions)
	}
	var exprs []string
	for _, v := range s.Variables {
		exprs = append(exprs, v.Name+"="+v.Expression)
	}
	for _, v := range s.Validations {
		exprs = append(exprs, v.Expression)
	}
	all := strings.Join(exprs, "\n")
	for _, want := range []string{"'volume.kubernetes.io/selected-node' in object.metadata.annotations",
		"'authentication.kubernetes.io/node-name' in request.userInfo.extra",
		"variables.selected == variables.wasSelected", "variables.selected == variables.node", "object.spec == oldObject.spec"} {
		if !strings.Contains(all, want) {
			t.Errorf("policy expressions lack %q:\n%s", want, all)
		}
	}
	var b struct {
		Spec struct {
			PolicyName        string   `yaml:"policyName"`
			ValidationActions []string `yaml:"validationActions"`
		} `yaml:"spec"`
	}
	if err := named(t, objs, "ValidatingAdmissionPolicyBinding", "csi-fastblk-node-claims").decode(&b); err != nil {
		t.Fatal(err)
	}
	if b.Spec.PolicyName != "csi-fastblk-node-claims" || !slices.Equal(b.Spec.ValidationActions, []string{"Deny"}) {
		t.Errorf("binding %+v, want the policy with Deny", b.Spec)
	}
	for _, o := range render(t, "peer.claimPolicy=false") {
		if strings.HasPrefix(o.Kind, "ValidatingAdmissionPolicy") && o.Metadata.Name == "csi-fastblk-node-claims" {
			t.Errorf("peer.claimPolicy=false still renders the %s", o.Kind)
		}
	}
}
