//go:build ablation

package ublk

import "github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/dataplane"

// ParseAblation parses a comma-separated list of ablation names; only
// binaries built with -tags ablation have it.
func ParseAblation(s string) (Ablation, error) { return dataplane.ParseAblation(s) }

// AblationNames lists every switch ParseAblation takes.
func AblationNames() []string { return dataplane.AblationNames() }
