#!/usr/bin/env bash
# DRA interop: a driver built on the upstream kubeletplugin helper (k8s.io/dynamic-resource-allocation
# v0.36.2) registers with devicelet, which allocates, prepares and unprepares a claim through it.
# Usage: DEVICELET_BIN=/path/to/devicelet bash interop/dra/run.sh
set -euo pipefail
cd "$(dirname "$0")"
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
export DEVICELET_BIN="$(realpath "$DEVICELET_BIN")"
timeout "${DRA_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
