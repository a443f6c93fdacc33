#!/usr/bin/env bash
# Scheduler interop: kube-scheduler v1.36.3's own framework and in-tree plugins
# (k8s.io/kubernetes pkg/scheduler, from the Go module proxy) against `devicelet schedule` on
# the same random seeded snapshots: the PreFilter verdict, every node's filter rejection or
# weighted scores, and DefaultPreemption's victims per node compared. See README.md.
# Usage: DEVICELET_BIN=/path/to/devicelet bash interop/scheduler/run.sh
# SCHEDULER_ORACLE_CASES=N SCHEDULER_ORACLE_SEED=S select what runs (oracle_test.go).
set -euo pipefail
: "${DEVICELET_BIN:?set DEVICELET_BIN to a built devicelet binary}"
# Resolved before the cd, so a path relative to the caller's directory works.
export DEVICELET_BIN="$(realpath -e "$DEVICELET_BIN")"
cd "$(dirname "$0")"
timeout "${SCHEDULER_ORACLE_TIMEOUT:-600}" go test -count=1 -v ./...
