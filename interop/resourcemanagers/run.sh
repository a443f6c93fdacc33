#!/usr/bin/env bash
# Resource-manager interop: the kubelet's own Topology Manager, CPU Manager static policy and
# Memory Manager static policy (k8s.io/kubernetes v1.36.3 pkg/kubelet/cm, from the Go module
# proxy) against `devicelet resources replay` on the same machines and pods: random seeded
# sequences of admissions and removals, every decision and both state files compared.
# See interop/README.md. Usage: DEVICELET_BIN=/path/to/devicelet bash interop/resourcemanagers/run.sh
# RM_AREAS=cpu,cpu-options,memory RM_SEQUENCES=N RM_SEED=S select what runs (replay_test.go).
set -euo pipefail
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
# Resolved before the cd, so a path relative to the caller's directory works.
export DEVICELET_BIN="$(realpath -e "$DEVICELET_BIN")"
cd "$(dirname "$0")"
timeout "${RESOURCEMANAGERS_INTEROP_TIMEOUT:-600}" go test -count=1 -v ./...
