"""preflight tells a patched verl from an unpatched one, without importing verl (pypi tier: the
real 0.4.1 and 0.9.1 wheels): each recorded replacement in place and the precision audit clean.
An environment installed without Docker that skipped apply_patches.py fails preflight, naming the
one command that finishes it (the 4090 wheelhouse once passed `preflight.py --smoke` on an
unpatched verl 0.4.1 whose dp_actor.py imports flash_attn)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import resolved
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext


def _run(folder, site, *args):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HOME": str(folder)}
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def _checks(folder, site):
    p = _run(folder, site, "preflight.py", "--smoke", "--json")
    assert p.returncode == 1, p.stderr  # (no torch here: not ready either way)
    return {c["check"]: c for c in json.loads(p.stdout)["checks"]}, p


@pytest.mark.parametrize("profile", ["4090", "p40", "h200"])
def test_preflight_reports_the_patches_missing_then_applied_on_the_real_wheel(verl_trees, tmp_path, profile):
    env = resolved(profile)
    folder, site = tmp_path / "rendered", tmp_path / "site"
    folder.mkdir()
    for name, text in render_files(BuildContext.of(env)).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    shutil.copytree(verl_trees[env.verl.version], site)

    before, _ = _checks(folder, site)
    patched, audit = before["verl patched"], before["precision audit"]
    assert patched["ok"] is False and all(p.name in patched["detail"] for p in env.patches)
    assert "python apply_patches.py && python audit_precision.py" in patched["fix"]
    assert audit["ok"] is False and "FAILED" in audit["detail"]

    done = _run(folder, site, "apply_patches.py", "--site", str(site))
    assert done.returncode == 0, done.stderr
    after, _ = _checks(folder, site)
    assert after["verl patched"]["ok"] is True, after["verl patched"]
    assert after["precision audit"]["ok"] is True and "ok:" in after["precision audit"]["detail"]
