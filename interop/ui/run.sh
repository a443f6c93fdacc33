#!/usr/bin/env bash
# The node page of `devicelet serve --ui-address` in headless Chromium (Debian's `chromium`,
# installed here when missing): serve on a described 2-NUMA machine (static CPU policy, Static
# memory policy, single-numa-node), the example DRA driver and device plugin with
# --numa-nodes 2, pods admitted through the CLI, one of them named like markup. Chromium loads
# the page, lets its script poll /api/numa/view (virtual time), and dumps the DOM; check.py
# compares each NUMA box's pods with what `get pods -o json` places there. Then one more pod
# is admitted and the page is checked again, and a screenshot is written to
# $CI_ARTIFACTS/numa-page.png (default target/ci-artifacts).
#
#   DEVICELET_BIN=/abs/path/devicelet bash interop/ui/run.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${DEVICELET_BIN:-$repo/target/debug/devicelet}"
[ -x "$bin" ] || { echo "ui check: $bin is not executable (set DEVICELET_BIN)" >&2; exit 1; }
artifacts="${CI_ARTIFACTS:-$PWD/target/ci-artifacts}"
mkdir -p "$artifacts"

if ! command -v chromium >/dev/null 2>&1; then
  echo "ui check: installing chromium (Debian package)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

root="$(mktemp -d /tmp/devicelet-ui.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
fail() {
  echo "ui check: $*" >&2
  for log in "$root"/*.log; do echo "--- $log" >&2; tail -20 "$log" >&2; done
  exit 1
}

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port/"
# For foreground commands only: a function in the background would leave its pid in $!.
dl() { "$bin" --root-dir "$root" "$@"; }

# CPUs 0-3 on node 0, 4-7 on node 1 (CPU 0 reserved), 4Gi per node.
cat >"$root/kubelet.yaml" <<'CONFIG'
topologyManagerPolicy: single-numa-node
cpuManagerPolicy: static
reservedSystemCPUs: "0"
memoryManagerPolicy: Static
evictionHard: {memory.available: 100Mi}
kubeReserved: {memory: 412Mi}
reservedMemory:
- {numaNode: 0, limits: {memory: 512Mi}}
devicelet:
  machine: {nodes: 2, cpusPerNode: 4}
  memory: {perNode: 4Gi}
CONFIG
"$bin" --root-dir "$root" serve --config "$root/kubelet.yaml" --node-name node-1 --metrics-address off \
  --ui-address "127.0.0.1:$port" >"$root/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do curl -fsS "$url" -o /dev/null 2>/dev/null && break; sleep 0.1; done
curl -fsS "$url" -o /dev/null || fail "the page never answered on $url"
"$bin" --root-dir "$root" example-driver --name gpu.example.com --devices 4 --numa-nodes 2 --cdi-dir "$root/cdi" >"$root/driver.log" 2>&1 &
pids+=($!)
"$bin" --root-dir "$root" example-plugin --resource example.com/nic --devices 4 --numa-nodes 2 >"$root/plugin.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  slices="$(dl get dra -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["publishedSlices"].get("gpu.example.com",0))')"
  nics="$(dl get resources -o json | python3 -c 'import json,sys; print(sum(r["allocatable"] for r in json.load(sys.stdin)["resources"] if r["name"]=="example.com/nic"))')"
  [ "$slices" = 1 ] && [ "$nics" = 4 ] && break
  sleep 0.1
done
[ "$slices" = 1 ] && [ "$nics" = 4 ] || fail "driver or plugin never came up"

cat >"$root/objects.yaml" <<'OBJECTS'
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
OBJECTS
dl apply -f "$root/objects.yaml" >/dev/null

# pod_file NAME UID RESOURCES [claim]: R/UID.yaml, one container `app`; pod: and admit it.
pod_file() {
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, uid: %s}\nspec:\n  containers:\n  - name: app\n    resources:\n      %s\n' "$1" "$2" "$3" >"$root/$2.yaml"
  if [ "${4:-}" = claim ]; then
    printf '      claims: [{name: gpu}]\n  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: gpu}\n' >>"$root/$2.yaml"
  fi
}
pod() {
  pod_file "$@"
  dl admit -f "$root/$2.yaml" -o json >/dev/null || fail "admit $2 refused"
}
hostile='<img src=x onerror=alert(1)>'
pod gpu-a uid-a 'limits: {cpu: "2", memory: 1Gi}' claim
pod nic-b uid-b 'limits: {cpu: "1", memory: 512Mi, example.com/nic: "1"}'
pod "'$hostile'" uid-h 'limits: {cpu: "1", memory: 256Mi, example.com/nic: "1"}'
pod shared-c uid-c 'requests: {cpu: 100m}'

chrome() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d "$root/chrome.XXXXXX")" --virtual-time-budget=3000 "$@" 2>>"$root/chromium.log"
}

check() {
  chrome --dump-dom "$url" >"$root/dom.html" || fail "chromium failed"
  dl get pods -o json >"$root/pods.json"
  dl get resources -o json >"$root/resources.json"
  dl get slices -o json >"$root/slices.json"
  dl top --numa --once -o json >"$root/picture.json"
  python3 "$here/check.py" "$root/dom.html" "$root/pods.json" "$root/resources.json" \
    "$root/slices.json" "$root/picture.json" "default/$hostile" || fail "the page disagrees with get pods"
}

echo "ui check: $url, the page after 4 pods"
check
# Read-only: anything but GET/HEAD is 405.
code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "${url}api/numa")"
[ "$code" = 405 ] || fail "POST /api/numa answered $code, not 405"

echo "ui check: one more pod while the page is open"
pod_file nic-d uid-d 'limits: {cpu: "1", memory: 256Mi, example.com/nic: "1"}'
timeout 120 python3 "$here/live.py" "$url" default/nic-d "$root/live-dom.html" -- \
  "$bin" --root-dir "$root" admit -f "$root/uid-d.yaml" -o json \
  || fail "the open page did not show the new pod"
# The live DOM names the same pods on the same nodes as get pods, now.
dl get pods -o json >"$root/pods.json"
dl get resources -o json >"$root/resources.json"
dl top --numa --once -o json >"$root/picture.json"
python3 "$here/check.py" "$root/live-dom.html" "$root/pods.json" "$root/resources.json" \
  "$root/slices.json" "$root/picture.json" "default/$hostile" || fail "the live page disagrees with get pods"
echo "ui check: the page again from scratch"
check

chrome --screenshot="$artifacts/numa-page.png" --window-size=1400,1000 "$url" >/dev/null || fail "no screenshot"
[ -s "$artifacts/numa-page.png" ] || fail "empty screenshot"
echo "ui check: ok, screenshot $artifacts/numa-page.png"
