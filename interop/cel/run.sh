#!/usr/bin/env bash
# Compares devicelet-cel's compile verdicts with Kubernetes' DRA CEL compiler.
# 1. The Rust test type_check_parity writes its corpus and verdicts to a JSON file.
# 2. `go test` compiles the same expressions with k8s.io/dynamic-resource-allocation/cel.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$(mktemp -t devicelet-cel-parity.XXXXXX.json)"
trap 'rm -f "$out"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/targets/dra}"
(cd "$root" && DEVICELET_CEL_PARITY_OUT="$out" cargo test -q -p devicelet-cel --test type_check_parity -- --test-threads=1)
(cd "$here" && DEVICELET_CEL_PARITY_FILE="$out" go test -count=1 ${GO_TEST_FLAGS:--v} ./...)
