#!/usr/bin/env bash
# The whole test suite, set-up included, on a fresh machine: a venv with envbuild and the test
# tools, then (as root) Docker, a loopback registry and a debootstrapped base image for the
# build tests, then pytest. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# the test toolchain as lockfiles/dev/requirements.txt pins it, every file checked by its sha256
# (tests/infra/dev-lock.sh makes it; the weekly lockfiles job refreshes it), then envbuild itself,
# built by the locked hatchling
python3 -m venv .venv
.venv/bin/python -m pip install -q --require-hashes -r lockfiles/dev/requirements.txt
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .

# Docker engine, loopback registry and base images for the build tests (root only; under
# CI=true a machine that can't provision fails here rather than skipping those tests).
if [ "$(id -u)" = 0 ]; then
  # (and the bases with the shipped profiles' own Python, 3.10 and 3.12, for tests/test_real_build.py)
  bash tests/infra/provision.sh --images-file tests/infra/images.txt --python-images-file tests/infra/python-images.txt
  # the builder stages' base: the same image plus the compilers (one debootstrap, not two)
  ENVBUILD_TEST_BASE_IMAGE=envbuild-test/devel:bookworm \
  ENVBUILD_TEST_DERIVE_FROM=envbuild-test/base:bookworm ENVBUILD_TEST_APT="python3-dev build-essential" \
    bash tests/infra/provision.sh --no-smoke --images-file tests/infra/devel-images.txt
  # Debian's Chromium, in which tests/test_grid.py opens `envbuild grid --html` (headless)
  if ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 chromium >/dev/null ||
      { apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null &&
        apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 chromium >/dev/null; }
  fi
elif [ "${CI:-}" = true ]; then
  echo "tests/run.sh: the Docker/registry tests need root to provision (CI=true)" >&2
  exit 1
else
  echo "tests/run.sh: not root, so the Docker/registry tests will be skipped" >&2
fi

# the code's lint (pyflakes and pycodestyle's errors) and format (pyproject.toml [tool.ruff])
.venv/bin/ruff check envbuilder tests bench
.venv/bin/ruff format --check envbuilder tests bench
# the type check: strict on every package of envbuilder and its top-level modules (pyproject.toml [tool.mypy]),
# and the share of Any among their expressions held under 2 % (strict mypy lets Any data through)
.venv/bin/mypy --any-exprs-report .work/mypy-any
.venv/bin/python bench/any_share.py .work/mypy-any/any-exprs.txt --max 2 --top 5

# ENVBUILD_HEAVY=1 adds the heavy tier (real multi-GB images and installs; see the README).
tier="not heavy"
[ "${ENVBUILD_HEAVY:-}" = 1 ] && tier="heavy or not heavy"
# In parallel (pytest-xdist): each test file runs whole on one worker, so its module fixtures
# are made once and its tests keep their order. The suite mostly waits (Docker builds, pip, uv,
# Ray, loopback servers), so one worker more than the cores keeps the CPUs busy: on the 2-core
# CI machine 3 workers took the run from 16.5 to 8 minutes. ENVBUILD_TEST_WORKERS=0 runs it
# serially, in one process (for debugging).
workers=${ENVBUILD_TEST_WORKERS:-$(($(nproc) + 1))}
set +e
.venv/bin/python -m pytest -q -rs --durations=25 -n "$workers" --dist loadfile -m "($tier) and not exclusive" "$@"
rc=$?
# Then the `exclusive` tests, one at a time with the machine to themselves: the launch tests that
# form a real two-node Ray cluster, whose raylet gives its agents 15 s to start (under 3 busy
# workers on 2 cores they missed it, and hung or failed at random; issue 35).
.venv/bin/python -m pytest -q -rs --durations=10 -n 0 -m "($tier) and exclusive" "$@"
rc2=$?
set -e
# (5: a phase collected nothing, which is fine for one of the two when tests are named)
if [ "$rc" = 5 ] && [ "$rc2" = 5 ]; then echo "tests/run.sh: pytest collected no tests" >&2; exit 1; fi
[ "$rc" = 5 ] && rc=0
[ "$rc2" = 5 ] && rc2=0
[ "$rc" != 0 ] && exit "$rc"
exit "$rc2"
