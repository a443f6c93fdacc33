#!/usr/bin/env bash
# Builds the two images the CRI tests use from Debian's busybox-static, with no registry:
#   devicelet.local/busybox:1  (command: sh)
#   devicelet.local/pause:1    (the sandbox image: sleeps until killed)
# as one OCI image-layout archive, and imports it into containerd's k8s.io namespace.
# Usage: image.sh CONTAINERD_SOCKET [OUT_TAR]
set -euo pipefail
sock="$1"
out="${2:-$(mktemp -d)/devicelet-images.tar}"
busybox=/bin/busybox
[ -x "$busybox" ] || { echo "image.sh: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev"
cp "$busybox" "$rootfs/bin/busybox"
# One symlink per applet, pointing at /bin/busybox as seen inside the container.
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
done
echo 'root:x:0:0:root:/:/bin/sh' > "$rootfs/etc/passwd"
echo 'root:x:0:' > "$rootfs/etc/group"
layout="$work/layout"
mkdir -p "$layout/blobs/sha256"
# A reproducible layer: fixed owner and mtime, sorted names.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00:00' \
  -C "$rootfs" -cf "$work/layer.tar" .
layer_digest="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
layer_size="$(stat -c %s "$work/layer.tar")"
mv "$work/layer.tar" "$layout/blobs/sha256/$layer_digest"

blob() { # writes stdin as a blob, prints "digest size"
  local tmp="$work/blob.tmp"; cat > "$tmp"
  local d; d="$(sha256sum "$tmp" | cut -d' ' -f1)"
  local s; s="$(stat -c %s "$tmp")"
  mv "$tmp" "$layout/blobs/sha256/$d"; echo "$d $s"
}
manifests=""
for spec in 'busybox|"Cmd":["sh"]' 'pause|"Entrypoint":["/bin/sleep","2147483647"]'; do
  name="${spec%%|*}"; process="${spec#*|}"
  read -r cfg_digest cfg_size < <(printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$process" "$layer_digest" | blob)
  read -r man_digest man_size < <(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' "$cfg_digest" "$cfg_size" "$layer_digest" "$layer_size" | blob)
  [ -z "$manifests" ] || manifests="$manifests,"
  manifests="$manifests{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$man_digest\",\"size\":$man_size,\"annotations\":{\"io.containerd.image.name\":\"devicelet.local/$name:1\",\"org.opencontainers.image.ref.name\":\"1\"}}"
done
printf '{"schemaVersion":2,"manifests":[%s]}' "$manifests" > "$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
tar -C "$layout" -cf "$out" oci-layout index.json blobs
ctr --address "$sock" --namespace k8s.io images import --all-platforms "$out" >/dev/null
ctr --address "$sock" --namespace k8s.io images ls -q | grep '^devicelet.local/'
