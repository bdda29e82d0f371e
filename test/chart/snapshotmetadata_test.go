package chart

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
)

// cbtAPI is the --api-versions entry of a cluster that serves the
// SnapshotMetadataService API (its own CRD, or the chart's from crds/).
const cbtAPI = "cbt.storage.k8s.io/v1beta1"

// smName is the name of the snapshot metadata objects of release csi-fastblk.
const smName = "csi-fastblk-snapshot-metadata"

type secret struct {
	Type string            `yaml:"type"`
	Data map[string]string `yaml:"data"`
}

type smsObject struct {
	Spec struct {
		Address  string `yaml:"address"`
		Audience string `yaml:"audience"`
		CACert   string `yaml:"caCert"`
	} `yaml:"spec"`
}

// secretVolumes maps each Secret a pod template mounts to its volume name.
type secretVolumes struct {
	Spec struct {
		Template struct {
			Spec struct {
				Volumes []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestSnapshotMetadataOffByDefault: a default render has no sidecar, no
// Service, Secret, ClusterRole or SnapshotMetadataService of it, and its
// plugin answers no peer's snapshot metadata call.
func TestSnapshotMetadataOffByDefault(t *testing.T) {
	objs := renderArgs(t, []string{"--api-versions", cbtAPI})
	if _, ok := nodePod(t, objs).container("csi-snapshot-metadata"); ok {
		t.Error("the sidecar runs by default")
	}
	if _, ok := mustContainer(t, nodePod(t, objs), "csi-fastblk").arg("peer-serve-metadata"); ok {
		t.Error("the plugin serves peers snapshot metadata by default")
	}
	if n := len(find(objs, "SnapshotMetadataService")); n != 0 {
		t.Errorf("%d SnapshotMetadataService objects by default", n)
	}
	for _, o := range objs {
		if strings.Contains(o.Metadata.Name, "snapshot-metadata") {
			t.Errorf("%s %s rendered by default", o.Kind, o.Metadata.Name)
		}
	}
}

// TestSnapshotMetadata: with snapshotMetadata.enabled every plugin pod runs
// the sidecar on the plugin's socket with the TLS pair of its Secret; one
// Service selects every plugin pod; the SnapshotMetadataService names that
// Service (its fixed cluster IP here), the sidecar's audience and a CA that
// signed a certificate for those names; the CA's key is in a Secret no pod
// mounts; the sidecar's rights are TokenReview, SubjectAccessReview and
// reading snapshots, none on Secrets; the backup applications' roles split
// the token right from the cluster-wide reads.
func TestSnapshotMetadata(t *testing.T) {
	const ip = "10.96.0.53"
	objs := renderArgs(t, []string{"--api-versions", cbtAPI},
		"snapshotMetadata.enabled=true", "snapshotMetadata.service.clusterIP="+ip)
	pod := nodePod(t, objs)
	side := mustContainer(t, pod, "csi-snapshot-metadata")
	plugin := mustContainer(t, pod, "csi-fastblk")
	const audience = "fastblk.csi.io-snapshot-metadata"
	for name, want := range map[string]string{
		"csi-address":                "/csi/csi.sock",
		"port":                       "9816",
		"http-endpoint":              ":9817",
		"tls-cert":                   "/tls/tls.crt",
		"tls-key":                    "/tls/tls.key",
		"audience":                   audience,
		"max-streaming-duration-min": "10",
	} {
		if got, ok := side.arg(name); !ok || got != want {
			t.Errorf("sidecar --%s = %q (%v), want %q", name, got, ok, want)
		}
	}
	if _, ok := plugin.arg("peer-serve-metadata"); !ok {
		t.Error("the plugin does not serve the other nodes' sidecars its snapshots' metadata (--peer-serve-metadata)")
	}
	if side.Image != "registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.0.0" {
		t.Errorf("sidecar image %s", side.Image)
	}
	pm, _ := plugin.mountAt("/csi")
	if sm, ok := side.mountAt("/csi"); !ok || sm.Name != pm.Name {
		t.Errorf("the sidecar's /csi (%+v) is not the plugin's socket directory (%+v)", sm, pm)
	}
	if m, ok := side.mountAt("/tls"); !ok || !m.ReadOnly {
		t.Errorf("the sidecar's /tls mount: %+v", m)
	}
	var vols secretVolumes
	if err := one(t, objs, "DaemonSet").decode(&vols); err != nil {
		t.Fatal(err)
	}
	var mounted []string
	for _, v := range vols.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			mounted = append(mounted, v.Secret.SecretName)
		}
	}
	if !slices.Equal(mounted, []string{smName + "-tls"}) {
		t.Errorf("the plugin pods mount the Secrets %v, want only %s-tls", mounted, smName)
	}

	var svc service
	svcObj := named(t, objs, "Service", smName)
	if err := svcObj.decode(&svc); err != nil {
		t.Fatal(err)
	}
	var ds workload
	if err := one(t, objs, "DaemonSet").decode(&ds); err != nil {
		t.Fatal(err)
	}
	if !matches(svc.Spec.Selector, ds.Spec.Template.Metadata.Labels) || svc.Spec.ClusterIP != ip {
		t.Errorf("Service selector %v, cluster IP %q: want the plugin pods' labels %v and %s",
			svc.Spec.Selector, svc.Spec.ClusterIP, ds.Spec.Template.Metadata.Labels, ip)
	}
	if len(svc.Spec.Ports) != 1 || !slices.ContainsFunc(side.Ports, func(p containerPort) bool {
		return p.Name == svc.Spec.Ports[0].TargetPort && p.ContainerPort == 9816
	}) {
		t.Errorf("Service ports %+v do not reach the sidecar's gRPC port (%+v)", svc.Spec.Ports, side.Ports)
	}

	var sms smsObject
	if err := named(t, objs, "SnapshotMetadataService", "fastblk.csi.io").decode(&sms); err != nil {
		t.Fatal(err)
	}
	if sms.Spec.Address != ip+":6443" || sms.Spec.Audience != audience {
		t.Errorf("SnapshotMetadataService spec %+v, want address %s:6443 and audience %s", sms.Spec, ip, audience)
	}
	var tlsSecret, caSecret secret
	if err := named(t, objs, "Secret", smName+"-tls").decode(&tlsSecret); err != nil {
		t.Fatal(err)
	}
	if err := named(t, objs, "Secret", smName+"-ca").decode(&caSecret); err != nil {
		t.Fatal(err)
	}
	if _, ok := tlsSecret.Data["ca.key"]; ok {
		t.Error("the mounted Secret holds the CA's key")
	}
	if sms.Spec.CACert != caSecret.Data["tls.crt"] || sms.Spec.CACert != tlsSecret.Data["ca.crt"] {
		t.Error("the SnapshotMetadataService's CA is not the CA of the Secrets")
	}
	roots := x509.NewCertPool()
	roots.AddCert(pemCert(t, sms.Spec.CACert))
	leaf := pemCert(t, tlsSecret.Data["tls.crt"])
	for _, name := range []string{ip, smName + ".csi-fastblk", smName + ".csi-fastblk.svc", smName + ".csi-fastblk.svc.cluster.local"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the certificate does not serve %s under the CA: %v", name, err)
		}
	}
	if !slices.ContainsFunc(leaf.IPAddresses, func(a net.IP) bool { return a.Equal(net.ParseIP(ip)) }) {
		t.Errorf("certificate IPs %v lack %s", leaf.IPAddresses, ip)
	}

	checkSnapshotMetadataRBAC(t, objs)

	// Without a fixed IP the address is the Service's name.
	objs = renderArgs(t, []string{"--api-versions", cbtAPI}, "snapshotMetadata.enabled=true")
	if err := named(t, objs, "SnapshotMetadataService", "fastblk.csi.io").decode(&sms); err != nil {
		t.Fatal(err)
	}
	if want := smName + ".csi-fastblk:6443"; sms.Spec.Address != want {
		t.Errorf("address %s, want %s", sms.Spec.Address, want)
	}
}

// checkSnapshotMetadataRBAC checks the sidecar's ClusterRole, bound to the
// node service account, and the backup applications' two roles.
func checkSnapshotMetadataRBAC(t *testing.T, objs []object) {
	t.Helper()
	rules := func(name string) map[string][]string {
		var r clusterRole
		if err := named(t, objs, "ClusterRole", name).decode(&r); err != nil {
			t.Fatal(err)
		}
		m := map[string][]string{}
		for _, rule := range r.Rules {
			for _, res := range rule.Resources {
				m[res] = append(m[res], rule.Verbs...)
			}
		}
		return m
	}
	side := rules(smName)
	for res, verb := range map[string]string{"tokenreviews": "create", "subjectaccessreviews": "create",
		"volumesnapshots": "get", "volumesnapshotcontents": "get", "volumesnapshotclasses": "list"} {
		if !slices.Contains(side[res], verb) {
			t.Errorf("the sidecar may not %s %s: %v", verb, res, side)
		}
	}
	if _, ok := side["secrets"]; ok {
		t.Errorf("the sidecar's role reaches Secrets: %v", side)
	}
	var b roleBinding
	if err := named(t, objs, "ClusterRoleBinding", smName).decode(&b); err != nil {
		t.Fatal(err)
	}
	if b.RoleRef.Name != smName || len(b.Subjects) != 1 || b.Subjects[0].Name != "csi-fastblk-node" {
		t.Errorf("binding %+v: want %s for the node service account", b, smName)
	}
	client, token := rules(smName+"-client"), rules(smName+"-client-token")
	if _, ok := client["serviceaccounts/token"]; ok || !slices.Contains(client["snapshotmetadataservices"], "get") ||
		!slices.Contains(client["volumesnapshotcontents"], "get") {
		t.Errorf("client role %v: want snapshot and SnapshotMetadataService reads and no tokens", client)
	}
	if len(token) != 1 || !slices.Equal(token["serviceaccounts/token"], []string{"create"}) {
		t.Errorf("client token role %v: want serviceaccounts/token create only", token)
	}
}

// pemCert decodes a base64 PEM certificate.
func pemCert(t *testing.T, b64 string) *x509.Certificate {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(raw)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSnapshotMetadataRefusals: the renders that cannot work fail with the
// reason: no peer channel (other nodes' snapshots unreachable), no
// snapshotter, a port taken twice.
func TestSnapshotMetadataRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		set  []string
		want string
	}{
		"no peers":       {[]string{"peer.enabled=false", "controllerExpansion=false"}, "needs peer.enabled"},
		"no snapshotter": {[]string{"snapshotter.enabled=false"}, "needs snapshotter.enabled"},
		"port clash":     {[]string{"snapshotMetadata.port=9815"}, "snapshotMetadata.port 9815 is already used by peer.port"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, err := helm(t, templateArgs(append([]string{"snapshotMetadata.enabled=true"}, c.set...)...)...)
			if err == nil || !strings.Contains(stderr, c.want) {
				t.Errorf("render: %v, want a failure saying %q:\n%s", err, c.want, stderr)
			}
		})
	}
}
