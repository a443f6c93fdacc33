#!/usr/bin/env bash
# Runs the Go interop suite for devicelet's DRA structured allocator:
#   TestOracleReproducesCorpus  upstream k8s.io/dynamic-resource-allocation (incubating) replays the
#                               shared conformance corpus
#   TestDifferential            upstream allocator vs `devicelet allocate` on DIFF_N generated scenarios
#
#   bash interop/allocator/run.sh                          # builds devicelet (cargo build -p devicelet)
#   DEVICELET_BIN=/abs/path/devicelet bash interop/allocator/run.sh
#   DEVICELET_INTEROP_OPTIONAL=1 ...                       # skip TestDifferential if devicelet or its
#                                                          # `allocate` subcommand is missing
# Env: ALLOCATOR_INTEROP_TIMEOUT (default 240s) bounds the go test run; DIFF_N (default 2000),
# DIFF_SEED, DEVICELET_SHARED (default ../../../shared relative to this module).
# Extra arguments go to `go test` (e.g. -run TestDifferential -v).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

if [ -z "${DEVICELET_BIN:-}" ] && [ "${DEVICELET_INTEROP_OPTIONAL:-0}" != "1" ]; then
  echo "allocator interop: building devicelet (cargo build -p devicelet)" >&2
  (cd "$repo" && cargo build -q -p devicelet)
  target_dir="${CARGO_TARGET_DIR:-$repo/target}"
  case "$target_dir" in /*) ;; *) target_dir="$repo/$target_dir" ;; esac
  DEVICELET_BIN="$target_dir/debug/devicelet"
fi
if [ -n "${DEVICELET_BIN:-}" ]; then
  case "$DEVICELET_BIN" in
    /*) ;;
    *) DEVICELET_BIN="$PWD/$DEVICELET_BIN" ;;
  esac
  export DEVICELET_BIN
  echo "allocator interop: using $DEVICELET_BIN" >&2
fi

cd "$here"
go mod download
go vet ./...
t="${ALLOCATOR_INTEROP_TIMEOUT:-240}"
# -p 1: packages one after the other, so the timed TestDifferential does not share the CPUs with
# the generator tests.
timeout --kill-after=10s "${t}s" go test -p 1 -count=1 -timeout "${t}s" "$@" ./...
