#!/usr/bin/env bash
# The whole test suite, set-up included, on a fresh machine: a venv with envbuild and the test
# tools, then (as root) Docker, a loopback registry and a debootstrapped base image for the
# build tests, then pytest. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[actions,lock,test]'

if [ -x tests/infra/provision.sh ]; then
  if [ "$(id -u)" = 0 ]; then
    tests/infra/provision.sh
  elif [ "${CI:-}" = true ]; then
    echo "tests/run.sh: the Docker/registry tests need root to provision (CI=true)" >&2
    exit 1
  fi
fi

set +e
.venv/bin/python -m pytest -q -rs "$@"
rc=$?
set -e
[ "$rc" = 5 ] && { echo "tests/run.sh: pytest collected no tests" >&2; exit 1; }
exit "$rc"
