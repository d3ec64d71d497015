#!/usr/bin/env bash
# make test-compose: the docker stack for real (tests/compose), on a clean machine too.
# - no engine: Debian's docker.io + docker-compose (v1; Debian has no compose v2 plugin) are
#   installed with apt-get (root only; elsewhere install docker yourself);
# - no running daemon: dockerd is started, and stopped again at the end (KEEP_DOCKERD=1 keeps it);
# - base images: the registry's where it answers, else built from Debian packages
#   (scripts/local_base_images.sh; reused from the engine's image store on the next run);
# - the tier runs under a deadline, and whatever its project left behind is removed.
# Traffic: the Debian mirror and PyPI (image build), otherwise 127.0.0.1 and the stack's network.
set -euo pipefail
cd "$(dirname "$0")/.."
DEADLINE=${TEST_COMPOSE_DEADLINE:-900}
PROJECT=egtest$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
t0=$SECONDS
took() { echo "test-compose: $1 $((SECONDS - t0)) s"; t0=$SECONDS; }

need() { command -v "$1" >/dev/null 2>&1; }
have_compose() { docker compose version >/dev/null 2>&1 || need docker-compose; }

install_tools() {
  local missing=()
  need dockerd || docker info >/dev/null 2>&1 || missing+=(docker.io)
  have_compose || missing+=(docker-compose)
  need debootstrap || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! need apt-get; then
    echo "test-compose: missing ${missing[*]} (install them, or run as root on Debian)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

dockerd_pid=""
start_engine() {
  docker info >/dev/null 2>&1 && return
  dockerd >/tmp/test-compose-dockerd.log 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 1; done
  tail -20 /tmp/test-compose-dockerd.log >&2
  exit 1
}

cleanup() {
  local label=label=com.docker.compose.project=$PROJECT
  docker ps -aq --filter "$label" | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker volume ls -q --filter "$label" | xargs -r docker volume rm >/dev/null 2>&1 || true
  docker network ls -q --filter "$label" | xargs -r docker network rm >/dev/null 2>&1 || true
  if [ -n "$dockerd_pid" ] && [ -z "${KEEP_DOCKERD:-}" ]; then
    kill "$dockerd_pid" 2>/dev/null && wait "$dockerd_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# The official bases where the registry answers, else local ones (exported for the tier).
base_images() {
  [ -n "${PYTHON_IMAGE:-}" ] && return
  if timeout 60 docker pull -q python:3.11.11-slim-bookworm >/dev/null 2>&1 &&
     timeout 60 docker pull -q redis:7.2.7-alpine >/dev/null 2>&1; then
    return
  fi
  echo "test-compose: registry unreachable, base images from Debian packages"
  local lines line
  lines=$(scripts/local_base_images.sh)
  for line in $lines; do export "${line?}"; done
}

install_tools; took "tools"
start_engine; took "engine"
base_images; took "base images"
export EAGLEGEN_COMPOSE_PROJECT=$PROJECT
timeout --kill-after=30 "$DEADLINE" .venv/bin/pytest -m compose tests/compose -s -p no:cacheprovider
took "stack tier"
