#!/usr/bin/env bash
# Tools the deployment tests (tests/deploy) need: openssl and redis-server (TLS, ACL,
# Sentinel) and a compose validator; and libfaketime (package faketime) for the clock-skew
# tests (tests/integration/test_clocks.py). No docker engine is needed: the standalone
# docker-compose (Debian's package) validates the compose files without one. The engine is
# make test-compose's business (scripts/test_compose.sh).
set -euo pipefail
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(faketime)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
[ ${#missing[@]} -eq 0 ] && { echo "deploy tools: present"; exit 0; }
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deploy tools: installing ${missing[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "deploy tools: missing ${missing[*]}; tests/deploy will skip (and fail in CI)" >&2
fi
