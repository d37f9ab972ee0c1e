"""`envbuild install`: the profile's environment without Docker, finished as the image's build
finishes it (patched for the GPU, audited, smoke-tested).

Two routes, the same steps in the same order as `build`:
  --from-wheelhouse WH   offline: WH/install.sh (the lock's Python checked first; pip
                         --no-index --require-hashes from WH; the conda part with micromamba/
                         mamba/conda where one is on PATH; then apply_patches.py and
                         audit_precision.py); resumable: it installs into an existing
                         environment at the prefix.
  (online)               the install layers in the Dockerfile's order with the lock's
                         constraints, pip check after each, the patches and the audit, through
                         the same code as `envbuild verify` (uv), into a new prefix.
Then the rendered folder is written to PREFIX/envbuild/ (run script, preflight.py, the patch and
audit scripts, envbuild.json) and `preflight.py --smoke` runs with the prefix's Python: the torch
build, every module of the training path, verl patched and audited.

apex and flash-attn (where the profile has them) are compiled into the environment when the
nvcc on PATH is torch's CUDA, as the image's builder stage compiles them; else each is named in
the report's `not_installed` with what is missing and the command that builds it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuilder.errors import ActionError, UserError
from envbuilder.limits import read_text_bounded
from envbuilder.text import redact
from envbuilder.model.resolved import ResolvedEnv

SMOKE_TIMEOUT_S = 1800
# PREFIX/.envbuild-install: the profile an online install is making there; a run that finds it
# (an earlier one stopped) goes on in that environment instead of refusing the prefix
MARKER = ".envbuild-install"
HOME = "envbuild"  # PREFIX/envbuild/: the rendered folder


@dataclass  # not a record: the install fills it in as it goes
class InstallReport:
    profile: str
    prefix: str
    route: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    not_installed: list[dict[str, Any]] = field(default_factory=list)
    smoke: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _python_version(python: Path) -> str | None:
    try:
        p = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def check_prefix(prefix: Path, python: str, resumable: bool) -> None:
    """Refuse, before touching anything, a prefix that is not a new or empty directory, or (where
    the route installs into an existing environment) an environment of another Python."""
    if prefix.is_symlink() or (prefix.exists() and not prefix.is_dir()):
        raise UserError(f"--prefix {prefix} exists and is not a directory; pass a new path.")
    if not prefix.is_dir() or not any(p.name != MARKER for p in prefix.iterdir()):
        return
    env_python = prefix / "bin" / "python"
    if not env_python.exists():
        raise UserError(
            f"--prefix {prefix} is not empty and holds no Python environment (no bin/python); "
            "pass a new or empty directory, or an environment made for this profile."
        )
    if not resumable:
        raise UserError(
            f"--prefix {prefix} holds an environment envbuild install did not start; the online "
            "install makes its own. Pass a new path (or install from a wheelhouse, which "
            "installs into it)."
        )
    got = _python_version(env_python)
    if got != python:
        raise UserError(
            f"--prefix {prefix} is a Python {got or '(not runnable)'} environment, and the "
            f"profile's lock is for Python {python}: its wheels would not install there. Pass "
            "a new path, or an environment of that Python."
        )


def _wheelhouse_profile(wh: Path, profile: str) -> dict[str, Any]:
    from envbuilder.lock import lockfile as L

    if not (wh / "install.sh").is_file() or not (wh / "manifest.json").is_file():
        raise UserError(
            f"--from-wheelhouse {wh} is not an envbuild wheelhouse (no install.sh and "
            f"manifest.json); make one with `envbuild wheelhouse {profile} -o DIR`."
        )
    doc = L.read_wheelhouse_manifest(wh) or {}  # (None: gone since the check above)
    entry = (doc.get("profiles") or {}).get(profile)
    if not isinstance(entry, dict):
        have = ", ".join(sorted(doc.get("profiles") or {})) or "none"
        raise UserError(
            f"--from-wheelhouse {wh} holds no complete {profile} (it has: {have}); export it "
            f"with `envbuild wheelhouse {profile} -o {wh}`."
        )
    return entry


def _run(
    report: InstallReport, name: str, cmd: list[str], env: dict[str, str], say: Callable[[str], None]
) -> bool:
    """One step, its output passed on line by line; recorded with its time."""
    say(f"{name}: {' '.join(cmd)}")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    except OSError as e:
        report.steps.append({"step": name, "ok": False, "seconds": 0.0, "error": str(e)})
        return False
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            say(f"  {line.rstrip()}")
            tail = (tail + [line.rstrip()])[-20:]
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    entry = {"step": name, "ok": rc == 0, "seconds": round(time.monotonic() - start, 1)}
    if rc:
        entry["error"] = next((t for t in reversed(tail) if t.strip()), f"exit {rc}")
    report.steps.append(entry)
    return rc == 0


def nvcc_version() -> str | None:
    """The CUDA version of the nvcc on PATH (`release 12.1`), None where there is none."""
    import re

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def extension_commands(env: ResolvedEnv, python: Path) -> list[tuple[str, list[str]]]:
    """(component, the command that compiles it into the environment of `python`) for apex and
    flash-attn, as the image's builder stage does (for this GPU's arch only)."""
    from envbuilder.model.components import apex
    from envbuilder.model.components.flash_attn import source_build_env

    out: list[tuple[str, list[str]]] = []
    if env.apex:
        pip = [str(python), "-m", "pip", "install", "-v"]
        out.append(("apex", apex.build_argv(env.apex, pip, f"apex @ {env.apex.url}")))
    if env.flash_attn:
        out.append(
            (
                "flash-attn",
                [
                    "env",
                    *source_build_env(env),
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--no-build-isolation",
                    f"flash-attn=={env.flash_attn.version}",
                ],
            )
        )
    return out


def build_extensions(
    env: ResolvedEnv, prefix: Path, report: InstallReport, say: Callable[[str], None]
) -> bool:
    """apex and flash-attn compiled into the environment where the nvcc on PATH is torch's CUDA
    (apex's setup.py requires it equal); else each is named with what is missing, and the
    install goes on without it (the run's training path does not import them unless the
    profile uses them: preflight's smoke test then says so)."""
    commands = extension_commands(env, prefix / "bin" / "python")
    if not commands:
        return True
    got = nvcc_version()
    if got != env.cuda.version:
        for component, cmd in commands:
            report.not_installed.append(
                {
                    "component": component,
                    "version": (env.apex if component == "apex" else env.flash_attn).version,  # type: ignore[union-attr]
                    "why": f"needs nvcc {env.cuda.version} on PATH (torch's CUDA) to compile; "
                    + (f"nvcc here is {got}" if got else "there is no nvcc here")
                    + f". With it: {shlex.join(cmd)}",
                }
            )
        return True
    ok = True
    for component, cmd in commands:
        say(f"{component}: compiling for sm_{env.gpu.sm} with nvcc {got} (flash-attn's sdist takes hours)")
        ok = _run(report, f"build {component}", cmd, dict(os.environ), say) and ok
    return ok


def install(
    env: ResolvedEnv,
    prefix: Path,
    *,
    wheelhouse: Path | None = None,
    python: str | None = None,
    index_url: str | None = None,
    torch_index_url: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> InstallReport:
    """Install `env` into `prefix` by one of the two routes, then write the rendered folder to
    PREFIX/envbuild/ and run its preflight smoke test with the prefix's Python."""
    from envbuilder.render.files import render_files, write_dir
    from envbuilder.lock.constraints import with_constraints

    prefix = prefix.absolute()
    start = time.monotonic()
    route = "wheelhouse" if wheelhouse else "online"
    report = InstallReport(env.profile, str(prefix), route)
    if wheelhouse:
        entry = _wheelhouse_profile(wheelhouse, env.profile)
        want = str(entry.get("python") or env.python)
        check_prefix(prefix, want, resumable=True)
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        run_env["PIP_CONFIG_FILE"] = os.devnull
        if python:
            run_env["PYTHON"] = python
        ok = _run(
            report,
            "install.sh",
            ["bash", str(wheelhouse / "install.sh"), env.profile, "--prefix", str(prefix)],
            run_env,
            say,
        )
    else:
        from envbuilder.machine.verify import Options, find_python, verify

        marker = prefix / MARKER
        if marker.is_symlink() or (os.path.lexists(marker) and not marker.is_file()):
            raise UserError(
                f"{marker} is not a regular file (a link, pipe or folder); envbuild install writes "
                "that file itself. Pass a new --prefix."
            )
        # (read as every input is: no follow, never blocking on a pipe, bounded)
        resuming = (
            marker.is_file() and read_text_bounded(marker, "The install marker", 4096).strip() == env.profile
        )
        check_prefix(prefix, env.python, resumable=resuming)
        if python:  # (the one Python discovery's check: CPython of that version, with venv)
            from envbuilder.tools.python import probe

            interp = probe(python, env.python, need_venv=True)
            if interp is None:
                got = _python_version(Path(python))
                raise UserError(
                    f"--interpreter {python} is not a CPython {env.python} with venv (it is Python "
                    f"{got or '(not runnable)'}); {env.profile} needs Python {env.python}."
                )
        else:
            interp = find_python(env.python)
        if interp is None:
            raise UserError(
                f"No Python {env.python} here for {env.profile}'s pins. Install it (e.g. "
                f"apt-get install python{env.python} python{env.python}-venv, or uv python install "
                f"{env.python}) or pass --interpreter PATH."
            )
        # the probe `build` makes before its first step: the index every step installs from
        # answers, or nothing is made (the PyTorch index is verify's: PyPI's builds where it is down)
        from envbuilder.machine.verify import PROBE_TIMEOUT_S, index_answers

        pypi = index_url or env.indexes.pypi
        say(f"probe {redact(pypi)} ({PROBE_TIMEOUT_S:.0f} s at most)")
        if not index_answers(pypi):
            raise ActionError(
                f"The package index {redact(pypi)} does not answer from here, so nothing was "
                "installed. Use a mirror (--mirror NAME, `envbuild mirrors list`), --index-url "
                f"URL, or a wheelhouse made where it answers (--from-wheelhouse)."
            )
        prefix.mkdir(parents=True, exist_ok=True)
        tmp = prefix / f".{MARKER}.{os.getpid()}"  # (a new file renamed over it: no link followed)
        tmp.write_text(env.profile + "\n", encoding="utf-8")
        os.replace(tmp, marker)  # (an interrupted run goes on from here)
        r = verify(
            env,
            interp,
            Options(
                resume=True,
                index_url=index_url,
                torch_index_url=torch_index_url,
                keep=prefix,
                skip_compose=True,
                imports=False,  # (preflight --smoke imports the training path below)
                say=say,
            ),
        )
        for layer in r.layers:
            report.steps.append(
                {
                    "step": f"layer {layer['layer']}",
                    "ok": layer["ok"],
                    "seconds": layer["seconds"],
                    **({"error": layer["error"]} if layer.get("error") else {}),
                }
            )
        for name, part in (("patches", r.patches), ("audit", r.audit)):
            if part is not None:
                report.steps.append({"step": name, "ok": bool(part.get("ok"))})
        ok = not r.failures and build_extensions(env, prefix, report, say)
        if r.failures:
            report.steps.append({"step": "install", "ok": False, "error": "; ".join(r.failures[:3])})
    if not ok:
        report.seconds = round(time.monotonic() - start, 1)
        return report
    # the rendered folder beside the environment, and the smoke test of the image's build
    home = prefix / HOME
    write_dir(home, render_files(with_constraints(env)), force=True)
    say(f"rendered {env.profile} into {home}")
    smoke_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [str(prefix / "bin" / "python"), str(home / "preflight.py"), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        env=smoke_env,
        cwd=home,
    )
    try:
        report.smoke = json.loads(proc.stdout)["checks"]
    except (ValueError, KeyError):
        report.smoke = [{"check": "preflight", "ok": False, "detail": proc.stderr.strip()[-500:], "fix": ""}]
    report.steps.append({"step": "preflight --smoke", "ok": proc.returncode == 0})
    report.ok = all(s.get("ok") for s in report.steps)
    report.seconds = round(time.monotonic() - start, 1)
    return report


def summary(report: InstallReport) -> str:
    """The report as lines: each step with its time, the smoke test's failures with their fixes."""
    out = [f"envbuild install {report.profile} into {report.prefix} ({report.route})"]
    for s in report.steps:
        mark = "\u2713" if s.get("ok") else "\u2717"
        secs = f" ({s['seconds']:.0f} s)" if isinstance(s.get("seconds"), (int, float)) else ""
        out.append(f"{mark} {s['step']}{secs}" + (f": {s['error']}" if s.get("error") else ""))
    for c in report.smoke:
        if not c.get("ok"):
            out.append(
                f"  \u2717 {c['check']}: {c['detail']}" + (f"\n      fix: {c['fix']}" if c.get("fix") else "")
            )
    for n in report.not_installed:
        out.append(f"  not installed: {n['component']} {n['version']}: {n['why']}")
    out.append(
        ("READY" if report.ok else "NOT READY")
        + f": {report.profile} in {report.prefix} ({report.seconds:.0f} s); train with "
        + f"{report.prefix}/{HOME}/run_ppo_gsm8k.sh after `. {report.prefix}/bin/activate`"
    )
    return "\n".join(out)
