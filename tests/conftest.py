"""Shared helpers for the renderer tests: the shipped matrix, a profile resolved with overrides,
matrix overlays written the way a user writes them, and the `envbuild` command (in-process and
as the installed console script). No network, no Docker."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

# Before anything loads the matrix (PROFILES below, at import): every cache the code under test
# keeps (the validated matrix, compiled templates) goes to a folder of this run, never into the
# developer's ~/.cache.
_CACHE_HOME = Path(__import__("tempfile").mkdtemp(prefix="envbuild-test-cache-"))
os.environ["XDG_CACHE_HOME"] = str(_CACHE_HOME)

from envbuilder.model import matrix as M  # noqa: E402
from envbuilder.model.resolve import Overrides, ResolveError, ResolvedEnv, resolve  # noqa: E402
from envbuilder.render.context import BuildContext  # noqa: E402

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"
FIXTURES = TESTS / "fixtures"


def bench_module(name: str):
    """bench/NAME.py as a module (the bench scripts are files, not a package), loaded afresh."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, TESTS.parent / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def shipped() -> M.Matrix:
    """The matrix from matrices/*.yaml, loaded once (tests must not mutate it)."""
    return M.load()


PROFILES = list(shipped().profiles)


def overrides(**kw) -> Overrides:
    """Overrides(...) that also takes lists for with_/without, as the CLI splits them."""
    for key in ("with_", "without"):
        if key in kw:
            kw[key] = tuple(kw[key])
    return Overrides(**kw)


def resolved(profile: str, matrix: M.Matrix | None = None, **kw) -> ResolvedEnv:
    return resolve(matrix or shipped(), profile, overrides(**kw))


def pinned(env: ResolvedEnv) -> BuildContext:
    """`env` prepared (context.prepare): its context, with the lock's pins beside it in its
    `constraints` (the environment carries none)."""
    from envbuilder.context.prepare import prepare

    return prepare(env)


def saved_text(ctx: BuildContext) -> str:
    """envbuild.json's text as a render of `ctx` writes it (what `render --from` reads back):
    the environment, with the context's pins beside it under `constraints`."""
    return ctx.env.to_json(ctx.env.saved_dict(ctx.constraints))


def violations(profile: str, matrix: M.Matrix | None = None, **kw) -> dict:
    """The rules `profile` with these overrides breaks, by rule name."""
    with pytest.raises(ResolveError) as e:
        resolved(profile, matrix, **kw)
    return {v.rule: v for v in e.value.violations}


def record(section: str, key: str, matrix: M.Matrix | None = None, **changes) -> dict:
    """A deep copy of a shipped record (or `matrix`'s) with some fields changed: a starting
    point for overlays."""
    rec = copy.deepcopy((matrix or shipped()).sections[section][key])
    rec.update(changes)
    return rec


# The resolver's logic tests run on this frozen copy of the matrix (tests/fixtures/matrix, see its
# README), so that a matrix update (a new torch, vLLM or verl release) changes only the tests of
# the shipped facts and the goldens, never a test of a rule.
FROZEN = FIXTURES / "matrix"


@functools.lru_cache(maxsize=None)
def frozen() -> M.Matrix:
    return M.load(base=FROZEN)


def frozen_with(*overlays) -> M.Matrix:
    """The frozen matrix with --matrix-dir overlay folders on top."""
    return M.load(tuple(overlays), base=FROZEN)


@pytest.fixture
def frozen_matrix(monkeypatch):
    """Commands run in-process read the frozen fixture matrix instead of the shipped one: the CLI
    tests of a rule's logic (refresh's comparisons, say) then survive a matrix update."""
    from envbuilder.model import matrix as matrix_module
    from envbuilder import paths

    real = paths.data_dir
    monkeypatch.setattr(matrix_module, "data_dir", lambda name: FROZEN if name == "matrices" else real(name))
    return FROZEN


