"""Finding a CPython of a given version on this machine (never downloading one): what `verify`
makes its throwaway venv with and what the wheelhouse builds an sdist with. One search order:
pythonX.Y on PATH, pyenv's versions (newest patch first; their shims answer only when that
version is selected), python3 on PATH, envbuild's own interpreter, then what `uv python find`
knows (its managed interpreters, virtual environments)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from envbuilder.errors import UserError
from envbuilder.record import Record


class Interpreter(Record):
    path: str
    version: str  # the full version, 3.10.13


# what of the caller's environment a child interpreter must not see: pip's settings and anything
# that puts other code on its path (uv_env drops uv's index settings too)
PYTHON_SETTINGS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")
HOST_SETTINGS = ("PIP_", *PYTHON_SETTINGS, "VIRTUAL_ENV", "CONDA_PREFIX")


def clean_env() -> dict[str, str]:
    """The caller's environment without HOST_SETTINGS (nor uv's index settings)."""
    from envbuilder.tools.uv import uv_env

    return {k: v for k, v in uv_env().items() if not k.startswith(HOST_SETTINGS)}


def own_code_env() -> dict[str, str]:
    """The caller's environment with nothing that puts other code on a child Python's path (a
    verl checkout on PYTHONPATH would be what is patched and imported) and no user site; pip's
    and the rest of the settings stay (a compile of apex may need the user's index)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PYTHON_SETTINGS)}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def isolated_env(**extra: str) -> dict[str, str]:
    """clean_env, with pip reading no configuration file and asking nothing, and no user site:
    what a child that installs into or runs an environment sees (only the indexes named on its
    command line; only the environment's own code, never a checkout on the caller's PYTHONPATH)."""
    env = clean_env()
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PYTHONNOUSERSITE="1",
    )
    env.update(extra)
    return env


def probe(path: str, version: str, need_venv: bool = False) -> Interpreter | None:
    """`path` as an Interpreter when it is a CPython of `version` (X.Y) that runs (with venv
    and ensurepip, `need_venv`); None otherwise."""
    code = (
        "import sys, platform"
        + (", venv, ensurepip" if need_venv else "")
        + "; print(sys.implementation.name, platform.python_version())"
    )
    try:
        out = subprocess.run([path, "-c", code], capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if (
        out.returncode == 0
        and len(parts) == 2
        and parts[0] == "cpython"
        and parts[1].rsplit(".", 1)[0] == version
    ):
        return Interpreter(path, parts[1])
    return None


def _patch(path: str, version: str) -> int:
    m = re.search(rf"/{re.escape(version)}\.(\d+)(?:/|$)", path)
    return int(m[1]) if m else -1


def find_python(version: str, need_venv: bool = False) -> Interpreter | None:
    """A CPython `version` (X.Y) on this machine, in the module's search order; None when
    there is none (uv never downloads one here)."""
    cands = [shutil.which(f"python{version}")]
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if root.is_dir():
        pyenv = [
            str(d / "bin" / f"python{version}")
            for d in root.iterdir()
            if re.fullmatch(rf"{re.escape(version)}\.\d+", d.name)
        ]
        pyenv.sort(key=lambda p: _patch(p, version), reverse=True)
        cands += pyenv
    cands += [shutil.which("python3"), getattr(sys, "_base_executable", None) or sys.executable]
    for c in dict.fromkeys(c for c in cands if c):
        found = probe(c, version, need_venv)
        if found:
            return found
    try:
        from envbuilder.tools.uv import uv_bin

        out = subprocess.run(
            [uv_bin(), "python", "find", "--no-config", "--no-python-downloads", version],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
    except (UserError, OSError, subprocess.TimeoutExpired):
        return None
    exe = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    return probe(exe, version, need_venv) if exe else None
