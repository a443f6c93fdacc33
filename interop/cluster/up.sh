#!/usr/bin/env bash
# Starts a private Kubernetes control plane on 127.0.0.1 for tests and demos:
# etcd, kube-apiserver (Node,RBAC authorization, NodeRestriction), kube-controller-manager and
# kube-scheduler, on random free ports, with a fresh CA, serving and client certificates and a
# service-account key pair.
#
#   bash interop/cluster/up.sh STATE_DIR [BIN_DIR]
#
# BIN_DIR defaults to what build.sh prints (building or reusing the cache). Writes into STATE_DIR:
#   env                 shell lines: KUBECONFIG (admin, for the test harness only), APISERVER, ...
#   admin.kubeconfig    system:masters: used by tests to create pods, never by devicelet
#   pids, logs/*.log    the processes (down.sh STATE_DIR stops them)
# Mint a node identity for devicelet with node.sh STATE_DIR NODE_NAME.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state="${1:?usage: up.sh STATE_DIR [BIN_DIR]}"
bin="${2:-}"
[ -n "$bin" ] || bin="$(bash "$here/build.sh")"
mkdir -p "$state/pki" "$state/logs" "$state/etcd"
state="$(cd "$state" && pwd)"
pki="$state/pki"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# --- certificates -------------------------------------------------------------------------
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=devicelet-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
# client_cert NAME CN [O]
client_cert() {
  local name="$1" cn="$2" org="${3:-}" subj="/CN=$2"
  [ -z "$org" ] || subj="/O=$org/CN=$cn"
  openssl_quiet req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  printf 'extendedKeyUsage=clientAuth\n' > "$pki/$name.ext"
  openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -set_serial "0x$(openssl rand -hex 12)" \
    -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
}
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr"
printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' \
  > "$pki/apiserver.ext"
openssl_quiet x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -set_serial "0x$(openssl rand -hex 12)" \
  -days 2 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt"
client_cert admin admin system:masters
client_cert controller-manager system:kube-controller-manager
client_cert scheduler system:kube-scheduler
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

etcd_port="$(free_port)"; etcd_peer="$(free_port)"; api_port="$(free_port)"
kcm_port="$(free_port)"; sched_port="$(free_port)"
server="https://127.0.0.1:$api_port"

# kubeconfig NAME: a kubeconfig for the client certificate NAME.
kubeconfig() {
  cat > "$state/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: devicelet-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $pki/$1.crt
    client-key: $pki/$1.key
contexts:
- name: $1
  context: {cluster: devicelet-test, user: $1}
current-context: $1
KC
}
kubeconfig admin; kubeconfig controller-manager; kubeconfig scheduler

# --- processes ----------------------------------------------------------------------------
: > "$state/pids"
launch() {
  local name="$1"; shift
  setsid "$@" > "$state/logs/$name.log" 2>&1 < /dev/null &
  echo "$! $name" >> "$state/pids"
}
fail() {
  echo "controlplane: $1; last lines of its log:" >&2
  tail -n 30 "$state/logs/$2.log" >&2 || true
  bash "$here/down.sh" "$state" || true
  exit 1
}
# wait_for NAME CMD...: up to 90 s for CMD to succeed.
wait_for() {
  local name="$1"; shift
  for _ in $(seq 1 180); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  fail "$name did not become ready within 90 s" "$name"
}

launch etcd "$bin/etcd" --name devicelet-test --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "devicelet-test=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn
wait_for etcd curl -sf "http://127.0.0.1:$etcd_port/health"

# The Workload API (scheduling.k8s.io/v1alpha2 PodGroups, pod.spec.schedulingGroup) and its
# scheduler features, alpha in 1.36: gang scheduling, topology-aware placement, PodGroup claims.
workload_gates="GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true,DRAWorkloadResourceClaims=true"

# ResourceHealthStatus (alpha) keeps containerStatuses[].allocatedResourcesStatus in pod status
# (KEP-4680); without it the API server drops the field the node reports. DRADeviceTaintRules
# (beta, off by default: its API, resource.k8s.io/v1beta2 DeviceTaintRule, is off by default)
# lets `devicelet explain` be tested against taints the scheduler applies from rules.
launch kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --cert-dir "$state/apiserver" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --enable-bootstrap-token-auth \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24 \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --feature-gates "ResourceHealthStatus=true,DRADeviceTaintRules=true,$workload_gates" \
  --runtime-config resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1alpha2=true \
  --allow-privileged=true --endpoint-reconciler-type none
wait_for kube-apiserver curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server/readyz"

# Client QPS 100 for the scheduler and 500 for the controllers (defaults 20 and 50) so that
# creating and binding hundreds of pods (thousands of template claims in the scheduler benchmark)
# measures the nodes and schedulers, not the controllers' client-side rate limits. Service-account credentials per controller: the node lifecycle controller (which removes the
# not-ready taint once the node reports Ready) works only with them under RBAC.
launch kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$state/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
  --use-service-account-credentials=true --service-account-private-key-file "$pki/sa.key" \
  --kube-api-qps 500 --kube-api-burst 1000 \
  --root-ca-file "$pki/ca.crt" --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --feature-gates "ResourceHealthStatus=true,DRADeviceTaintRules=true,$workload_gates"
launch kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$state/scheduler.kubeconfig" \
  --authentication-kubeconfig "$state/scheduler.kubeconfig" \
  --authorization-kubeconfig "$state/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false \
  --feature-gates "DRADeviceTaintRules=true,$workload_gates" \
  --kube-api-qps 100 --kube-api-burst 200
wait_for kube-controller-manager curl -skf "https://127.0.0.1:$kcm_port/healthz"
wait_for kube-scheduler curl -skf "https://127.0.0.1:$sched_port/healthz"

cat > "$state/env" <<ENV
export KUBECONFIG=$state/admin.kubeconfig
export DEVICELET_TEST_APISERVER=$server
export DEVICELET_TEST_CONTROLPLANE=$state
export DEVICELET_TEST_CONTROLPLANE_BIN=$bin
ENV
echo "controlplane: up at $server (etcd :$etcd_port, controller-manager :$kcm_port, scheduler :$sched_port); state in $state" >&2
