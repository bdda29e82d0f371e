//go:build ablation

package backend

import "github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"

type ablationConfig struct {
	// Ablate lists the techniques to switch off (ublk.ParseAblation).
	Ablate string
}

func (c ablationConfig) ablation() (ublk.Ablation, error) { return ublk.ParseAblation(c.Ablate) }
