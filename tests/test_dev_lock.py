"""lockfiles/dev/requirements.txt, the test toolchain that tests/run.sh (and so CI) installs with
`pip install --require-hashes`: it pins every requirement of pyproject.toml that run.sh needs
(envbuild's own, its actions, lock and test extras, and the build backend of the editable
install), each pin inside pyproject's range on every Python envbuild supports, each with a
sha256. tests/infra/dev-lock.sh makes it; the weekly lockfiles job refreshes it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "lockfiles" / "dev" / "requirements.txt"
EXTRAS = ("actions", "lock", "test")
# the targets the lock is for: Linux x86_64 on each Python requires-python admits that CI or a
# contributor runs (3.10 up to the newest with wheels of everything)
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def target(python: str) -> dict[str, str]:
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def wanted(pyproject: dict) -> list[Requirement]:
    """What tests/run.sh installs: the dependencies, the three extras, the build backend."""
    opt = pyproject["project"]["optional-dependencies"]
    texts = [*pyproject["project"]["dependencies"], *(r for e in EXTRAS for r in opt[e])]
    return [Requirement(t) for t in [*texts, *pyproject["build-system"]["requires"]]]


def pins(text: str) -> list[tuple[Requirement, int]]:
    """Each `name==version [; marker]` of a hashed requirements file, with its count of hashes."""
    out = []
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)
    for entry in entries:
        if entry.startswith("#") or not entry.strip():
            continue
        head = entry.splitlines()[0].rstrip("\\ ")
        out.append((Requirement(head), len(re.findall(r"--hash=sha256:[0-9a-f]{64}\b", entry))))
    return out


def problems(pyproject: dict, lock_text: str) -> list[str]:
    """Every requirement with no pin on some target, or a pin outside its range; every pin with
    no hash or pinned by other than == (what --require-hashes refuses)."""
    found = pins(lock_text)
    out = [f"{r}: no sha256" for r, n in found if n == 0]
    out += [f"{r}: not pinned by ==" for r, _ in found if [s.operator for s in r.specifier] != ["=="]]
    for python in PYTHONS:
        env = target(python)
        here = {
            canonicalize_name(r.name): next(iter(r.specifier)).version
            for r, _ in found
            if r.marker is None or r.marker.evaluate(env)
        }
        for req in wanted(pyproject):
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            version = here.get(canonicalize_name(req.name))
            if version is None:
                out.append(f"Python {python}: {req} has no pin")
            elif not req.specifier.contains(version, prereleases=True):
                out.append(f"Python {python}: {req.name}=={version} is outside {req}")
    return out


def test_the_dev_lock_pins_every_requirement_run_sh_installs_inside_pyprojects_ranges():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    text = LOCK.read_text()
    assert problems(pyproject, text) == []
    names = {canonicalize_name(r.name) for r, _ in pins(text)}
    # (editables: what hatchling asks for to build the editable install without isolation)
    assert {"pytest", "pytest-xdist", "ruff", "mypy", "ray", "hatchling", "editables"} <= names


def test_a_requirement_the_lock_misses_or_a_pin_outside_its_range_is_named():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pyproject["project"]["optional-dependencies"]["test"] += ["ruff>=99", "left-out-tool>=1"]
    text = LOCK.read_text()
    ruff = re.search(r"^ruff==(\S+)", text, re.M)[1]
    assert f"Python 3.12: ruff=={ruff} is outside ruff>=99" in problems(pyproject, text)
    assert "Python 3.12: left-out-tool>=1 has no pin" in problems(pyproject, text)
    unhashed = re.sub(
        r"(?s)^(ray==\S+) \\\n(\s+--hash=sha256:[0-9a-f]{64} \\\n)*\s+--hash=\S+", r"\1", text, flags=re.M
    )
    assert any(p.startswith("ray==") and p.endswith("no sha256") for p in problems(pyproject, unhashed))


@pytest.mark.parametrize("python", PYTHONS)
def test_ray_is_pinned_for_every_python_it_runs_the_launch_tests_on(python):
    """tests/test_launch.py forms a real Ray cluster with the test interpreter's ray."""
    env = target(python)
    ray = [
        r
        for r, _ in pins(LOCK.read_text())
        if r.name == "ray" and (r.marker is None or r.marker.evaluate(env))
    ]
    assert len(ray) == 1


def test_run_sh_installs_the_lock_with_its_hashes_and_envbuild_without_more():
    run = (ROOT / "tests" / "run.sh").read_text()
    assert "pip install -q --require-hashes -r lockfiles/dev/requirements.txt" in run
    assert "pip install -q --no-deps --no-build-isolation -e ." in run
    assert "-e '.[" not in run  # nothing resolved afresh beside the lock
    header = LOCK.read_text().splitlines()[:2]
    assert header[1].strip() == "#    bash tests/infra/dev-lock.sh"  # the command that remakes it
