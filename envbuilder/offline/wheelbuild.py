"""Build an sdist that a lock pins into a wheel for the lock's target, at export time.

The far side of an air gap installs with `pip --no-index`: it may have no compiler, and pip's
build isolation finds no build backend (setuptools) in an offline index, so nothing may be left
to build there. `envbuild wheelhouse` therefore turns every sdist of a lock into a wheel while it
is still online: `uv build --wheel` from the verified sdist, with the build backend fetched from
the index the lock was made from, by an interpreter of the target's Python version.

A wheel is accepted only when it fits the target (lock.json `target`): a pure `py3-none-any`
wheel fits everywhere; a platform wheel needs the target's Python version, its machine, and a C
library no newer than the target's (it was linked here).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

from envbuilder.secret import SecretUrl
from envbuilder.errors import ActionError, UserError
from envbuilder.record import Record

BUILD_TIMEOUT = 3600  # seconds: a pure sdist takes seconds; a compiled one may take long
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, zip's epoch: the same sdist gives the same wheel
# PEP 517's default for an sdist without [build-system] (what pip and uv use)
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
LEGACY_REQUIRES = ["setuptools>=40.8.0"]
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)"
    r"-(?P<plat>[^-]+)\.whl$"
)
_MANYLINUX_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class BuiltWheel(Record):
    filename: str
    sha256: str
    size: int
    build: dict[str, object]  # provenance: backend, its requirements, generator, interpreter, tool, index


def dist_name(name: str) -> str:
    """A project name as wheel file names spell it (PEP 491: runs of -_. become _)."""
    from envbuilder.render.plan import normalize

    return normalize(name).replace("-", "_")


# ---- does a wheel fit the target --------------------------------------------------------------


def wheel_tags(filename: str) -> tuple[set[str], set[str], set[str]]:
    """(python tags, ABI tags, platform tags) of a wheel file name (compressed tag sets split)."""
    m = _WHEEL.match(filename)
    if not m:
        raise UserError(f"{filename} is not a wheel file name (name-version-python-abi-platform.whl).")
    return set(m["py"].split(".")), set(m["abi"].split(".")), set(m["plat"].split("."))


def is_pure(filename: str) -> bool:
    _, abis, plats = wheel_tags(filename)
    return abis == {"none"} and plats == {"any"}


def _target(target: Mapping[str, object]) -> tuple[int, int, str, tuple[int, int]]:
    """(major, minor, machine, glibc) of lock.json's target, e.g. 3.10 on x86_64-manylinux_2_35."""
    m = re.fullmatch(r"(\d+)\.(\d+)", str(target.get("python", "")))
    p = re.fullmatch(r"([a-z0-9_]+)-manylinux_(\d+)_(\d+)", str(target.get("python_platform", "")))
    if not m or not p:
        raise UserError(
            f"The lock's target {target!r} names no Python X.Y and "
            "MACHINE-manylinux_A_B platform (lock.json `target`); re-lock with "
            "`envbuild lock`."
        )
    return int(m[1]), int(m[2]), p[1], (int(p[2]), int(p[3]))


