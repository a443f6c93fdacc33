#!/usr/bin/env bash
# Stops a control plane started by up.sh: bash interop/cluster/down.sh STATE_DIR
set -uo pipefail
state="${1:?usage: down.sh STATE_DIR}"
[ -f "$state/pids" ] || exit 0
# Reverse start order: scheduler and controller-manager before the API server before etcd.
tac "$state/pids" | while read -r pid name; do
  kill -TERM "$pid" 2>/dev/null || continue
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null && echo "controlplane: $name did not stop on SIGTERM; killed" >&2
done
rm -f "$state/pids"
