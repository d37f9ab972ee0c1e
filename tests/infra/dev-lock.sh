#!/usr/bin/env bash
# lockfiles/dev/requirements.txt: the test toolchain, pinned with every file's sha256, that
# tests/run.sh (and so CI) installs with `pip install --require-hashes`: envbuild's own
# dependencies and its actions, lock and test extras (pytest, ruff, mypy, ray, ...) and the
# build backend of `pip install --no-build-isolation -e .` (pyproject's build-system.requires,
# and editables, which hatchling asks for to build an editable install).
# One universal resolution (--universal) for every Python envbuild supports (requires-python),
# so the same file installs on CI's Python and on a contributor's.
#
#   bash tests/infra/dev-lock.sh             re-resolve, keeping every pin that still fits
#   bash tests/infra/dev-lock.sh --upgrade   the newest of everything (the weekly lockfiles job)
#
# Needs uv (the lock extra) and PyPI, or UV_DEFAULT_INDEX pointing at a mirror of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
uv=${UV:-$(command -v uv || echo .venv/bin/uv)}
python3 - <<'PY' |
import re
text = open("pyproject.toml", encoding="utf-8").read()
block = re.search(r"^\[build-system\]\nrequires = \[(.*?)\]", text, re.M | re.S)
for item in re.findall(r'"([^"]+)"', block.group(1)):
    print(item)
# what hatchling's get_requires_for_build_editable adds for `pip install -e .`
print("editables")
PY
  "$uv" pip compile pyproject.toml - --extra actions --extra lock --extra test \
    --universal --python-version 3.10 --generate-hashes --no-python-downloads \
    --custom-compile-command "bash tests/infra/dev-lock.sh" -o lockfiles/dev/requirements.txt "$@"
