#!/usr/bin/env bash
# Pods that really run: devicelet's CRI runtime against a real containerd.
#
# Installs Debian's containerd, runc, busybox-static and CNI plugins when missing, starts a
# private containerd (its own root, state and socket in a temporary directory; host network
# pods; restrict_oom_score_adj because these machines run inside a container whose
# oom_score_adj runc may not lower), imports devicelet.local/busybox:1 and
# devicelet.local/pause:1 built from busybox-static (no registry), then runs
#   - crates/devicelet/tests/cri.rs (local mode: devices, CDI, cpuset, restarts, adoption),
#   - with CRI_CALLS_PODS=N and the test name runtime_calls_per_second, a measurement: N idle
#     running pods, CRI calls per second by operation and CPU of serve and containerd,
#   - and, when CRI_CLUSTER=1, the cluster suite's TestCRI* tests (Jobs Succeeded/Failed,
#     volumes, and deploy/scheduler's pods on a devicelet node from the image of DEVICELET_BIN).
# Usage: interop/cri/run.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work="$(mktemp -d /tmp/devicelet-cri.XXXXXX)"
sock="$work/containerd.sock"
mkdir -p "$work/root" "$work/state" "$work/cni"
cat > "$work/cni/10-loopback.conflist" <<'CNI'
{"cniVersion":"0.4.0","name":"devicelet-lo","plugins":[{"type":"loopback"}]}
CNI
cat > "$work/config.toml" <<TOML
version = 2
root = "$work/root"
state = "$work/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "devicelet.local/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$work/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
TOML
containerd --config "$work/config.toml" > "$work/containerd.log" 2>&1 &
ctrd=$!
cleanup() {
  set +e  # best effort: nothing here may turn a passing run red
  kill "$ctrd" 2>/dev/null || true
  wait "$ctrd" 2>/dev/null || true
  # Shims of containers still running outlive containerd; their mounts pin the directory.
  pkill -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
  sleep 1
  { grep -o " $work[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work" 2>/dev/null || { sleep 2; rm -rf "$work" 2>/dev/null; } || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "containerd did not start:"; cat "$work/containerd.log"; exit 1; }
containerd --version
bash interop/cri/image.sh "$sock" "$work/images.tar"

# devicelet's own image (deploy/image/build.sh), when DEVICELET_IMAGE names its archive:
# imported like any OCI archive and run as its non-root user; `devicelet demo` must pass inside.
if [ -n "${DEVICELET_IMAGE:-}" ]; then
  ctr --address "$sock" --namespace k8s.io images import "$DEVICELET_IMAGE" >/dev/null
  image_out="$(timeout 300 ctr --address "$sock" --namespace k8s.io run --rm \
    devicelet.local/devicelet:dev devicelet-image-check /usr/local/bin/devicelet demo 2>&1)" || {
    echo "devicelet image: demo failed in the container:"; echo "$image_out"; exit 1; }
  echo "$image_out" | tail -3
  echo "devicelet image: $(ctr --address "$sock" --namespace k8s.io run --rm \
    devicelet.local/devicelet:dev devicelet-image-version /usr/local/bin/devicelet --version 2>&1)"
fi

export DEVICELET_CRI_ENDPOINT="unix://$sock"
# For runtime_calls_per_second (CRI_CALLS_PODS=200 ... run.sh runtime_calls_per_second): the
# CPU time of containerd beside devicelet's.
export CRI_CONTAINERD_PID="$ctrd"
status=0
cargo test --locked -p devicelet --test cri "$@" -- --nocapture --test-threads 3 || status=$?
if [ "$status" -eq 0 ] && [ "${CRI_CLUSTER:-0}" = 1 ]; then
  bin="${DEVICELET_BIN:-$PWD/target/debug/devicelet}"
  # The scheduler's pods run the binary under test, packed by the repo's image script (a
  # prebuilt, dynamically linked binary with its libraries: no static build in CI).
  DEVICELET_PREBUILT="$bin" IMAGE_NAME=devicelet.local/devicelet:test \
    bash deploy/image/build.sh "$work/devicelet-test-image.tar"
  ctr --address "$sock" --namespace k8s.io images import "$work/devicelet-test-image.tar" >/dev/null
  DEVICELET_TEST_IMAGE=devicelet.local/devicelet:test DEVICELET_BIN="$bin" \
    CLUSTER_E2E_TIMEOUT="${CLUSTER_E2E_TIMEOUT:-900}" \
    bash interop/cluster/run.sh -run 'TestCRI' -v || status=$?
fi
if [ "$status" -ne 0 ]; then
  echo "--- containerd log (last 40 lines)"; tail -40 "$work/containerd.log"
fi
exit "$status"
