package chart

import (
	"fmt"
	"testing"
)

// imageValues are the value prefixes of every image the chart can run.
var imageValues = []string{
	"plugin", "provisioner", "resizer", "snapshotter", "snapshotController",
}

// TestImagesComeFromValues renders with a sentinel repository, tag and pull
// policy per image value and asserts that every container of every workload
// uses one of them, and every sentinel is used.
func TestImagesComeFromValues(t *testing.T) {
	set := []string{"snapshotController.install=true"}
	want := map[string]bool{}
	for i, v := range imageValues {
		repo := fmt.Sprintf("sentinel.example/img%d", i)
		tag := fmt.Sprintf("t%d", i)
		set = append(set, v+".image.repository="+repo, v+".image.tag="+tag, v+".image.pullPolicy=Never")
		want[repo+":"+tag] = false
	}
	objs := render(t, set...)
	var containers []container
	for _, kind := range []string{"DaemonSet", "Deployment", "StatefulSet", "Job"} {
		for _, o := range find(objs, kind) {
			var w workload
			if err := o.decode(&w); err != nil {
				t.Fatal(err)
			}
			p := w.Spec.Template.Spec
			containers = append(containers, p.InitContainers...)
			containers = append(containers, p.Containers...)
		}
	}
	if len(containers) < len(imageValues) {
		t.Fatalf("found %d containers, want at least %d", len(containers), len(imageValues))
	}
	for _, c := range containers {
		used, ok := want[c.Image]
		if !ok {
			t.Errorf("container %s: image %q does not come from values", c.Name, c.Image)
			continue
		}
		// The uninstall check, the peer-ca Job and the controller run the
		// plugin binary: the plugin's image.
		if used && !((c.Name == "check" || c.Name == "peer-ca" || c.Name == "csi-fastblk") && c.Image == "sentinel.example/img0:t0") {
			t.Errorf("container %s: image %q is used by two containers", c.Name, c.Image)
		}
		want[c.Image] = true
		if c.ImagePullPolicy != "Never" {
			t.Errorf("container %s: imagePullPolicy %q does not come from values", c.Name, c.ImagePullPolicy)
		}
	}
	for img, used := range want {
		if !used {
			t.Errorf("image value %s reaches no container", img)
		}
	}
}

// TestPluginTagDefaultsToAppVersion checks the one image default that is
// not spelled out in values.yaml.
func TestPluginTagDefaultsToAppVersion(t *testing.T) {
	c, ok := nodePod(t, render(t)).container("csi-fastblk")
	if !ok {
		t.Fatal("no csi-fastblk container")
	}
	if c.Image != "ghcr.io/fastblk/csi-fastblk:0.1.0" {
		t.Errorf("plugin image %q, want the chart's appVersion tag", c.Image)
	}
}
