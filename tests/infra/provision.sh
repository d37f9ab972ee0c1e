#!/usr/bin/env bash
# Make this machine ready for envbuild's real Docker tests, all on loopback:
#   Debian docker.io (dockerd 20.10, BuildKit built in), Debian docker-registry on
#   127.0.0.1:5000 (no auth), and a Debian base image made with debootstrap and pushed into
#   that registry under every image reference the tests' mirror maps to.
#   Also installs skopeo (export-image/import-image tests), podman and buildah, and pushes a
#   two-platform base (amd64 + arm64, the arm64 RUN steps under qemu-user-static) for --platform.
# Idempotent: every step checks first and skips what is already there. Run as root.
#
# Usage: tests/infra/provision.sh [--images-file FILE]... [--no-smoke] [IMAGE_REF]...
#   IMAGE_REF       e.g. 127.0.0.1:5000/nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04
#   --images-file   file with one image reference per line ('#' comments, blank lines ok)
#   --no-smoke      skip the container run and BuildKit smoke build at the end
#   --python-images-file FILE
#                   lines 'X.Y IMAGE_REF': the base plus CPython X.Y (a copy of this machine's
#                   pyenv build, at /usr/local), pushed as IMAGE_REF: a shipped profile's base
#                   with that profile's own Python, for the real-image build test
#
# Environment (all optional):
#   ENVBUILD_TEST_REGISTRY_PORT   registry port on 127.0.0.1 (5000)
#   ENVBUILD_TEST_DOCKER          docker client that can do BuildKit builds (/usr/bin/docker)
#   ENVBUILD_TEST_STORAGE_DRIVER  force a dockerd storage driver (default: dockerd's choice,
#                                 overlay2 here; falls back to vfs if dockerd won't start)
#   ENVBUILD_TEST_BASE_IMAGE      local name of the imported base (envbuild-test/base:bookworm)
#   ENVBUILD_TEST_DERIVE_FROM     make the base from this local image plus ENVBUILD_TEST_APT
#                                 (Debian packages) instead of a debootstrap of its own
#   ENVBUILD_TEST_INCLUDE         packages debootstrap adds (python3,python3-venv,python3-pip,ca-certificates)
#   ENVBUILD_TEST_DEBIAN_MIRROR   mirror for debootstrap (http://deb.debian.org/debian)
#   ENVBUILD_TEST_STATE_DIR       (/var/lib/envbuild-test)   registry storage, pid files, env.sh
#   ENVBUILD_TEST_CACHE_DIR       (/var/cache/envbuild-test) cached rootfs tarball
#   ENVBUILD_TEST_LOG_DIR         (/var/log/envbuild-test)   dockerd/registry/apt/debootstrap logs
#   ENVBUILD_TEST_WAIT_S          seconds to wait for dockerd / the registry (60)
#   ENVBUILD_TEST_PYTHONS         folder of CPython builds named X.Y.Z, the newest X.Y is copied
#                                 (${PYENV_ROOT:-/root/.pyenv}/versions)
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="${ENVBUILD_TEST_REGISTRY_PORT:-5000}"
REGISTRY="127.0.0.1:${PORT}"
DOCKER="${ENVBUILD_TEST_DOCKER:-/usr/bin/docker}"
STORAGE_DRIVER="${ENVBUILD_TEST_STORAGE_DRIVER:-}"
BASE_IMAGE="${ENVBUILD_TEST_BASE_IMAGE:-envbuild-test/base:bookworm}"
DERIVE_FROM="${ENVBUILD_TEST_DERIVE_FROM:-}"
APT_PACKAGES="${ENVBUILD_TEST_APT:-}"
MIRROR="${ENVBUILD_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STATE_DIR="${ENVBUILD_TEST_STATE_DIR:-/var/lib/envbuild-test}"
CACHE_DIR="${ENVBUILD_TEST_CACHE_DIR:-/var/cache/envbuild-test}"
LOG_DIR="${ENVBUILD_TEST_LOG_DIR:-/var/log/envbuild-test}"
WAIT_S="${ENVBUILD_TEST_WAIT_S:-60}"
REGISTRY_CONFIG="${HERE}/registry.yml"
SUITE=bookworm
INCLUDE="${ENVBUILD_TEST_INCLUDE:-python3,python3-venv,python3-pip,ca-certificates}"
PACKAGES=(docker.io docker-registry debootstrap curl skopeo podman buildah qemu-user-static binfmt-support)

