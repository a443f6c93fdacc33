#!/usr/bin/env bash
# Runs the Go interop suite: upstream k8s.io/kubelet clients and a Go device plugin driving a
# real devicelet binary.
#
#   bash interop/run.sh                      # builds devicelet (cargo build -p devicelet) first
#   DEVICELET_BIN=/abs/path/devicelet bash interop/run.sh   # uses that binary
#
# Extra arguments go to `go test` (e.g. -run TestDevicePlugin -v).
# Env: INTEROP_TIMEOUT (default 110s) bounds the go test run.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"

if [ -z "${DEVICELET_BIN:-}" ]; then
  echo "interop: building devicelet (cargo build -p devicelet)" >&2
  (cd "$repo" && cargo build -q -p devicelet)
  target_dir="${CARGO_TARGET_DIR:-$repo/target}"
  case "$target_dir" in /*) ;; *) target_dir="$repo/$target_dir" ;; esac
  DEVICELET_BIN="$target_dir/debug/devicelet"
fi
case "$DEVICELET_BIN" in
  /*) ;;
  *) DEVICELET_BIN="$PWD/$DEVICELET_BIN" ;;
esac
if [ ! -x "$DEVICELET_BIN" ]; then
  echo "interop: DEVICELET_BIN=$DEVICELET_BIN is not an executable file" >&2
  exit 1
fi
export DEVICELET_BIN
echo "interop: using $DEVICELET_BIN" >&2

cd "$here"
go mod download
go vet ./...
# Compile the test binaries first (no tests run), so the timeout below bounds only the tests:
# a cold build of grpc and friends can take minutes on a busy 2-core machine.
go test -count=1 -run '^$' ./... >/dev/null
timeout --kill-after=10s "${INTEROP_TIMEOUT:-110}s" go test -count=1 -timeout "${INTEROP_TIMEOUT:-110}s" "$@" ./...