def misfit(filename: str, target: Mapping[str, object]) -> str | None:
    """Why the wheel `filename` cannot install on the lock's target, or None when it can."""
    major, minor, machine, glibc = _target(target)
    pys, abis, plats = wheel_tags(filename)
    ok_py = {f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"}
    ok_abi = {"none", "abi3", f"cp{major}{minor}"}
    stable = any(re.fullmatch(rf"cp{major}(\d+)", t) and int(t[3:]) <= minor for t in pys)
    if not (pys & ok_py or ("abi3" in abis and stable)) or not abis & ok_abi:
        return (
            f"its tags {'.'.join(sorted(pys))}-{'.'.join(sorted(abis))} are not for CPython {major}.{minor}"
        )
    for plat in plats:
        if plat in ("any", f"linux_{machine}"):
            return None
        legacy = re.fullmatch(rf"(manylinux\d+)_{machine}", plat)
        m = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{machine}", plat)
        needs = _MANYLINUX_LEGACY.get(legacy[1]) if legacy else (int(m[1]), int(m[2])) if m else None
        if needs and needs <= glibc:
            return None
    return f"its platform {'.'.join(sorted(plats))} is not {machine} Linux with glibc {glibc[0]}.{glibc[1]}"


def unfit(filename: str, build: Mapping[str, object], target: Mapping[str, object]) -> str | None:
    """Why a wheel built here (`build`: its provenance, with the interpreter's full version, the
    machine and the glibc it was built on) cannot serve `target`, or None when it can."""
    why = misfit(filename, target)
    if why or is_pure(filename):
        return why
    major, minor, machine, glibc = _target(target)
    if str(build.get("python", "")).rsplit(".", 1)[0] != f"{major}.{minor}":
        return f"it is a platform wheel, and it was not built by a Python {major}.{minor}"
    if build.get("machine") != machine:
        return f"it was built on {build.get('machine')}, not {machine}"
    built_on = re.fullmatch(r"(\d+)\.(\d+)", str(build.get("glibc")))
    if not built_on:
        return "it was built on a machine whose C library is not glibc"
    if (int(built_on[1]), int(built_on[2])) > glibc:
        return f"it was linked against glibc {build['glibc']}, newer than the target's {glibc[0]}.{glibc[1]}"
    return None


def host_glibc() -> tuple[int, int] | None:
    try:
        found = re.search(r"(\d+)\.(\d+)", os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (ValueError, OSError, AttributeError):
        return None
    return (int(found[1]), int(found[2])) if found else None


# ---- an interpreter of the target's Python version -------------------------------------------


def find_python(version: str) -> tuple[str, str] | None:
    """(path, full version) of a CPython `version` (X.Y) on this machine (tools/python.py's
    search order; never downloads)."""
    from envbuilder.tools.python import find_python as find

    found = find(version)
    return (found.path, found.version) if found else None


# ---- building -------------------------------------------------------------------------------


def build_system(sdist: Path) -> tuple[str, list[str]]:
    """(build backend, its requirements) from the sdist's pyproject.toml, or PEP 517's default."""
    from envbuilder.lock.pip import load_toml

    try:
        with tarfile.open(sdist) as tar:
            for member in tar:
                parts = member.name.split("/")
                if (
                    len(parts) == 2
                    and parts[1] == "pyproject.toml"
                    and member.isfile()
                    and member.size <= 1 << 20
                ):
                    f = tar.extractfile(member)  # (a regular file, checked above: never None)
                    if f is None:
                        break
                    doc = load_toml(f.read().decode("utf-8"))
                    found = doc.get("build-system")
                    bs: Mapping[str, object] = found if isinstance(found, dict) else {}
                    requires = bs.get("requires")
                    if not isinstance(requires, list):  # (none: PEP 517's default)
                        break
                    return str(bs.get("build-backend") or LEGACY_BACKEND), [str(r) for r in requires]
    except (tarfile.TarError, OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(
            f"{sdist.name} is not a readable source archive ({e}); the lock pins "
            "something that is not an sdist. Re-lock, or report the package."
        ) from None
    return LEGACY_BACKEND, list(LEGACY_REQUIRES)


def _generator(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.count("/") == 1 and name.endswith(".dist-info/WHEEL"):
                for line in z.read(name).decode("utf-8", "replace").splitlines():
                    if line.startswith("Generator:"):
                        return line.split(":", 1)[1].strip()
    return "unknown"


def build_wheel(
    sdist: Path,
    sha256: str,
    name: str,
    version: str,
    target: Mapping[str, object],
    index: str,
    dest: Path,
    *,
    reserved: frozenset[str] = frozenset(),
    say: Callable[[str], None] = lambda m: None,
) -> BuiltWheel:
    """Build `sdist` (whose bytes must hash to `sha256`) into a wheel in `dest` that fits
    `target`; its build backend comes from `index`. UserError (exit 2) when this machine cannot
    make a wheel that fits the target; ActionError (exit 1) when the build itself fails. Nothing
    is left in `dest` but the wheel, and only when it fits."""
    from envbuilder.offline.fetch import PARTIAL_DIR, sha256_file

    major, minor = _target(target)[:2]
    want = f"{major}.{minor}"
    found = find_python(want)
    python = found or (sys.executable, platform.python_version())
    what = f"{name} {version} (from {sdist.name})"
    say(
        f"building a wheel of {what} with Python {python[1]} from {index}"
        + ("" if found else f"; no Python {want} here, so only a pure wheel will do")
    )
    # (absolute: uv build runs in the scratch folder and reads the sdist's path from there)
    scratch = dest.absolute() / PARTIAL_DIR  # where fetch keeps its partial downloads; skipped by --tar
    scratch.mkdir(parents=True, exist_ok=True)
    for stale in scratch.glob("build-*"):  # a killed export's build folder (ours, by its name;
        if stale.is_dir() and not stale.is_symlink():  # one export at a time holds the lock)
            shutil.rmtree(stale, ignore_errors=True)
    try:
        with tempfile.TemporaryDirectory(dir=scratch, prefix="build-") as tmp:
            wheel, build = _uv_build(sdist, sha256, Path(tmp), python, index, what)
            tags = _WHEEL.match(wheel.name)
            if not tags or dist_name(tags["name"]) != dist_name(name) or tags["version"] != version:
                raise ActionError(
                    f"{sdist.name} built {wheel.name}, not a wheel of {name} "
                    f"{version}: the sdist does not hold what the lock says. "
                    "Re-lock."
                )
            why = unfit(wheel.name, build, target)
            if why:
                raise UserError(
                    f"{what} builds into {wheel.name}, which does not fit the lock's target "
                    f"(Python {want}, {target.get('python_platform')}): {why}. Export on a machine "
                    f"that has Python {want} (on PATH as python{want}, in pyenv, or `uv python "
                    f"install {want}`) and a glibc no newer than the target's (e.g. inside the "
                    "profile's base image)."
                )
            if wheel.name in reserved:
                raise UserError(
                    f"{wheel.name}, built from {sdist.name}, has the name of a file a "
                    "lock in this export pins; export these profiles into separate "
                    "wheelhouses."
                )
            built = BuiltWheel(wheel.name, sha256_file(wheel), wheel.stat().st_size, build)
            os.replace(wheel, dest / wheel.name)
    finally:
        try:
            scratch.rmdir()
        except OSError:
            pass  # partial downloads to resume are still there
    return built


def _uv_build(
    sdist: Path, sha256: str, tmp: Path, python: tuple[str, str], index: str | SecretUrl, what: str
) -> tuple[Path, dict[str, object]]:
    """(the wheel `uv build` made in `tmp` from a verified copy of `sdist`, its provenance)."""
    from envbuilder.offline.fetch import sha256_file
    from envbuilder.tools.uv import index_env, uv_bin, uv_env, uv_version

    src = tmp / sdist.name
    shutil.copyfile(sdist, src)  # build from bytes that were hashed, not from a path
    got = sha256_file(src)
    if got != sha256:
        raise ActionError(
            f"{sdist} changed on disk (sha256 {got}, the lock pins {sha256}); "
            "nothing was built from it. Run the export again."
        )
    backend, requires = build_system(src)
    env = {
        **uv_env(),
        **index_env(SecretUrl(index)),
    }  # (the build index in uv's environment: no password in argv)
    env.setdefault("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
    exe, full = python
    cmd = [
        uv_bin(),
        "build",
        "--no-config",
        "--wheel",
        "--python",
        exe,
        "--no-python-downloads",
        "--out-dir",
        str(tmp / "out"),
        str(src),
    ]
    from envbuilder.tools.run import TooMuchMemory, run

    try:  # (bounded: uv reads the build index's pages whole; one that never ends filled memory)
        proc = run(cmd, cwd=tmp, env=env, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ActionError(
            f"Building a wheel of {what} took longer than {BUILD_TIMEOUT} s; nothing "
            "was built. Build on a faster machine, or report the package."
        ) from None
    except TooMuchMemory as e:
        raise ActionError(
            f"Building a wheel of {what} was stopped: uv {e} reading "
            f"{SecretUrl(index)}. An index that sends a page without end does that; "
            "pass --build-index-url another."
        ) from None
    if proc.returncode != 0:
        log = (proc.stderr + proc.stdout).strip()[-2500:]
        raise ActionError(
            f"Could not build a wheel of {what} with Python {full} ({exe}), build backend "
            f"{backend} ({', '.join(requires) or 'no requirements'}) from {index}:\n{log}\n"
            "The far side installs with no index and builds nothing, so the wheelhouse needs this "
            "wheel. If the index could not be reached or lacks the backend, pass "
            "--build-index-url an index that serves it; if a compiler or headers are missing, "
            "install them here; then export again (what is already there is kept)."
        )
    wheels = sorted((tmp / "out").glob("*.whl"))
    if len(wheels) != 1:
        raise ActionError(
            f"uv build made {len(wheels)} wheels from {sdist.name}, not one; nothing "
            "was kept. Report the package."
        )
    g = host_glibc()
    return wheels[0], {
        "backend": backend,
        "requires": requires,
        "generator": _generator(wheels[0]),
        "python": full,
        "machine": platform.machine(),
        "glibc": f"{g[0]}.{g[1]}" if g else None,
        "tool": f"uv {uv_version()}",
        "index": index,
    }
