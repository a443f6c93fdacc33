#!/usr/bin/env bash
# Scrapes a running devicelet's /metrics and checks it with Prometheus' `promtool check metrics`
# (Debian package `prometheus`, installed here if promtool is missing), after exercising every
# path that records: a plugin registration, a pod admission through the Topology Manager
# (single-numa-node) and the static CPU manager (Allocate, exclusive CPUs), a rejected admission
# (TopologyAffinityError), and PodResources calls with the upstream Go client.
#
# The kubelet's own metric names break some promlint rules (counters without `_total`,
# `..._count` counters, the `_ms` unit); upstream exempts exactly those names in
# k8s.io/component-base/metrics/testutil/promlint.go (exceptionMetrics). devicelet serves them
# under the kubelet's names, so promtool's lint findings are accepted for those names only; a
# parse error or a lint finding on any other metric fails the check.
#
#   DEVICELET_BIN=/abs/path/devicelet bash interop/metrics/check.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${DEVICELET_BIN:-$repo/target/debug/devicelet}"
[ -x "$bin" ] || { echo "metrics check: $bin is not executable (set DEVICELET_BIN)" >&2; exit 1; }

if ! command -v promtool >/dev/null 2>&1; then
  echo "metrics check: installing promtool (Debian package prometheus)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

root="$(mktemp -d /tmp/devicelet-metrics.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT

# A free loopback port (the kernel picks it; a tiny race with other processes is acceptable).
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
address="127.0.0.1:$port"

# Topology Manager and static CPU manager on a described 2-node, 4-CPU machine.
cat >"$root/kubelet.yaml" <<'CONFIG'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
cpuManagerPolicy: static
reservedSystemCPUs: "0"
devicelet:
  machine: {nodes: 2, cpusPerNode: 2}
CONFIG
"$bin" --root-dir "$root" serve --config "$root/kubelet.yaml" --metrics-address "$address" >"$root/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://$address/metrics" >/dev/null 2>&1 && break
  sleep 0.1
done
"$bin" --root-dir "$root" example-plugin --resource example.com/gpu --devices 4 --numa-nodes 2 >"$root/plugin.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  "$bin" --root-dir "$root" get resources -o json 2>/dev/null | grep -q '"allocatable":4' && break
  sleep 0.1
done

cat >"$root/pod.yaml" <<'POD'
apiVersion: v1
kind: Pod
metadata: {name: metrics-pod, namespace: default, uid: 5e1b7c3a-0000-4000-8000-000000000001}
spec:
  containers:
  - name: app
    image: registry.invalid/app:1
    resources:
      limits: {example.com/gpu: "2", cpu: "1", memory: 64Mi}
      requests: {cpu: "1", memory: 64Mi}
POD
"$bin" --root-dir "$root" admit -f "$root/pod.yaml" -o json >"$root/admitted.json"
grep -q '"cpus"' "$root/admitted.json" \
  || { echo "metrics check: the Guaranteed pod got no exclusive CPUs: $(cat "$root/admitted.json")" >&2; exit 1; }
sed -e 's/metrics-pod/too-big/' -e 's/0001}/0002}/' -e 's/"2"/"9"/' "$root/pod.yaml" >"$root/big.yaml"
if "$bin" --root-dir "$root" admit -f "$root/big.yaml" >/dev/null 2>&1; then
  echo "metrics check: a pod asking for 9 of 4 devices was admitted" >&2
  exit 1
fi

if command -v go >/dev/null 2>&1; then
  (cd "$repo/interop" && go build -o "$root/podresources-client" ./cmd/podresources-client)
  client=("$root/podresources-client" -socket "$root/pod-resources/kubelet.sock")
  "${client[@]}" list >/dev/null
  if "${client[@]}" -pod no-such-pod get >/dev/null 2>&1; then
    echo "metrics check: PodResources Get of a missing pod succeeded" >&2
    exit 1
  fi
fi

