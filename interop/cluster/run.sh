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
# The test binary runs under the timeout itself (not under `go test`, which would not pass the
# SIGTERM on): on timeout it stops the control plane and every devicelet it started.
bin_dir="$(mktemp -d)"
trap 'rm -rf "$bin_dir"' EXIT
go test -c -o "$bin_dir/cluster.test" .
limit="${CLUSTER_E2E_TIMEOUT:-900}"
# `go test` flags for the test binary: -v, -run X become -test.v, -test.run X.
args=()
for a in "$@"; do
  case "$a" in
    -test.*) args+=("$a") ;;
    -*) args+=("-test.${a#-}") ;;
    *) args+=("$a") ;;
  esac
done
timeout --kill-after=30s "${limit}s" \
  "$bin_dir/cluster.test" -test.count=1 -test.timeout "$((limit + 60))s" ${args[@]+"${args[@]}"}
