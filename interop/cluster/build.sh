#!/usr/bin/env bash
# Builds the test control plane from Go modules and prints the directory holding the binaries:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes, see go.mod), etcd
# (go.etcd.io/etcd/server/v3) and dra-test-driver (k8s.io/kubernetes/test/e2e/dra/test-driver).
#
#   bin="$(bash interop/cluster/build.sh)"
#
# The binaries are cached across runs in ${DEVICELET_CACHE_DIR:-$HOME/.cache/devicelet}/controlplane/KEY
# where KEY names the Kubernetes and etcd versions and hashes go.mod, go.sum and the Go version:
# a cold build takes minutes on 2 cores, a warm one nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' go.mod)"
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' go.mod)"
sum="$( (cat go.mod go.sum build.sh; go env GOVERSION GOARCH) | sha256sum | cut -c1-12)"
cache="${DEVICELET_CACHE_DIR:-$HOME/.cache/devicelet}/controlplane/k8s-${k8s_version}-etcd-${etcd_version}-${sum}"
bin="$cache/bin"
programs=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd dra-test-driver)

complete=1
for p in "${programs[@]}"; do [ -x "$bin/$p" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "controlplane: cached binaries in $bin" >&2
  echo "$bin"
  exit 0
fi

echo "controlplane: building Kubernetes $k8s_version and etcd $etcd_version into $bin (a cold build takes several minutes)" >&2
start=$(date +%s)
tmp="$cache/bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
go mod download
# The version the programs report (kubectl version, /version, the Node's skew checks).
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
export CGO_ENABLED=0
go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl
echo "controlplane: Kubernetes built after $(( $(date +%s) - start ))s" >&2
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
go build -trimpath -ldflags "$ldflags" -o "$tmp/dra-test-driver" k8s.io/kubernetes/test/e2e/dra/test-driver
rm -rf "$bin"
mv "$tmp" "$bin"
echo "controlplane: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
