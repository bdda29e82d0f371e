package chart

import (
	"path"
	"regexp"
	"strings"
	"testing"
)

// kubeletDirs are the kubelet roots the chart must support.
var kubeletDirs = map[string]string{
	"default":  "/var/lib/kubelet",
	"k0s":      "/var/lib/k0s/kubelet",
	"microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
	"rke":      "/opt/rke/var/lib/kubelet",
}

// hostPathRE matches absolute paths in rendered YAML.
var hostPathRE = regexp.MustCompile(`(/[A-Za-z0-9._-]+)+`)

// hostPathOf maps a path inside container c to the host path behind it,
// through the hostPath volume mounted at the longest matching mount path.
func hostPathOf(t *testing.T, p podSpec, c container, inner string) string {
	t.Helper()
	best := volumeMount{}
	for _, m := range c.VolumeMounts {
		if (inner == m.MountPath || strings.HasPrefix(inner, m.MountPath+"/")) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	if best.Name == "" {
		t.Fatalf("container %s: %s is on no volume mount", c.Name, inner)
	}
	v, ok := p.volume(best.Name)
	if !ok || v.HostPath == nil {
		t.Fatalf("container %s: volume %s is not a hostPath", c.Name, best.Name)
	}
	return path.Join(v.HostPath.Path, strings.TrimPrefix(inner, best.MountPath))
}

// TestSocketPathsAgree follows the socket from the plugin's --endpoint, each
// sidecar's --csi-address and the plugin's --kubelet-registration-path
// to host paths: all must be the same file, inside the kubelet's plugin
// directory, and the plugin's --registration-dir must be plugins_registry.
func TestSocketPathsAgree(t *testing.T) {
	for name, dir := range kubeletDirs {
		for _, driver := range []string{"fastblk.csi.io", "other.example.com"} {
			t.Run(name+"/"+driver, func(t *testing.T) {
				p := nodePod(t, render(t, "kubeletDir="+dir, "driverName="+driver))
				plugin, ok := p.container("csi-fastblk")
				if !ok {
					t.Fatal("no csi-fastblk container")
				}
				ep, _ := plugin.arg("endpoint")
				sock, ok := strings.CutPrefix(ep, "unix://")
				if !ok {
					t.Fatalf("plugin --endpoint %q is not unix://", ep)
				}
				want := path.Join(dir, "plugins", driver, "csi.sock")
				if got := hostPathOf(t, p, plugin, sock); got != want {
					t.Errorf("plugin socket on host %s, want %s", got, want)
				}
				sidecars := 0
				for _, c := range p.Containers {
					addr, ok := c.arg("csi-address")
					if !ok {
						continue
					}
					sidecars++
					if got := hostPathOf(t, p, c, addr); got != want {
						t.Errorf("%s --csi-address reaches %s on the host, want %s", c.Name, got, want)
					}
				}
				// The provisioner and the snapshotter; the resizer runs in
				// the controller Deployment, on a socket of its pod.
				if sidecars != 2 {
					t.Errorf("%d containers have --csi-address, want 2", sidecars)
				}
				if got, _ := plugin.arg("kubelet-registration-path"); got != want {
					t.Errorf("--kubelet-registration-path %s, want %s", got, want)
				}
				regDir, _ := plugin.arg("registration-dir")
				if got := hostPathOf(t, p, plugin, regDir); got != path.Join(dir, "plugins_registry") {
					t.Errorf("registration dir on host %s, want %s/plugins_registry", got, dir)
				}
			})
		}
	}
}

// TestKubeletDirReachesEveryMount renders with each kubelet root and checks
// that every kubelet hostPath derives from it, that no other root leaks into
// any object, and that the plugin sees the kubelet's pods and plugins
// directories at their host paths with Bidirectional propagation.
func TestKubeletDirReachesEveryMount(t *testing.T) {
	for name, dir := range kubeletDirs {
		t.Run(name, func(t *testing.T) {
			out, stderr, err := helm(t, templateArgs("kubeletDir="+dir)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, stderr)
			}
			for _, hp := range hostPathRE.FindAllString(out, -1) {
				if strings.Contains(hp, "kubelet") && !strings.HasPrefix(hp, dir+"/") {
					t.Errorf("render has kubelet path %s outside %s", hp, dir)
				}
			}
			objs, err := decodeObjects([]byte(out))
			if err != nil {
				t.Fatal(err)
			}
			p := nodePod(t, objs)
			kubeletVols := 0
			for _, v := range p.Volumes {
				if v.HostPath != nil && strings.Contains(v.HostPath.Path, "kubelet") {
					kubeletVols++
					if !strings.HasPrefix(v.HostPath.Path, dir+"/") {
						t.Errorf("volume %s: %s is not under %s", v.Name, v.HostPath.Path, dir)
					}
				}
			}
			if kubeletVols != 4 {
				t.Errorf("%d kubelet hostPath volumes, want 4 (socket, pods, plugins, registry)", kubeletVols)
			}
			plugin, _ := p.container("csi-fastblk")
			for _, sub := range []string{"pods", "plugins"} {
				m, ok := plugin.mountAt(path.Join(dir, sub))
				if !ok {
					t.Errorf("plugin does not mount %s/%s at its host path", dir, sub)
					continue
				}
				if m.MountPropagation != "Bidirectional" {
					t.Errorf("mount %s: propagation %q, want Bidirectional", m.MountPath, m.MountPropagation)
				}
				if got := hostPathOf(t, p, plugin, m.MountPath); got != m.MountPath {
					t.Errorf("mount %s is backed by host %s", m.MountPath, got)
				}
			}
		})
	}
}
