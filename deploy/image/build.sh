#!/usr/bin/env bash
# Builds the devicelet image with no Docker daemon and no base image from a registry:
#   1. a statically linked, stripped `devicelet` (glibc with +crt-static, cargo profile `dist`);
#   2. a root filesystem of that binary, the host's CA bundle, /etc/passwd and /etc/group with
#      the non-root user 65532 (`devicelet`), and an empty /tmp;
#   3. one reproducible layer (sorted names, fixed owner and mtime, gzip without a timestamp)
#      and an OCI image layout written as an archive that `ctr images import` (containerd),
#      `podman load` and `skopeo copy oci-archive:` read.
# Image name: devicelet.local/devicelet:dev (deploy/scheduler's Deployment uses it).
# Usage: deploy/image/build.sh [OUT_TAR]     (default target/image/devicelet-image.tar)
# Prints the binary's, the layer's and the archive's sizes.
#
# Tests: DEVICELET_PREBUILT=PATH packs that binary instead of building one (no static build,
# which takes a while on a small machine). A dynamically linked one is stripped and gets its
# shared libraries and program interpreter beside it (as `ldd` lists them): an image for the
# CRI suite (interop/cri/run.sh), not for release.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$PWD/target/image/devicelet-image.tar}"
name="${IMAGE_NAME:-devicelet.local/devicelet:dev}"
target=x86_64-unknown-linux-gnu
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
if [ -n "${DEVICELET_PREBUILT:-}" ]; then
  bin="$work/devicelet"
  cp "$DEVICELET_PREBUILT" "$bin"
  strip "$bin"
  if readelf -l "$bin" | grep -q 'program interpreter'; then
    # Each library at the path the dynamic loader looks it up by.
    ldd "$bin" | grep -o '/[^ ]*' | while read -r lib; do
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
  fi
  kind="prebuilt, stripped"
  level=-1  # a test image: fast over small
else
  # Its own target directory: the static flags would otherwise rebuild target/release.
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --locked --profile dist -p devicelet \
    --target "$target" --target-dir target/static
  bin="target/static/$target/dist/devicelet"
  # A static(-pie) binary has no program interpreter.
  if readelf -l "$bin" | grep -q 'program interpreter'; then
    echo "build.sh: $bin is dynamically linked" >&2
    exit 1
  fi
  kind="static, stripped"
  level=-9
fi
install -m 0755 "$bin" "$rootfs/usr/local/bin/devicelet"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\ndevicelet:x:65532:65532:devicelet:/:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\ndevicelet:x:65532:\n' > "$rootfs/etc/group"
layout="$work/layout"
mkdir -p "$layout/blobs/sha256"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00:00' \
  -C "$rootfs" -cf "$work/layer.tar" .
diff_id="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
gzip -n "$level" "$work/layer.tar"

blob() { # moves file $1 into the layout, prints "digest size"
  local d s
  d="$(sha256sum "$1" | cut -d' ' -f1)"
  s="$(stat -c %s "$1")"
  mv "$1" "$layout/blobs/sha256/$d"
  echo "$d $s"
}
read -r layer_digest layer_size < <(blob "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"User":"65532:65532","Env":["PATH=/usr/local/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"Entrypoint":["/usr/local/bin/devicelet"],"Cmd":["--help"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$diff_id" > "$work/config.json"
read -r cfg_digest cfg_size < <(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
  "$cfg_digest" "$cfg_size" "$layer_digest" "$layer_size" > "$work/manifest.json"
read -r man_digest man_size < <(blob "$work/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$man_digest" "$man_size" "$name" "${name##*:}" > "$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00:00' \
  -C "$layout" -cf "$out" oci-layout index.json blobs
echo "image $name: $out"
echo "binary $(stat -c %s "$bin") bytes ($kind); layer $layer_size bytes gzipped; archive $(stat -c %s "$out") bytes; manifest sha256:$man_digest"
