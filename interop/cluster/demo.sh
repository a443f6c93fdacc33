#!/usr/bin/env bash
# devicelet joins a real Kubernetes 1.36 cluster on this machine: builds (or reuses) the control
# plane, starts it on 127.0.0.1, mints a node identity, runs `devicelet serve --kubeconfig` with
# the example device plugin, and shows the kube-scheduler placing a Deployment on what devicelet
# advertises, the pods Running, and the devices released when the Deployment goes.
#
#   bash interop/cluster/demo.sh            # KEEP=1 leaves everything running and prints how to stop it
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${DEVICELET_BIN:-}" ]; then
  (cd "$repo" && cargo build -q --release -p devicelet)
  DEVICELET_BIN="${CARGO_TARGET_DIR:-$repo/target}/release/devicelet"
fi
bin="$(bash "$here/build.sh")"
state="$(mktemp -d /tmp/devicelet-cluster.XXXXXX)"
root="$state/node-root"
mkdir -p "$root"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
  [ -n "${plugin_pid:-}" ] && kill "$plugin_pid" 2>/dev/null
  [ -n "${devicelet_pid:-}" ] && kill "$devicelet_pid" 2>/dev/null && wait "$devicelet_pid" 2>/dev/null
  bash "$here/down.sh" "$state"
  rm -rf "$state"
}
if [ "${KEEP:-0}" != 1 ]; then trap cleanup EXIT; fi

say "control plane: etcd, kube-apiserver (Node,RBAC + NodeRestriction), kube-controller-manager, kube-scheduler"
bash "$here/up.sh" "$state" "$bin"
export KUBECONFIG="$state/admin.kubeconfig"
kubectl() { "$bin/kubectl" "$@"; }

say "node identity system:node:demo-node (group system:nodes); no other permission"
node_kubeconfig="$(bash "$here/node.sh" "$state" demo-node)"
echo "$node_kubeconfig"

say "devicelet serve --kubeconfig (node identity) --node-name demo-node, and the example device plugin"
"$DEVICELET_BIN" serve --root-dir "$root" --kubeconfig "$node_kubeconfig" --node-name demo-node \
  --metrics-address off > "$state/devicelet.log" 2>&1 &
devicelet_pid=$!
until [ -S "$root/device-plugins/kubelet.sock" ]; do sleep 0.2; done
"$DEVICELET_BIN" --root-dir "$root" example-plugin --devices 4 --numa-nodes 2 > "$state/plugin.log" 2>&1 &
plugin_pid=$!
kubectl wait --for=condition=Ready node/demo-node --timeout=60s >/dev/null
until [ "$(kubectl get node demo-node -o jsonpath='{.status.allocatable.example\.com/gpu}')" = 4 ]; do sleep 0.5; done
kubectl get node demo-node -o custom-columns='NODE:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPU-CAPACITY:.status.capacity.example\.com/gpu,GPU-ALLOCATABLE:.status.allocatable.example\.com/gpu,CPU:.status.capacity.cpu,PODS:.status.capacity.pods'
kubectl get lease -n kube-node-lease demo-node

say "a Deployment of 3 pods asking for one example.com/gpu each (examples/cluster/gpu-deployment.yaml)"
until kubectl get serviceaccount default >/dev/null 2>&1; do sleep 0.5; done
kubectl apply -f "$repo/examples/cluster/gpu-deployment.yaml"
kubectl rollout status deployment/gpu-workers --timeout=90s
kubectl get pods -o wide

say "what devicelet admitted (devicelet get pods), and the device health in a pod's status (KEP-4680)"
"$DEVICELET_BIN" --root-dir "$root" get pods
pod="$(kubectl get pods -l app=gpu-workers -o jsonpath='{.items[0].metadata.name}')"
kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}'; echo

say "a fourth replica fits (4 devices); a fifth stays Pending: the scheduler sees allocatable 4"
kubectl scale deployment/gpu-workers --replicas=5
sleep 5
kubectl get pods -o wide

say "delete the Deployment: devicelet releases the devices and deletes the pods (grace period 0)"
kubectl delete deployment gpu-workers --wait=true
until [ -z "$(kubectl get pods -o name)" ]; do sleep 0.5; done
"$DEVICELET_BIN" --root-dir "$root" get resources
if [ "${KEEP:-0}" = 1 ]; then
  echo
  echo "left running: export KUBECONFIG=$KUBECONFIG; kubectl=$bin/kubectl; devicelet root $root"
  echo "stop with: kill $plugin_pid $devicelet_pid; bash $here/down.sh $state"
fi
