//go:build !ablation

package backend

import "github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"

// ablationConfig is empty: only benchmark builds (-tags ablation,
// ablation_on.go) can switch techniques off.
type ablationConfig struct{}

func (ablationConfig) ablation() (ublk.Ablation, error) { return ublk.Ablation{}, nil }
