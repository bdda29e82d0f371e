package chart

import (
	"slices"
	"strings"
	"testing"
)

// TestPeerChannel: by default the plugin serves the peer channel on its
// port with the identity flags the chart knows (its service account, the
// CA Secret, the selector of every node group's pods), advertises
// controller expansion, may list the pods and only read the CA Secret,
// and a NetworkPolicy admits only the plugin pods to the peer port while
// the other ports stay open. peer.enabled=false drops all of it, and
// controllerExpansion without the channel fails the render.
func TestPeerChannel(t *testing.T) {
	objs := render(t)
	plugin := mustContainer(t, nodePod(t, objs), "csi-fastblk")
	for name, want := range map[string]string{
		"peer-address":         ":9815",
		"peer-namespace":       "$(NAMESPACE)",
		"peer-service-account": "csi-fastblk-node",
		"peer-ca-secret":       "csi-fastblk-peer-ca",
		"peer-selector":        "app.kubernetes.io/name=csi-fastblk,app.kubernetes.io/instance=csi-fastblk,app.kubernetes.io/component=node",
		"controller-expansion": "",
	} {
		if got, ok := plugin.arg(name); !ok || got != want {
			t.Errorf("--%s = %q (%v), want %q", name, got, ok, want)
		}
	}
	if !slices.ContainsFunc(plugin.Ports, func(p containerPort) bool { return p.Name == "peer" && p.ContainerPort == 9815 }) {
		t.Errorf("plugin ports %+v lack peer 9815", plugin.Ports)
	}
	if !slices.ContainsFunc(plugin.Env, func(e envVar) bool { return e.Name == "NAMESPACE" }) {
		t.Error("the plugin has no NAMESPACE for --peer-namespace")
	}

	var role struct {
		Rules []struct {
			Resources     []string `yaml:"resources"`
			ResourceNames []string `yaml:"resourceNames"`
			Verbs         []string `yaml:"verbs"`
		} `yaml:"rules"`
	}
	if err := named(t, objs, "Role", "csi-fastblk-node").decode(&role); err != nil {
		t.Fatal(err)
	}
	var secretRules []string
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "secrets") {
			secretRules = append(secretRules, strings.Join(r.Verbs, ",")+" "+strings.Join(r.ResourceNames, ","))
		}
		if slices.Contains(r.Resources, "pods") && !slices.Contains(r.Verbs, "list") {
			t.Errorf("pods rule %v: the resolver lists pods", r.Verbs)
		}
	}
	if want := []string{"get csi-fastblk-peer-ca"}; !slices.Equal(secretRules, want) {
		t.Errorf("secret rules %q, want %q", secretRules, want)
	}

	var np struct {
		Spec struct {
			PodSelector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"podSelector"`
			Ingress []struct {
				From []struct {
					PodSelector struct {
						MatchLabels map[string]string `yaml:"matchLabels"`
					} `yaml:"podSelector"`
				} `yaml:"from"`
				Ports []struct {
					Port int `yaml:"port"`
				} `yaml:"ports"`
			} `yaml:"ingress"`
		} `yaml:"spec"`
	}
	if err := one(t, objs, "NetworkPolicy").decode(&np); err != nil {
		t.Fatal(err)
	}
	if in := np.Spec.Ingress; len(in) != 2 || len(in[0].From) != 2 || len(in[0].Ports) != 1 || in[0].Ports[0].Port != 9815 ||
		in[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/component"] != "node" ||
		in[0].From[1].PodSelector.MatchLabels["app.kubernetes.io/component"] != "controller" || len(in[1].From) != 0 {
		t.Errorf("NetworkPolicy ingress %+v: want the peer port from the node pods and the controller's, then the other ports from all", in)
	}
	open := map[int]bool{}
	for _, p := range np.Spec.Ingress[1].Ports {
		open[p.Port] = true
	}
	for _, p := range plugin.Ports {
		if p.Name != "peer" && !open[p.ContainerPort] {
			t.Errorf("the NetworkPolicy closes the plugin's port %s %d", p.Name, p.ContainerPort)
		}
	}

	off := render(t, "peer.enabled=false", "controllerExpansion=false")
	if len(find(off, "NetworkPolicy")) != 0 {
		t.Error("peer.enabled=false still renders the NetworkPolicy")
	}
	plugin = mustContainer(t, nodePod(t, off), "csi-fastblk")
	for _, name := range []string{"peer-address", "controller-expansion"} {
		if _, ok := plugin.arg(name); ok {
			t.Errorf("peer.enabled=false, controllerExpansion=false: --%s still set", name)
		}
	}
	if _, stderr, err := helm(t, templateArgs("peer.enabled=false")...); err == nil || !strings.Contains(stderr, "controllerExpansion needs peer.enabled") {
		t.Errorf("controllerExpansion without the peer channel: %v %s, want a refusal", err, stderr)
	}
}
