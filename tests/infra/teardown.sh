#!/usr/bin/env bash
# Stop what tests/infra/provision.sh started: the loopback registry and dockerd.
# Usage: tests/infra/teardown.sh [--registry-only] [--purge]
#   --registry-only  leave dockerd running
#   --purge          also delete registry storage, the cached rootfs tarball and the base image
# Only processes recorded in pid files are stopped (the registry's pid file from provision.sh,
# dockerd's own /var/run/docker.pid).
set -Eeuo pipefail

STATE_DIR="${ENVBUILD_TEST_STATE_DIR:-/var/lib/envbuild-test}"
CACHE_DIR="${ENVBUILD_TEST_CACHE_DIR:-/var/cache/envbuild-test}"
DOCKER="${ENVBUILD_TEST_DOCKER:-/usr/bin/docker}"
BASE_IMAGE="${ENVBUILD_TEST_BASE_IMAGE:-envbuild-test/base:bookworm}"
DOCKERD=1 PURGE=0
for a in "$@"; do
  case "$a" in
    --registry-only) DOCKERD=0 ;;
    --purge) PURGE=1 ;;
    *) echo "teardown: unknown option $a" >&2; exit 2 ;;
  esac
done

stop_pidfile() {  # stop_pidfile FILE WHAT
  local pid
  [[ -f "$1" ]] || { echo "teardown: no $2 pid file ($1)"; return 0; }
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then echo "teardown: $2 pid $pid still running after 30s" >&2; return 1; fi
    echo "teardown: stopped $2 (pid $pid)"
  else
    echo "teardown: $2 (pid $pid) was not running"
  fi
  rm -f "$1"
}

stop_pidfile "$STATE_DIR/registry.pid" docker-registry
if ((PURGE)); then
  rm -rf "$STATE_DIR/registry" "$CACHE_DIR"/rootfs-*.tar.gz
  if "$DOCKER" version >/dev/null 2>&1; then "$DOCKER" rmi "$BASE_IMAGE" >/dev/null 2>&1 || true; fi
  echo "teardown: purged registry storage, cached rootfs, $BASE_IMAGE"
fi
if ((DOCKERD)); then stop_pidfile /var/run/docker.pid dockerd; fi
