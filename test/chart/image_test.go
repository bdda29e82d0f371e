package chart

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/internal/testgate"
)

// imageFiles must be in the image: the plugin and the tools it executes.
var imageFiles = []string{
	"usr/bin/csi-fastblk", "sbin/mkfs.ext4", "sbin/mkfs.xfs", "sbin/resize2fs",
	"usr/sbin/xfs_growfs", "bin/mount", "bin/umount", "sbin/blkid", "sbin/losetup",
	"sbin/modprobe", "sbin/e2fsck", "sbin/fsck",
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// ociArchive is an OCI image layout read from a tar into memory.
type ociArchive map[string][]byte

func readArchive(t *testing.T) ociArchive {
	t.Helper()
	p := os.Getenv("IMAGE_ARCHIVE")
	if p == "" {
		p = filepath.Join(repoRoot(t), "bin", "csi-fastblk-image.oci.tar")
	}
	f, err := os.Open(p)
	if err != nil {
		testgate.Skip(t, testgate.Chart, "no image archive (%v); run make image or set IMAGE_ARCHIVE", err)
	}
	defer f.Close()
	a := ociArchive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("read %s: %v", h.Name, err)
			}
			a[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
}

// blob returns the blob a descriptor names after checking its digest and size.
func (a ociArchive) blob(t *testing.T, d descriptor) []byte {
	t.Helper()
	hexd, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		t.Fatalf("digest %q is not sha256", d.Digest)
	}
	b, ok := a["blobs/sha256/"+hexd]
	if !ok {
		t.Fatalf("blob %s (%s) missing", d.Digest, d.MediaType)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexd {
		t.Fatalf("blob %s: content does not match its digest", d.Digest)
	}
	if int64(len(b)) != d.Size {
		t.Fatalf("blob %s: size %d, descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

func decodeJSON(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", what, err)
	}
}

// TestImageArchive follows index.json → image index → one manifest per
// platform (linux/amd64 and linux/arm64) → config and layers, checking
// every digest, the name (the chart's default plugin image, so make image
// and the chart cannot drift apart), the entrypoint, the diff IDs, the
// files the plugin needs and their architecture; as root it also runs the
// plugin from the unpacked amd64 layers.
func TestImageArchive(t *testing.T) {
	a := readArchive(t)
	var layout struct {
		Version string `json:"imageLayoutVersion"`
	}
	decodeJSON(t, "oci-layout", a["oci-layout"], &layout)
	if layout.Version != "1.0.0" {
		t.Fatalf("imageLayoutVersion %q", layout.Version)
	}
	var top struct {
		Manifests []descriptor `json:"manifests"`
	}
	decodeJSON(t, "index.json", a["index.json"], &top)
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("index.json: want one image index, got %+v", top.Manifests)
	}
	plugin, _ := nodePod(t, render(t)).container("csi-fastblk")
	ann := top.Manifests[0].Annotations
	if ann["io.containerd.image.name"] != plugin.Image || !strings.HasSuffix(plugin.Image, ":"+ann["org.opencontainers.image.ref.name"]) {
		t.Errorf("image named %q tagged %q; the chart runs %q by default", ann["io.containerd.image.name"],
			ann["org.opencontainers.image.ref.name"], plugin.Image)
	}
	var multi struct {
		Manifests []struct {
			descriptor
			Platform struct {
				Architecture string `json:"architecture"`
				OS           string `json:"os"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	decodeJSON(t, "image index", a.blob(t, top.Manifests[0]), &multi)
	var platforms []string
	for _, m := range multi.Manifests {
		p := m.Platform.OS + "/" + m.Platform.Architecture
		platforms = append(platforms, p)
		t.Run(p, func(t *testing.T) { checkImage(t, a, m.descriptor, m.Platform.Architecture) })
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
}

// elfMachine is the ELF machine of each image architecture.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func checkImage(t *testing.T, a ociArchive, d descriptor, arch string) {
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	decodeJSON(t, "manifest", a.blob(t, d), &manifest)
	var config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       struct {
			Entrypoint []string `json:"Entrypoint"`
			Cmd        []string `json:"Cmd"`
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	decodeJSON(t, "config", a.blob(t, manifest.Config), &config)
	if config.OS != "linux" || config.Architecture != arch {
		t.Errorf("config platform %s/%s, want linux/%s", config.OS, config.Architecture, arch)
	}
	if !slices.Equal(config.Config.Entrypoint, []string{"/usr/bin/csi-fastblk"}) || !slices.Equal(config.Config.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %v cmd %v, want [/usr/bin/csi-fastblk] [serve]", config.Config.Entrypoint, config.Config.Cmd)
	}
	if len(manifest.Layers) == 0 || len(manifest.Layers) != len(config.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff IDs", len(manifest.Layers), len(config.RootFS.DiffIDs))
	}
	root := t.TempDir()
	files := map[string]bool{}
	for i, l := range manifest.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Fatalf("layer %d: media type %s", i, l.MediaType)
		}
		raw := gunzip(t, a.blob(t, l))
		if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != config.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: diff ID does not match the uncompressed layer", i)
		}
		unpackLayer(t, raw, root, files)
	}
	for _, f := range imageFiles {
		if !files[f] {
			t.Errorf("image lacks /%s", f)
		}
	}
	for _, f := range []string{"usr/bin/csi-fastblk", "sbin/mkfs.xfs"} {
		e, err := elf.Open(filepath.Join(root, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if e.Machine != elfMachine[arch] {
			t.Errorf("%s is for %s, want %s", f, e.Machine, elfMachine[arch])
		}
		e.Close()
	}
	if arch == runtime.GOARCH {
		t.Run("plugin runs in the image", func(t *testing.T) { runInImage(t, root) })
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("gunzip layer: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip layer: %v", err)
	}
	return raw
}

// unpackLayer extracts directories, files and links of a layer under root
// and records the names it saw. Names are confined to root.
func unpackLayer(t *testing.T, raw []byte, root string, seen map[string]bool) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		seen[name] = true
		dst := filepath.Join(root, name)
		if err := extract(tr, h, dst, root); err != nil {
			t.Fatalf("extract %s: %v", name, err)
		}
	}
}

func extract(r io.Reader, h *tar.Header, dst, root string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return os.MkdirAll(dst, os.FileMode(h.Mode)&os.ModePerm|0o700)
	case tar.TypeSymlink:
		return os.Symlink(h.Linkname, dst)
	case tar.TypeLink:
		return os.Link(filepath.Join(root, filepath.Clean("/"+h.Linkname)), dst)
	case tar.TypeReg:
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&os.ModePerm)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return nil
}

// runInImage runs the plugin's version command and mkfs.ext4 -V inside the
// unpacked image, with the image's own dynamic loader and libraries.
func runInImage(t *testing.T, root string) {
	testgate.RequireRoot(t)
	for _, argv := range [][]string{{"/usr/bin/csi-fastblk", "version"}, {"/sbin/mkfs.ext4", "-V"},
		{"/sbin/mkfs.xfs", "-V"}, {"/bin/mount", "--version"}} {
		out, err := exec.Command("chroot", append([]string{root}, argv...)...).CombinedOutput()
		if err != nil {
			t.Errorf("chroot %v: %v\n%s", argv, err, out)
		}
	}
}
