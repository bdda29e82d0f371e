//go:build !ablation

package main

import (
	"flag"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
)

// ablateFlag registers nothing: --ublk-ablate exists only in benchmark
// builds (-tags ablation, ablate_on.go).
func ablateFlag(*flag.FlagSet, *backend.Config) {}

// ablationBuild says whether this build has the ablation switches.
const ablationBuild = false