@pytest.fixture
def overlay(tmp_path):
    """Write a --matrix-dir folder: overlay({...}) dumps one YAML file, overlay(text=...) writes
    raw text (for malformed YAML). Returns the folder; .file is the last file written."""
    folder = tmp_path / "overlay"
    folder.mkdir()

    def write(doc: dict | None = None, *, text: str | None = None, name: str = "lab.yaml") -> Path:
        path = folder / name
        path.write_text(text if text is not None else yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        write.file = path
        return folder

    return write


def place_script(files: dict, name: str, folder: Path, as_name: str | None = None) -> Path:
    """The rendered image script `name` (of render_files' `files`) written into `folder` with the
    sidecar it reads beside it, as every rendered folder and image holds them; its path."""
    from envbuilder.images import SIDECAR

    folder.mkdir(parents=True, exist_ok=True)
    (folder / SIDECAR).write_text(files[SIDECAR])
    path = folder / (as_name or name)
    path.write_text(files[name])
    return path


def script_data(files: dict, name: str) -> dict:
    """What the rendered script `name` (preflight.py, ...) reads: its part of the sidecar."""
    import json

    from envbuilder.images import SCRIPTS, SIDECAR

    return json.loads(files[SIDECAR])[SCRIPTS[name]]


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its bytes and mode, to show that nothing changed."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# -- the command line --------------------------------------------------------------------------


def envbuild_exe() -> str:
    """The installed console script of the interpreter running the tests."""
    beside = Path(sys.executable).parent / "envbuild"
    found = str(beside) if beside.exists() else shutil.which("envbuild")
    if not found:
        pytest.fail("the `envbuild` console script is not installed; run `pip install -e .`")
    return found


def clean_env(**extra) -> dict:
    """The environment minus any ENVBUILD_* setting of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def cache_home():
    yield _CACHE_HOME
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)


@pytest.fixture
def run_envbuild(cache_home, tmp_path):
    """Run the real `envbuild` script in a fresh process: run_envbuild('check', 'p40')."""

    def run(*args, cwd=None, env=None):
        # ENVBUILD_DEBUG=1: a bug shows as its traceback (not the user's one-paragraph message),
        # and a traceback fails the test whatever exit code it expected
        r = subprocess.run(
            [envbuild_exe(), *map(str, args)],
            cwd=cwd or tmp_path,
            env=clean_env(XDG_CACHE_HOME=str(cache_home), ENVBUILD_DEBUG="1", **(env or {})),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback (most recent call last)" not in r.stderr, r.stderr
        return r

    return run


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """Run envbuilder.cli.main in-process: returns (exit code, stdout, stderr)."""
    from envbuilder.cli import main

    for k in list(os.environ):
        if k.startswith("ENVBUILD_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # a stray default `out/` would land here, not in the checkout
    monkeypatch.setenv("ENVBUILD_DEBUG", "1")  # a bug raises into the test instead of exit 1

    def run(*args):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        out, err = capsys.readouterr()
        return e.value.code, out, err

    return run


@pytest.fixture(scope="session", autouse=True)
def _caches_out_of_home(cache_home):
    """Every test runs with XDG_CACHE_HOME in this run's folder (set at import); a test that
    changes it gets it back after (monkeypatch), and the folder goes at the end."""
    assert os.environ["XDG_CACHE_HOME"] == str(_CACHE_HOME)
    yield


def pytest_unconfigure(config):
    """The cache folder goes at the end in every process: a parallel run's controller imports
    this file (and makes one) but runs no test, so no fixture removes it there."""
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)


# -- the CI-only tiers ---------------------------------------------------------------------------
# A test that needs something this machine may lack (Docker, root, PyPI, a tool) skips saying what;
# under CI=true, where tests/run.sh provisions all of it, the same lack fails the test instead.


def unavailable(why: str) -> NoReturn:
    """Skip with the reason, or fail with it under CI=true (where the tier must run). Usable at a
    test module's top level too."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, where this test must run, and {why}")
    pytest.skip(why, allow_module_level=True)


def need(ok: object, why: str) -> None:
    """unavailable(why) unless `ok`."""
    if not ok:
        unavailable(why)


PYPI = "https://pypi.org/simple"


@pytest.fixture(scope="session")
def real_pypi():
    """The real-package tier's index. Unreachable: a skip with the reason, except under CI=true,
    where this tier must run (CI reaches PyPI)."""
    from envbuilder.lock.pip import index_answers

    if index_answers(PYPI, timeout=10):
        return PYPI
    unavailable(f"{PYPI} does not answer: the real-index tests need it")


def pip_run(*args: str) -> None:
    """`python -m pip ARGS` without the host's pip config (no find-links, extra indexes or
    constraints of its own); a failure fails the test with pip's last words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    r = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stderr[-2000:]}"


@pytest.fixture(scope="session")
def verl_wheels(real_pypi, tmp_path_factory) -> dict:
    """The real wheel of every verl release in the matrix, from PyPI (`pip download --no-deps`,
    about 1 MB each, once per session): {version: path}."""
    dest = tmp_path_factory.mktemp("verl-wheels")
    wheels = {}
    for version in shipped().verl:
        pip_run(
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--index-url",
            real_pypi,
            "-d",
            str(dest),
            f"verl=={version}",
        )
        found = sorted(dest.glob(f"verl-{version}-*.whl"))
        assert found, f"no verl {version} wheel in {dest}"
        wheels[version] = found[0]
    return wheels


@pytest.fixture(scope="session")
def verl_trees(verl_wheels, tmp_path_factory) -> dict:
    """Each real verl wheel unpacked, as pip installs it into site-packages: {version: folder
    holding verl/}. Read-only by convention: copy it (shutil.copytree) before patching."""
    import zipfile

    trees = {}
    for version, wheel in verl_wheels.items():
        root = tmp_path_factory.mktemp(f"verl-{version}")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        trees[version] = root
    return trees


# -- test tiers --------------------------------------------------------------------------------
# Every test carries one or more tier markers (pyproject.toml names them; docs/CONTRIBUTING.md
# says what each needs): `pytest -m unit` runs what needs neither Docker, nor PyPI, nor a GPU.
# A test that reaches PyPI through the real_pypi fixture (or what depends on it) is `pypi`.
TIERS = ("docker", "pypi", "gpu", "heavy")
_PYPI_FIXTURES = {"real_pypi", "verl_wheels", "verl_trees"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _PYPI_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pypi)
        if not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.unit)


# -- parallel runs (pytest-xdist: tests/run.sh) ----------------------------------------------------
# Each worker collects the whole suite and deselects (`-m 'not heavy'`) on its own, and the
# controller, which collects nothing, would not say "N deselected": the heavy tier would vanish
# from the summary. The workers send the ids they deselected; the controller counts each once.
_DESELECTED: set[str] = set()


class _Deselected:
    """What the controller counts in place of a worker's deselected item (only its id)."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid


def pytest_deselected(items):
    config = items[0].config if items and isinstance(items[0], pytest.Item) else None
    if config is not None and hasattr(config, "workeroutput"):  # (a worker of a parallel run)
        config.workeroutput.setdefault("envbuild_deselected", []).extend(i.nodeid for i in items)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    new = sorted(set(getattr(node, "workeroutput", {}).get("envbuild_deselected", ())) - _DESELECTED)
    if new:
        _DESELECTED.update(new)
        node.config.hook.pytest_deselected(items=[_Deselected(i) for i in new])


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """The longest files first (tests/schedule.py), under tests/run.sh's --dist loadfile."""
    if config.getvalue("dist") != "loadfile":
        return None
    from schedule import long_first_scheduler

    return long_first_scheduler(config, log)
