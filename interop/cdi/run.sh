#!/usr/bin/env bash
# CDI interop: the CDI spec files devicelet's example DRA driver writes are validated with the
# upstream CDI Go library (schema package and pkg/cdi; see cdi_test.go).
# Usage: DEVICELET_BIN=/path/to/devicelet bash interop/cdi/run.sh
set -euo pipefail
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
# Resolved before the cd, so a path relative to the caller's directory works.
export DEVICELET_BIN="$(realpath -e "$DEVICELET_BIN")"
cd "$(dirname "$0")"
timeout "${CDI_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
