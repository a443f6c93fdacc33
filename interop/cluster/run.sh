#!/usr/bin/env bash
# End-to-end tests of cluster mode: devicelet nodes (node identity, Node authorizer,
# NodeRestriction) against a real control plane built from the k8s.io/kubernetes Go modules.
#
#   bash interop/cluster/run.sh                     # builds devicelet and the control plane
#   DEVICELET_BIN=/abs/devicelet bash interop/cluster/run.sh -run TestTopology -v
#
# The control plane binaries are cached (build.sh); the tests start one control plane for the
# package (up.sh) and stop it at the end. Env: CLUSTER_E2E_TIMEOUT (default 900s).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${DEVICELET_BIN:-}" ]; then
  (cd "$repo" && cargo build -q -p devicelet)
  DEVICELET_BIN="${CARGO_TARGET_DIR:-$repo/target}/debug/devicelet"
fi
case "$DEVICELET_BIN" in /*) ;; *) DEVICELET_BIN="$PWD/$DEVICELET_BIN" ;; esac
export DEVICELET_BIN
for tool in openssl curl python3; do
  command -v "$tool" >/dev/null || { echo "cluster e2e: $tool is required" >&2; exit 1; }
done
DEVICELET_TEST_CONTROLPLANE_BIN="$(bash "$here/build.sh")"
export DEVICELET_TEST_CONTROLPLANE_BIN
cd "$here"
go vet ./...
go test -count=1 -run '^$' ./... >/dev/null
timeout --kill-after=30s "${CLUSTER_E2E_TIMEOUT:-900}s" \
  go test -count=1 -p 1 -timeout "${CLUSTER_E2E_TIMEOUT:-900}s" "$@" ./...