IMAGES=()
PY_IMAGES=()  # "X.Y REF" pairs
SMOKE=1
while (($#)); do
  case "$1" in
    --images-file)
      [[ $# -ge 2 && -r "$2" ]] || { echo "provision: --images-file needs a readable file" >&2; exit 2; }
      while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"; line="${line//[[:space:]]/}"
        if [[ -n "$line" ]]; then IMAGES+=("$line"); fi
      done <"$2"
      shift 2 ;;
    --python-images-file)
      [[ $# -ge 2 && -r "$2" ]] || { echo "provision: --python-images-file needs a readable file" >&2; exit 2; }
      while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"; read -r -a words <<<"$line"
        ((${#words[@]} == 0)) && continue
        [[ ${#words[@]} -eq 2 && "${words[0]}" =~ ^3\.[0-9]+$ ]] ||
          { echo "provision: $2: '$line' is not 'X.Y IMAGE_REF' (e.g. 3.10 $REGISTRY/nvidia/cuda:TAG)" >&2; exit 2; }
        PY_IMAGES+=("${words[0]} ${words[1]}")
      done <"$2"
      shift 2 ;;
    --no-smoke) SMOKE=0; shift ;;
    -h|--help) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "provision: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) IMAGES+=("$1"); shift ;;
  esac
done

# ---------------------------------------------------------------- helpers
T0=$(date +%s%N)
SUMMARY=()
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
log() { printf '[provision %6.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
die() { printf '[provision] ERROR: %s\n' "$*" >&2; exit 1; }
CURRENT_STEP=setup
STEP_OUT=$(mktemp)
step() {  # step NAME FUNC: run FUNC (errexit applies inside), record what it did and how long
  local name="$1"; shift
  local t; t=$(now_ms)
  CURRENT_STEP="$name"
  log "== $name"
  "$@" >"$STEP_OUT"
  local what; what="$(tr '\n' ' ' <"$STEP_OUT")"; what="${what% }"
  local dt=$(( $(now_ms) - t ))
  SUMMARY+=("$(printf '%-9s %6.1fs  %s' "$name" "${dt}e-3" "$what")")
  log "   $what ($(printf '%.1f' "${dt}e-3")s)"
}
on_exit() {
  local rc=$?
  rm -f "$STEP_OUT"
  if [[ $rc -ne 0 ]]; then echo "[provision] FAILED in step '$CURRENT_STEP' (exit $rc); logs in $LOG_DIR" >&2; fi
}
trap on_exit EXIT

[[ $EUID -eq 0 ]] || die "run as root (installs packages, starts dockerd)"
for ref in "${IMAGES[@]}" "${PY_IMAGES[@]#* }"; do
  [[ "$ref" == "$REGISTRY/"* ]] || die "image reference '$ref' is not in the loopback registry $REGISTRY/ (refusing to push anywhere else)"
  [[ "$ref" != *@* ]] || die "image reference '$ref' has a digest; give a tag"
done
mkdir -p "$STATE_DIR/registry" "$CACHE_DIR" "$LOG_DIR"

exec 9>"$STATE_DIR/provision.lock"
flock -w 600 9 || die "another provision.sh holds $STATE_DIR/provision.lock"

# ---------------------------------------------------------------- packages
missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    # a Docker from another package (docker-ce, moby-engine: GitHub's runners) serves as well;
    # installing Debian's docker.io beside it conflicts (containerd vs containerd.io)
    if [[ "$p" == docker.io ]] && command -v dockerd >/dev/null && command -v docker >/dev/null; then
      continue
    fi
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}
apt_install() {
  local -a pkgs=("$@")
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${pkgs[@]}" \
    >>"$LOG_DIR/apt.log" 2>&1
}
install_packages() {
  local -a miss
  mapfile -t miss < <(missing_packages)
  if ((${#miss[@]} == 0)); then echo "already installed: ${PACKAGES[*]}"; return 0; fi
  # Keep maintainer scripts from starting services: the packaged docker-registry would listen
  # on :5000 with htpasswd auth, and the packaged dockerd without our flags.
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  local updated="" ok=0
  # apt-get update only when needed: a package without a candidate, or an install that fails
  # (stale lists give 404s); then update once and retry.
  local p
  for p in "${miss[@]}"; do
    local policy; policy=$(apt-cache policy "$p" 2>/dev/null || true)
    if [[ "$policy" != *"Candidate: "[0-9]* ]]; then
      if ! apt-get update -q -o DPkg::Lock::Timeout=300 >>"$LOG_DIR/apt.log" 2>&1; then
        if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
        echo "apt-get update failed; see $LOG_DIR/apt.log" >&2; return 1
      fi
      updated=" (after apt-get update)"; break
    fi
  done
  if apt_install "${miss[@]}"; then ok=1
  elif [[ -z "$updated" ]] && apt-get update -q -o DPkg::Lock::Timeout=300 >>"$LOG_DIR/apt.log" 2>&1 && apt_install "${miss[@]}"; then
    ok=1; updated=" (after apt-get update)"
  fi
  if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
  ((ok)) || { echo "apt-get install ${miss[*]} failed; see $LOG_DIR/apt.log" >&2; return 1; }
  echo "installed ${miss[*]}$updated"
}
step packages install_packages

# ---------------------------------------------------------------- dockerd
docker_answers() { timeout 10 "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
start_dockerd() {
  [[ -x "$DOCKER" ]] || { echo "docker client $DOCKER not found" >&2; return 1; }
  if docker_answers; then
    echo "dockerd already answers ($("$DOCKER" info --format '{{.ServerVersion}}, storage {{.Driver}}'))"; return 0
  fi
  if [[ -n "${DOCKER_HOST:-}" && "$DOCKER_HOST" != "unix:///var/run/docker.sock" ]]; then
    echo "DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local dockerd for it" >&2; return 1
  fi
  # A dockerd that died leaves its pid file (and containerd's) behind; dockerd refuses to start then.
  local pf
  for pf in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
    if [[ -f "$pf" ]] && ! kill -0 "$(cat "$pf" 2>/dev/null)" 2>/dev/null; then rm -f "$pf"; fi
  done
  if [[ -f /var/run/docker.pid ]]; then
    echo "a dockerd (pid $(cat /var/run/docker.pid)) runs but does not answer; see $LOG_DIR/dockerd.log" >&2; return 1
  fi
  local -a drivers
  if [[ -n "$STORAGE_DRIVER" ]]; then drivers=("$STORAGE_DRIVER"); else drivers=("" vfs); fi
  local d i pid
  for d in "${drivers[@]}"; do
    local -a args=(--bridge=none --iptables=false --ip-masq=false --ip-forward=false)
    if [[ -n "$d" ]]; then args+=("--storage-driver=$d"); fi
    echo "--- $(date -u +%FT%TZ) dockerd ${args[*]}" >>"$LOG_DIR/dockerd.log"
    # 9>&-: the daemon must not inherit (and so hold forever) provision.sh's lock.
    setsid nohup dockerd "${args[@]}" >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null 9>&- &
    pid=$!
    for ((i = 0; i < WAIT_S * 2; i++)); do
      if docker_answers; then
        echo "started dockerd pid $pid (${args[*]}; $("$DOCKER" info --format 'storage {{.Driver}}'); log $LOG_DIR/dockerd.log)"
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "dockerd pid $pid did not answer within ${WAIT_S}s; see $LOG_DIR/dockerd.log" >&2; return 1
    fi
    echo "dockerd ${args[*]} exited; last log lines:" >&2; tail -n 5 "$LOG_DIR/dockerd.log" >&2
    rm -f /var/run/docker.pid
  done
  echo "dockerd would not start; see $LOG_DIR/dockerd.log" >&2; return 1
}
step dockerd start_dockerd

# ---------------------------------------------------------------- registry
registry_code() { curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$REGISTRY/v2/" 2>/dev/null || true; }
start_registry() {
  local code; code=$(registry_code)
  if [[ "$code" == 401 ]] && [[ -f /var/run/docker-registry.pid ]] && kill -0 "$(cat /var/run/docker-registry.pid)" 2>/dev/null; then
    # Debian's packaged service (htpasswd auth) got started by the install; it's not ours.
    /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    sleep 1; code=$(registry_code)
  fi
  case "$code" in
    200) echo "registry already answers on http://$REGISTRY/v2/"; return 0 ;;
    401) echo "something on $REGISTRY asks for auth (Debian's packaged docker-registry service?); stop it or set ENVBUILD_TEST_REGISTRY_PORT" >&2; return 1 ;;
    000) ;;
    *) echo "something else listens on $REGISTRY (HTTP $code on /v2/); set ENVBUILD_TEST_REGISTRY_PORT" >&2; return 1 ;;
  esac
  command -v docker-registry >/dev/null || { echo "docker-registry binary missing" >&2; return 1; }
  # Copy the config out of the checkout: CI's clone may vanish while the registry keeps running.
  install -m 644 "$REGISTRY_CONFIG" "$STATE_DIR/registry.yml"
  local pid i
  echo "--- $(date -u +%FT%TZ) docker-registry serve on $REGISTRY" >>"$LOG_DIR/registry.log"
  REGISTRY_HTTP_ADDR="$REGISTRY" REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY="$STATE_DIR/registry" \
    setsid nohup docker-registry serve "$STATE_DIR/registry.yml" >>"$LOG_DIR/registry.log" 2>&1 </dev/null 9>&- &
  pid=$!
  echo "$pid" >"$STATE_DIR/registry.pid"
  for ((i = 0; i < WAIT_S * 4; i++)); do
    if [[ "$(registry_code)" == 200 ]]; then
      echo "started docker-registry pid $pid on http://$REGISTRY (storage $STATE_DIR/registry; log $LOG_DIR/registry.log)"; return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "docker-registry exited; last log lines:" >&2; tail -n 5 "$LOG_DIR/registry.log" >&2; return 1; }
    sleep 0.25
  done
  echo "registry pid $pid did not answer on http://$REGISTRY/v2/ within ${WAIT_S}s" >&2; return 1
}
step registry start_registry

# ---------------------------------------------------------------- base image
TARBALL="$CACHE_DIR/rootfs-${SUITE}-minbase-$(echo "$INCLUDE" | md5sum | cut -c1-8).tar.gz"
make_rootfs_tarball() {
  if [[ -s "$TARBALL" ]]; then echo "cached $TARBALL ($(du -h "$TARBALL" | cut -f1))"; return 0; fi
  command -v debootstrap >/dev/null || { echo "debootstrap missing" >&2; return 1; }
  local work; work=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
  if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$work/rootfs" "$MIRROR" \
      >"$LOG_DIR/debootstrap.log" 2>&1; then
    echo "debootstrap failed; tail of $LOG_DIR/debootstrap.log:" >&2; tail -n 10 "$LOG_DIR/debootstrap.log" >&2
    rm -rf "$work"; return 1
  fi
  # Drop what an image doesn't need: downloaded .debs, apt lists, caches (~100 MB).
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/cache/apt/"*.bin \
    "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/log/"*.log
  tar --numeric-owner -C "$work/rootfs" -c . | gzip -1 >"$work/rootfs.tar.gz"
  mv "$work/rootfs.tar.gz" "$TARBALL"
  rm -rf "$work"
  echo "debootstrap $SUITE minbase (+$INCLUDE) -> $TARBALL ($(du -h "$TARBALL" | cut -f1))"
}
import_base() {
  if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "$BASE_IMAGE already present ($("$DOCKER" image inspect -f '{{.Id}}' "$BASE_IMAGE" | cut -c1-19))"; return 0
  fi
  local id
  id=$("$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    --message "envbuild test base: debootstrap $SUITE minbase +$INCLUDE" \
    "$TARBALL" "$BASE_IMAGE") || return 1
  echo "imported $BASE_IMAGE ${id:0:19}"
}
# ENVBUILD_TEST_DERIVE_FROM=IMAGE (an image provisioned before) and ENVBUILD_TEST_APT="pkgs":
# this base is that image plus those Debian packages, one `docker build` (about a minute), not a
# second debootstrap of the whole system (minutes).
derive_base() {
  if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "$BASE_IMAGE already present ($("$DOCKER" image inspect -f '{{.Id}}' "$BASE_IMAGE" | cut -c1-19))"; return 0
  fi
  "$DOCKER" image inspect "$DERIVE_FROM" >/dev/null 2>&1 || { echo "$DERIVE_FROM is not there to derive from" >&2; return 1; }
  local ctx; ctx=$(mktemp -d)
  printf 'FROM %s\nRUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends %s && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin\n' \
    "$DERIVE_FROM" "$APT_PACKAGES" >"$ctx/Dockerfile"
  if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --network=host -t "$BASE_IMAGE" "$ctx" \
      >"$LOG_DIR/derive.log" 2>&1; then
    rm -rf "$ctx"; echo "deriving $BASE_IMAGE from $DERIVE_FROM failed; see $LOG_DIR/derive.log" >&2; return 1
  fi
  rm -rf "$ctx"
  echo "derived $BASE_IMAGE from $DERIVE_FROM (+$APT_PACKAGES)"
}
if [[ -n "$DERIVE_FROM" ]]; then
  step derive derive_base
else
  step rootfs make_rootfs_tarball
  step import import_base
fi

# ---------------------------------------------------------------- push under the mirror's names
registry_has() {  # registry_has NAME TAG
  local code
  code=$(curl -s -o /dev/null -m 10 -w '%{http_code}' -I \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REGISTRY/v2/$1/manifests/$2" || true)
  [[ "$code" == 200 ]]
}
registry_config() {  # registry_config NAME TAG: the image ID (config digest) the registry serves
  curl -s -m 10 -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/$1/manifests/$2" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null || true
}
push_as() {  # push_as LOCAL_IMAGE REF: push it under REF unless the registry has that image there
  local path="${2#"$REGISTRY"/}" name tag want
  if [[ "${path##*/}" == *:* ]]; then name="${path%:*}"; tag="${path##*:}"; else name="$path"; tag=latest; fi
  want=$("$DOCKER" image inspect -f '{{.Id}}' "$1")
  # the same image already under that name: nothing to do (another image there is replaced)
  if [[ "$(registry_config "$name" "$tag")" == "$want" ]]; then echo same; return 0; fi
  "$DOCKER" tag "$1" "$REGISTRY/$name:$tag"
  if ! "$DOCKER" push "$REGISTRY/$name:$tag" >>"$LOG_DIR/push.log" 2>&1; then
    echo "docker push $REGISTRY/$name:$tag failed; see $LOG_DIR/push.log" >&2; return 1
  fi
  # Drop the local alias so tests that use the name really go through the registry.
  "$DOCKER" rmi "$REGISTRY/$name:$tag" >/dev/null
  registry_has "$name" "$tag" || { echo "pushed $2 but the registry does not list it" >&2; return 1; }
  echo pushed
}
push_images() {
  local ref pushed=0 skipped=0 did
  for ref in "${IMAGES[@]}"; do
    did=$(push_as "$BASE_IMAGE" "$ref") || return 1
    if [[ "$did" == same ]]; then skipped=$((skipped + 1)); else pushed=$((pushed + 1)); fi
  done
  echo "${#IMAGES[@]} reference(s): pushed $pushed, already there $skipped"
}
step push push_images

# ---------------------------------------------------------------- bases with a profile's Python
# The stand-in base's python3 is Debian's 3.11, and a profile's Dockerfile refuses a base whose
# python3 is not the profile's Python. Debian has no 3.10 or 3.12, and python.org and Docker Hub
# do not answer here, so the base gets this machine's own CPython build (pyenv's, built against
# bookworm's libraries) copied to /usr/local, as the python:X.Y images lay it out. It is built
# with --enable-shared and a RUNPATH into pyenv's folder, which is absent in the image: ldconfig
# puts /usr/local/lib's libpython in the loader's cache instead. The test suites, IDLE, Tk and the
# static library stay out (~120 MB of the 200-300).
PYTHONS="${ENVBUILD_TEST_PYTHONS:-${PYENV_ROOT:-/root/.pyenv}/versions}"
python_source() {  # python_source X.Y: the newest X.Y.Z build in $PYTHONS
  local d
  d=$(find "$PYTHONS" -mindepth 1 -maxdepth 1 -name "$1.*" -type d 2>/dev/null | sort -V | tail -n 1)
  [[ -n "$d" && -x "$d/bin/python$1" ]] || return 1
  echo "$d"
}
python_base() {  # python_base X.Y: the local image envbuild-test/python:X.Y-bookworm, made if stale
  local v="$1" src image="envbuild-test/python:$1-$SUITE" base_id stamp ctx
  src=$(python_source "$v") || {
    echo "no CPython $v build in $PYTHONS (ENVBUILD_TEST_PYTHONS: a folder of X.Y.Z installs, as pyenv's versions/)" >&2; return 1; }
  base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$BASE_IMAGE")
  stamp="$base_id $src"
  if [[ "$("$DOCKER" image inspect -f '{{index .Config.Labels "io.envbuild.test.from"}}' "$image" 2>/dev/null)" == "$stamp" ]]; then
    echo "$image"; return 0
  fi
  ctx=$(mktemp -d)
  mkdir "$ctx/python"
  tar -C "$src" -c --exclude="./lib/python$v/test" --exclude="./lib/python$v/idlelib" \
    --exclude="./lib/python$v/tkinter" --exclude="./lib/python$v/turtledemo" \
    --exclude="./lib/python$v/lib-dynload/_tkinter*" --exclude="./lib/python$v/config-*/*.a" \
    --exclude="./bin/idle*" --exclude="./bin/pydoc*" --exclude="./bin/2to3*" --exclude="./bin/pip*" \
    --exclude="./share" . | tar -C "$ctx/python" -x
  # (the version check: python3 on PATH must be this one, not Debian's /usr/bin/python3)
  printf '%s\n' "FROM $BASE_IMAGE" "LABEL io.envbuild.test.from=\"$stamp\"" "COPY python/ /usr/local/" \
    "RUN ldconfig && python3 -c 'import sys; assert sys.version.startswith(\"$v.\"), sys.version; import venv, ensurepip, ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid'" \
    >"$ctx/Dockerfile"
  if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --network=host -t "$image" "$ctx" \
      >"$LOG_DIR/python-$v.log" 2>&1; then
    rm -rf "$ctx"; echo "building $image from $src failed; see $LOG_DIR/python-$v.log" >&2; return 1
  fi
  rm -rf "$ctx"
  echo "$image"
}
push_python_bases() {
  local pair v ref image did pushed=0 skipped=0 made=() absent=()
  for pair in "${PY_IMAGES[@]}"; do
    v="${pair%% *}"; ref="${pair#* }"
    # a machine without that CPython build provisions the rest: tests/test_real_build.py skips
    # (and fails under CI=true, whose machine has them)
    if [[ "${CI:-}" != true ]] && ! python_source "$v" >/dev/null; then absent+=("$v"); continue; fi
    image=$(python_base "$v") || return 1
    made+=("$image")
    did=$(push_as "$image" "$ref") || return 1
    if [[ "$did" == same ]]; then skipped=$((skipped + 1)); else pushed=$((pushed + 1)); fi
  done
  echo "${#PY_IMAGES[@]} reference(s) from $(printf '%s\n' "${made[@]}" | sort -u | tr '\n' ' ')(CPython from $PYTHONS): pushed $pushed, already there $skipped${absent[*]:+; none made for Python ${absent[*]} (no build in $PYTHONS)}"
}
if ((${#PY_IMAGES[@]})); then step python push_python_bases; fi

# ---------------------------------------------------------------- a two-platform base
# linux/amd64 (the base above) and linux/arm64 under one reference, for the --platform build
# test (tests/test_platforms.py). arm64 is debootstrap's first stage alone (--foreign: every
# package unpacked, none configured, which /bin/sh and coreutils do not need; about 35 s, cached);
# its RUN steps run under Debian's qemu-user-static through binfmt_misc (flag F: in containers too).
MULTIARCH="envbuild-test/base:${SUITE}-amd64-arm64"
ARM64_TARBALL="$CACHE_DIR/rootfs-${SUITE}-minbase-arm64-foreign.tar.gz"
LISTS='application/vnd.docker.distribution.manifest.list.v2+json,application/vnd.oci.image.index.v1+json'
enable_binfmt() {
  [[ -d /proc/sys/fs/binfmt_misc ]] || return 1
  if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || return 1
  fi
  [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]
}
make_multiarch_base() {
  local code
  code=$(curl -s -o /dev/null -m 10 -w '%{http_code}' -I -H "Accept: $LISTS" \
    "http://$REGISTRY/v2/${MULTIARCH%:*}/manifests/${MULTIARCH##*:}" || true)
  if [[ "$code" == 200 ]]; then echo "$REGISTRY/$MULTIARCH already there"; return 0; fi
  enable_binfmt || { echo "no qemu-aarch64 binfmt handler (qemu-user-static, binfmt-support, binfmt_misc)" >&2; return 1; }
  if [[ ! -s "$ARM64_TARBALL" ]]; then
    local work; work=$(mktemp -d "$CACHE_DIR/rootfs-arm64.XXXXXX")
    if ! debootstrap --arch=arm64 --foreign --variant=minbase "$SUITE" "$work/rootfs" "$MIRROR" \
        >"$LOG_DIR/debootstrap-arm64.log" 2>&1; then
      echo "debootstrap --arch=arm64 --foreign failed; see $LOG_DIR/debootstrap-arm64.log" >&2; rm -rf "$work"; return 1
    fi
    # (the first stage links /proc to the host's /proc; a container's runtime mounts a directory)
    rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/debootstrap" "$work/rootfs/proc"
    mkdir -m 555 "$work/rootfs/proc"
    tar --numeric-owner -C "$work/rootfs" -c . | gzip -1 >"$work/rootfs.tar.gz"
    mv "$work/rootfs.tar.gz" "$ARM64_TARBALL"
    rm -rf "$work"
  fi
  local name="${MULTIARCH%:*}" tag="${SUITE}" ctr list="envbuild-test-multiarch-base"
  "$DOCKER" tag "$BASE_IMAGE" "$REGISTRY/$name:$tag-amd64"
  "$DOCKER" push "$REGISTRY/$name:$tag-amd64" >>"$LOG_DIR/push.log" 2>&1 || { echo "docker push $tag-amd64 failed" >&2; return 1; }
  "$DOCKER" rmi "$REGISTRY/$name:$tag-amd64" >/dev/null
  ctr=$(buildah from scratch)
  buildah add "$ctr" "$ARM64_TARBALL" / >/dev/null
  buildah config --arch arm64 --os linux --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/sh "$ctr"
  buildah commit --format docker --rm "$ctr" "envbuild-test/base-arm64:$tag" >/dev/null
  buildah push --tls-verify=false "envbuild-test/base-arm64:$tag" "docker://$REGISTRY/$name:$tag-arm64" \
    >>"$LOG_DIR/push.log" 2>&1 || { echo "buildah push $tag-arm64 failed" >&2; return 1; }
  buildah rmi "envbuild-test/base-arm64:$tag" >/dev/null
  buildah manifest rm "$list" >/dev/null 2>&1 || true
  buildah manifest create "$list" >/dev/null
  buildah manifest add --tls-verify=false "$list" "docker://$REGISTRY/$name:$tag-amd64" >/dev/null
  buildah manifest add --tls-verify=false "$list" "docker://$REGISTRY/$name:$tag-arm64" >/dev/null
  buildah manifest push --all --tls-verify=false "$list" "docker://$REGISTRY/$MULTIARCH" \
    >>"$LOG_DIR/push.log" 2>&1 || { echo "buildah manifest push $MULTIARCH failed" >&2; return 1; }
  buildah manifest rm "$list" >/dev/null
  echo "pushed $REGISTRY/$MULTIARCH (linux/amd64, linux/arm64 from $ARM64_TARBALL)"
}
if [[ -z "$DERIVE_FROM" ]]; then step multiarch make_multiarch_base; fi

# ---------------------------------------------------------------- smoke checks
smoke() {
  "$DOCKER" run --rm --network=host "$BASE_IMAGE" python3 -c 'import venv, ssl' \
    || { echo "cannot run a container from $BASE_IMAGE" >&2; return 1; }
  local ctx; ctx=$(mktemp -d)
  printf 'secret-ok\n' >"$ctx/secret"
  # No '# syntax=' line: the frontend built into dockerd must do cache and secret mounts.
  printf 'FROM %s\nRUN --mount=type=cache,target=/root/.cache/x --mount=type=secret,id=s grep -q secret-ok /run/secrets/s\n' \
    "$BASE_IMAGE" >"$ctx/Dockerfile"
  if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --network=host --secret "id=s,src=$ctx/secret" \
      -t envbuild-test/smoke:latest "$ctx" >"$LOG_DIR/smoke.log" 2>&1; then
    rm -rf "$ctx"; echo "BuildKit build with $DOCKER failed; see $LOG_DIR/smoke.log" >&2; return 1
  fi
  rm -rf "$ctx"
  "$DOCKER" rmi envbuild-test/smoke:latest >/dev/null
  echo "container run + BuildKit (cache+secret mounts) OK with DOCKER_BUILDKIT=1 $DOCKER"
}
if ((SMOKE)); then step smoke smoke; fi

# ---------------------------------------------------------------- for the tests
cat >"$STATE_DIR/env.sh" <<EOF
# Written by tests/infra/provision.sh; source it to reach the test infrastructure.
export ENVBUILD_TEST_REGISTRY=$REGISTRY
export ENVBUILD_TEST_DOCKER=$DOCKER
export ENVBUILD_TEST_BASE_IMAGE=$BASE_IMAGE
export DOCKER_BUILDKIT=1
EOF

echo
echo "provision: done in $(printf '%.1f' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3")s"
printf '  %s\n' "${SUMMARY[@]}"
echo "  registry http://$REGISTRY  client $DOCKER (DOCKER_BUILDKIT=1)  env: $STATE_DIR/env.sh"
