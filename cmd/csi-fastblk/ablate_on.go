//go:build ablation

package main

import (
	"flag"
	"strings"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/backend"
	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// ablateFlag registers --ublk-ablate, which only benchmark builds (-tags
// ablation) have.
func ablateFlag(fs *flag.FlagSet, devices *backend.Config) {
	fs.StringVar(&devices.Ablate, "ublk-ablate", "", "benchmarks only: techniques of the ublk server threads to switch off, comma-separated: "+
		strings.Join(ublk.AblationNames(), ", "))
}

// ablationBuild says whether this build has the ablation switches.
const ablationBuild = true
