package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	annRefName    = "org.opencontainers.image.ref.name"
	// annImageName is the full reference containerd's importer names an
	// image by (io.containerd.image.name).
	annImageName = "io.containerd.image.name"
)

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type index struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	Manifests     []descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// makeIndex writes an image index of the manifests tagged tags in the OCI
// layout dir (each with the platform its config names) and makes it the
// layout's only entry, named ref.
func makeIndex(dir, ref string, tags []string) error {
	var top index
	if err := readJSON(filepath.Join(dir, "index.json"), &top); err != nil {
		return err
	}
	byTag := map[string]descriptor{}
	for _, d := range top.Manifests {
		byTag[d.Annotations[annRefName]] = d
	}
	multi := index{SchemaVersion: 2, MediaType: mediaIndex}
	for _, tag := range tags {
		d, ok := byTag[tag]
		if !ok || d.MediaType != mediaManifest {
			return fmt.Errorf("%s: no image manifest tagged %q", dir, tag)
		}
		var m struct {
			Config descriptor `json:"config"`
		}
		if err := readJSON(blobPath(dir, d.Digest), &m); err != nil {
			return err
		}
		var p platform
		if err := readJSON(blobPath(dir, m.Config.Digest), &p); err != nil {
			return err
		}
		multi.Manifests = append(multi.Manifests, descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, Platform: &p})
	}
	b, err := json.Marshal(multi)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := os.WriteFile(blobPath(dir, digest), b, 0o644); err != nil {
		return err
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	top.Manifests = []descriptor{{MediaType: mediaIndex, Digest: digest, Size: int64(len(b)),
		Annotations: map[string]string{annRefName: tag, annImageName: ref}}}
	out, err := json.Marshal(top)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "index.json"), out, 0o644)
}

func blobPath(dir, digest string) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", file, err)
	}
	return nil
}