curl -fsS "http://$address/metrics" >"$root/metrics.txt"
echo "metrics check: $(grep -c -v '^#' "$root/metrics.txt") samples from $address" >&2
# promtool exits 3 for lint findings (one "<metric> <problem>" line each), 1 for a parse error.
kubelet_lint_exceptions='kubelet_container_aligned_compute_resources_count
kubelet_container_aligned_compute_resources_failure_count
kubelet_pod_resources_endpoint_errors_get
kubelet_pod_resources_endpoint_errors_get_allocatable
kubelet_pod_resources_endpoint_errors_list
kubelet_pod_resources_endpoint_requests_get
kubelet_pod_resources_endpoint_requests_get_allocatable
kubelet_pod_resources_endpoint_requests_list
kubelet_topology_manager_admission_duration_ms'
rc=0
promtool check metrics <"$root/metrics.txt" >"$root/promtool.out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
  echo "metrics check: promtool check metrics failed (exit $rc):" >&2
  cat "$root/promtool.out" >&2
  exit 1
fi
unexpected="$(cut -d' ' -f1 "$root/promtool.out" | grep -v -x -F -e "$kubelet_lint_exceptions" || true)"
if [ -n "$unexpected" ]; then
  echo "metrics check: promtool lint findings outside the kubelet's exempted names:" >&2
  cat "$root/promtool.out" >&2
  exit 1
fi
if [ "$rc" -eq 3 ]; then
  echo "metrics check: promtool lint findings, all on kubelet names upstream exempts:" >&2
  sed 's/^/  /' "$root/promtool.out" >&2
fi

# The series the exercise above must have produced (kubelet names first).
expect() {
  grep -qF -- "$1" "$root/metrics.txt" || { echo "metrics check: missing $1" >&2; cat "$root/metrics.txt" >&2; exit 1; }
}
expect 'kubelet_device_plugin_registration_total{resource_name="example.com/gpu"} 1'
expect 'kubelet_device_plugin_alloc_duration_seconds_count{resource_name="example.com/gpu"} 1'
expect 'devicelet_pod_admissions_total 1'
expect 'devicelet_pod_rejections_total{reason="TopologyAffinityError"} 1'
expect 'devicelet_device_plugin_allocated{resource_name="example.com/gpu"} 2'
expect 'devicelet_device_plugin_rpc_duration_seconds_count{resource_name="example.com/gpu",method="Allocate",code="OK"} 1'
expect '# TYPE kubelet_topology_manager_admission_requests_total counter'
expect 'kubelet_topology_manager_admission_requests_total 2'
expect 'kubelet_topology_manager_admission_errors_total 1'
expect '# TYPE kubelet_topology_manager_admission_duration_ms histogram'
expect 'kubelet_topology_manager_admission_duration_ms_count 2'
expect '# TYPE kubelet_container_aligned_compute_resources_count counter'
expect 'kubelet_container_aligned_compute_resources_count{boundary="numa_node",scope="container"} 1'
expect 'kubelet_container_aligned_compute_resources_failure_count{boundary="numa_node",scope="container"} 1'
expect 'kubelet_container_aligned_compute_resources_count{boundary="numa_node",scope="pod"} 0'
expect 'kubelet_cpu_manager_pinning_requests_total 1'
expect 'kubelet_cpu_manager_pinning_errors_total 0'
if command -v go >/dev/null 2>&1; then
  expect '# TYPE kubelet_pod_resources_endpoint_requests_list counter'
  expect 'kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 1'
  expect 'kubelet_pod_resources_endpoint_errors_get{server_api_version="v1"} 1'
  expect 'kubelet_pod_resources_endpoint_requests_total{server_api_version="v1"} 2'
fi
# Counters the kubelet names without `_total` keep their bare name in this format.
if grep -E '^kubelet_(pod_resources_endpoint_(requests|errors)_(list|get|get_allocatable)|container_aligned_compute_resources_(failure_)?count)_total' "$root/metrics.txt"; then
  echo "metrics check: a kubelet counter carries _total that the kubelet does not" >&2
  exit 1
fi
# OpenMetrics on request.
curl -fsS -H 'Accept: application/openmetrics-text; version=1.0.0' "http://$address/metrics" | tail -1 | grep -qx '# EOF' \
  || { echo "metrics check: no OpenMetrics answer" >&2; exit 1; }
echo "metrics check: promtool check metrics passed" >&2
