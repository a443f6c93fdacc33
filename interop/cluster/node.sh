#!/usr/bin/env bash
# Mints a node identity for devicelet: a client certificate for user system:node:NODE in group
# system:nodes, signed by the control plane's CA, and a kubeconfig using it. Prints its path.
#
#   bash interop/cluster/node.sh STATE_DIR NODE_NAME [GROUP]
#
# GROUP (default system:nodes) exists for tests of a misconfigured identity.
#
# With --authorization-mode=Node,RBAC and NodeRestriction this identity may do exactly what a
# kubelet may do for its own node; it has no other permission.
set -euo pipefail
state="${1:?usage: node.sh STATE_DIR NODE_NAME}"
node="${2:?usage: node.sh STATE_DIR NODE_NAME}"
case "$node" in *[!a-z0-9.-]*|'') echo "node.sh: '$node' is not a valid node name" >&2; exit 2 ;; esac
pki="$state/pki"
server="$(awk '/server:/ { print $2; exit }' "$state/admin.kubeconfig")"
group="${3:-system:nodes}"
case "$group" in *[!a-z0-9:.-]*|'') echo "node.sh: '$group' is not a valid group" >&2; exit 2 ;; esac
name="node-$node"
openssl req -newkey rsa:2048 -nodes -subj "/O=$group/CN=system:node:$node" \
  -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > "$pki/$name.ext"
openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -set_serial "0x$(openssl rand -hex 12)" \
  -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
cat > "$state/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: devicelet-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: system:node:$node
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: node
  context: {cluster: devicelet-test, user: "system:node:$node"}
current-context: node
KC
echo "$state/$name.kubeconfig"
