#!/usr/bin/env bash
# DRA interop: a driver built on the upstream kubeletplugin helper (k8s.io/dynamic-resource-allocation
# v0.36.2) registers with devicelet, which allocates, prepares and unprepares a claim through it.
# Then interop/cdi: the CDI spec files devicelet's example DRA driver writes are validated with the
# upstream CDI Go library (schema package and pkg/cdi; see interop/cdi/cdi_test.go).
# Usage: DEVICELET_BIN=/path/to/devicelet bash interop/dra/run.sh
set -euo pipefail
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
# Resolved before the cd, so a path relative to the caller's directory works.
export DEVICELET_BIN="$(realpath -e "$DEVICELET_BIN")"
cd "$(dirname "$0")"
timeout "${DRA_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
cd ../cdi
timeout "${DRA_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
