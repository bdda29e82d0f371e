#!/usr/bin/env bash
# Static checks beyond go vet: staticcheck (pinned, built from the Go module
# proxy and cached) and the project's layering rules (style.md rule 1):
#   - pkg/blockdev/uring imports nothing of ours (its subpackages may import it);
#   - pkg/blockdev/ublk and pkg/blockdev/loop never import pkg/blockdev;
#   - ublk's data plane (ublk/internal/dataplane) and UAPI (ublk/internal/uapi)
#     sit below its control: they never import ublk, the UAPI nothing of ours;
#   - pkg/blockdev itself (the contract) imports nothing of ours but qos;
#   - below the driver only backend picks a backend: nothing else in
#     pkg/blockdev imports backend, and only backend and the driver's
#     callers stand above store (nothing in pkg/blockdev imports store);
#   - nothing in pkg/blockdev imports pkg/driver or cmd;
#   - cmd/ and pkg/driver never import golang.org/x/sys/unix (syscalls live in blockdev);
#   - unsafe only in pkg/blockdev/uring and pkg/blockdev/ublk (tests excepted).
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2
tools="${FASTBLK_TOOLS:-$HOME/.cache/csi-fastblk/tools}"
if [ ! -x "$tools/staticcheck-$STATICCHECK_VERSION" ]; then
	mkdir -p "$tools"
	GOBIN="$tools" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
	mv "$tools/staticcheck" "$tools/staticcheck-$STATICCHECK_VERSION"
fi
mod=$(go list -m)
fail=0
"$tools/staticcheck-$STATICCHECK_VERSION" ./... || fail=1
# The test builds' failpoints, hooks and ablation switches (make unit's tags).
"$tools/staticcheck-$STATICCHECK_VERSION" -tags failpoint,ablation ./... || fail=1
while read -r pkg imports; do
	rel=${pkg#"$mod"/}
	for imp in $imports; do
		case "$rel:$imp" in
		pkg/blockdev/uring*:"$mod"/pkg/blockdev/uring*) ;;
		pkg/blockdev/uring*:"$mod"/*)
			echo "layering: $rel imports $imp (the engine imports nothing of ours)"; fail=1 ;;
		pkg/blockdev/ublk/internal/uapi:"$mod"/*)
			echo "layering: $rel imports $imp (the UAPI imports nothing of ours)"; fail=1 ;;
		pkg/blockdev/ublk/internal/*:"$mod"/pkg/blockdev/ublk)
			echo "layering: $rel imports $imp (the data plane sits below ublk's control)"; fail=1 ;;
		pkg/blockdev/ublk*:"$mod"/pkg/blockdev | pkg/blockdev/loop*:"$mod"/pkg/blockdev)
			echo "layering: $rel imports $imp (backends sit below blockdev)"; fail=1 ;;
		pkg/blockdev:"$mod"/pkg/blockdev/qos) ;;
		pkg/blockdev:"$mod"/*)
			echo "layering: $rel imports $imp (the contract imports nothing of ours but qos)"; fail=1 ;;
		pkg/blockdev/backend*:"$mod"/pkg/blockdev/backend*) ;;
		pkg/blockdev/*:"$mod"/pkg/blockdev/backend*)
			echo "layering: $rel imports $imp (only the driver's callers pick a backend)"; fail=1 ;;
		pkg/blockdev/store*:"$mod"/pkg/blockdev/store*) ;;
		pkg/blockdev/*:"$mod"/pkg/blockdev/store*)
			echo "layering: $rel imports $imp (nothing below the driver stands above the store)"; fail=1 ;;
		pkg/blockdev*:"$mod"/pkg/driver* | pkg/blockdev*:"$mod"/cmd/*)
			echo "layering: $rel imports $imp (imports run down)"; fail=1 ;;
		cmd/*:golang.org/x/sys/unix | pkg/driver*:golang.org/x/sys/unix)
			echo "layering: $rel imports $imp (syscalls belong in pkg/blockdev)"; fail=1 ;;
		pkg/blockdev/uring*:unsafe | pkg/blockdev/ublk*:unsafe) ;;
		*:unsafe)
			echo "layering: $rel imports unsafe (only uring and ublk may)"; fail=1 ;;
		esac
	done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./...)
if [ "$fail" -eq 0 ]; then echo "lint: ok"; fi
exit "$fail"
