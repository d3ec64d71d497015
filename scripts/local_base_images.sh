#!/usr/bin/env bash
# Base images without a registry: a Debian bookworm root file system from the Debian mirror
# (debootstrap), imported into docker, then a Python and a Redis image on top of it
# (scripts/local_base/). Images already built are reused. Prints the two .env lines:
#   PYTHON_IMAGE=eaglegen-local/python:3.11-bookworm
#   REDIS_IMAGE=eaglegen-local/redis:7-bookworm
# Needs root, debootstrap and a docker engine. DEBIAN_MIRROR: another Debian mirror.
set -euo pipefail
cd "$(dirname "$0")/local_base"
ROOTFS=eaglegen-local/bookworm-rootfs:latest
PYTHON_TAG=eaglegen-local/python:3.11-bookworm
REDIS_TAG=eaglegen-local/redis:7-bookworm
PACKAGES=ca-certificates,python3,python3-pip,python-is-python3,redis-server,redis-tools

have() { docker image inspect "$1" >/dev/null 2>&1; }

import_rootfs() {
  dir=$(mktemp -d)
  trap 'rm -rf "$dir" "$dir.log"' EXIT
  if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$dir" \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$dir.log" 2>&1; then
    tail -20 "$dir.log" >&2
    exit 1
  fi
  # This host's own CAs (an internal mirror, a TLS-inspecting proxy), for pip in the build.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    chroot "$dir" update-ca-certificates >/dev/null 2>&1
  fi
  # As in python:slim, pip installs into /usr/local (Debian marks its python as managed).
  rm -f "$dir"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | docker import - "$ROOTFS" >/dev/null
}

if ! have "$PYTHON_TAG" || ! have "$REDIS_TAG"; then
  have "$ROOTFS" || import_rootfs
  docker build -q -t "$PYTHON_TAG" -f python.Dockerfile . >/dev/null
  docker build -q -t "$REDIS_TAG" -f redis.Dockerfile . >/dev/null
fi
echo "PYTHON_IMAGE=$PYTHON_TAG"
echo "REDIS_IMAGE=$REDIS_TAG"
