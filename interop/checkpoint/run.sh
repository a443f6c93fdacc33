#!/usr/bin/env bash
# Checkpoint interop: the kubelet's own Go checkpoint code (k8s.io/kubernetes v1.36
# pkg/kubelet/checkpointmanager, pkg/kubelet/cm/devicemanager/checkpoint and the CPU and memory
# managers' state packages, from the Go module proxy) loads the device checkpoint,
# cpu_manager_state and memory_manager_state devicelet writes, and devicelet (`state inspect`,
# `state import`, `serve`, `start`) loads the ones the kubelet's code wrote. See interop/README.md.
# Usage: DEVICELET_BIN=/path/to/devicelet bash interop/checkpoint/run.sh
set -euo pipefail
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
# Resolved before the cd, so a path relative to the caller's directory works.
export DEVICELET_BIN="$(realpath -e "$DEVICELET_BIN")"
cd "$(dirname "$0")"
timeout "${CHECKPOINT_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
