"""The conda part of a lock, solved for the TARGET machine (its CUDA driver, its glibc), and
conda-lock.yml written with conda-lock's own models and writer.

The default solver is py-rattler (no conda executable needed); `--solver conda-lock` runs
conda-lock itself where a conda, mamba or micromamba is on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from envbuilder.errors import ActionError, UserError
from envbuilder.lock.documents import Pylock
from envbuilder.render.plan import conda_specs
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.record import Record

PLATFORM = "linux-64"  # an x86_64 host's conda subdir; platform(env) gives each host's
# The target kernel is not known when locking; conda-lock's default. Packages rarely ask.
LINUX = "5.10"
CONDA_EXES = ("micromamba", "mamba", "conda")


class CondaRecord(Record):
    """One solved conda package: what conda-lock.yml records and rattler needs to install it."""

    name: str
    version: str
    build: str
    url: str
    md5: str
    sha256: str
    depends: tuple[str, ...]


def _order(r: CondaRecord) -> tuple[str, str, str, str, str, str, tuple[str, ...]]:
    """conda-lock.yml's order of packages: by name, then version, build, url, ..."""
    return (r.name, r.version, r.build, r.url, r.md5, r.sha256, r.depends)


def default_channels(env: ResolvedEnv) -> list[str]:
    label = [f"nvidia/label/cuda-{env.cuda.full_version}"] if env.needs_builder else []
    return label + list(env.conda_channels)


def platform(env: ResolvedEnv) -> str:
    """The conda subdir of the profile's host: linux-64, or linux-aarch64 for a Grace system."""
    from envbuilder.render.pixi import PLATFORMS

    return PLATFORMS[env.gpu.machine]


def virtual_packages(env: ResolvedEnv, glibc: str) -> dict[str, str]:
    """The target's virtual packages, name -> "version" or "version build" (__archspec: the
    generic one of the host's machine, which every CPU of it runs)."""
    return {
        "__archspec": f"1 {env.gpu.machine}",
        "__cuda": env.cuda.version,
        "__glibc": glibc,
        "__linux": LINUX,
        "__unix": "0",
    }


def _hint(message: str, vpkgs: dict[str, str], subdir: str = PLATFORM) -> str:
    need: list[str] = re.findall(r"__cuda\s*>=\s*([\d.]+)", message)
    if need:
        return (
            f"A package needs a CUDA driver for __cuda >= {max(need, key=_vkey)}, but the "
            f"profile's target is __cuda={vpkgs['__cuda']}: pick a conda_nvcc (matrices, "
            "cuda.yaml) of the profile's CUDA, or another --cuda."
        )
    need = re.findall(r"__glibc\s*>=\s*([\d.]+)", message)
    if need:
        return (
            f"A package needs __glibc >= {max(need, key=_vkey)}, but the base image has "
            f"glibc {vpkgs['__glibc']}."
        )
    return f"A spec names a version the channels do not have for {subdir}."


def _vkey(v: str) -> tuple[int, ...]:
    numbers: list[str] = re.findall(r"\d+", v)
    return tuple(int(x) for x in numbers)


def solve_rattler(env: ResolvedEnv, channels: list[str], vpkgs: dict[str, str]) -> list[CondaRecord]:
    from envbuilder.lock.rattler_worker import call

    wanted = conda_specs(env)
    try:
        result = call(
            {
                "channels": channels,
                "specs": wanted,
                "platforms": [platform(env), "noarch"],
                "virtual_packages": vpkgs,
            }
        )
    except RuntimeError as e:
        raise ActionError(f"Solving the conda part of {env.name} failed: {e}") from None
    if "unsat" in result:
        text = result["unsat"].strip()
        target = ", ".join(f"{k}={v}" for k, v in sorted(vpkgs.items()) if k in ("__cuda", "__glibc"))
        raise UserError(
            f"The conda part of {env.name} ({', '.join(wanted)}) cannot be solved for "
            f"its target ({target}):\n{text}\n{_hint(text, vpkgs, platform(env))}"
        )
    if "fetch" in result:
        raise ActionError(
            f"Cannot fetch the conda channels ({', '.join(_urls(channels))}): "
            f"{result['fetch'].strip()}\nCheck the URLs, or pass --channel a mirror "
            "that answers."
        )
    if "invalid" in result:
        raise UserError(f"A conda channel or spec of {env.name} is malformed: {result['invalid']}")
    out = []
    solved = result.get("ok")
    for r in solved if isinstance(solved, list) else []:
        if not r["md5"]:
            raise ActionError(f"{r['url']} has no md5 in its channel's repodata; conda-lock.yml needs one.")
        out.append(
            CondaRecord(
                r["name"], r["version"], r["build"], r["url"], r["md5"], r["sha256"], tuple(r["depends"])
            )
        )
    return sorted(out, key=_order)


def _urls(channels: list[str]) -> list[str]:
    try:
        from rattler import Channel

        return [Channel(c).base_url for c in channels]
    except Exception:  # a malformed name is reported by the solve itself
        return list(channels)


def conda_exe() -> str | None:
    for name in CONDA_EXES:
        found = shutil.which(name)
        if found:
            return found
    return None


def solve_conda_lock(env: ResolvedEnv, channels: list[str], vpkgs: dict[str, str]) -> list[CondaRecord]:
    """conda-lock itself for the conda part (it needs a conda executable to solve)."""
    import yaml

    exe, subdir = conda_exe(), platform(env)
    if exe is None:
        raise UserError(
            "--solver conda-lock runs conda-lock, which needs conda, mamba or "
            "micromamba on PATH to solve; none is. Install one, or use --solver rattler "
            "(the default: py-rattler solves without any conda)."
        )
    from conda_lock.lockfile import parse_conda_lock_file

    with tempfile.TemporaryDirectory(prefix="envbuild-conda-lock-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "environment.yml").write_text(
            yaml.safe_dump(
                {"name": f"envbuild-{env.name}", "channels": channels, "dependencies": conda_specs(env)}
            )
        )
        (tmp / "virtual-packages.yml").write_text(yaml.safe_dump({"subdirs": {subdir: {"packages": vpkgs}}}))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "conda_lock",
                "lock",
                "--conda",
                exe,
                "-p",
                subdir,
                "-f",
                "environment.yml",
                "--virtual-package-spec",
                "virtual-packages.yml",
                "--lockfile",
                "conda-lock.yml",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()[-3000:]
            cls = (
                ActionError if re.search(r"(?i)connect|http error|timed out|resolve host", msg) else UserError
            )
            raise cls(f"conda-lock could not lock the conda part of {env.name}:\n{msg}")
        lock = parse_conda_lock_file(tmp / "conda-lock.yml")
    return sorted(
        (
            CondaRecord(
                p.name,
                p.version,
                p.build or "",
                p.url,
                p.hash.md5 or "",
                p.hash.sha256 or "",
                tuple(f"{k} {v}".strip() if v != "*" else k for k, v in p.dependencies.items()),
            )
            for p in lock.package
            if p.manager == "conda"
        ),
        key=_order,
    )


def _dependencies(depends: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for spec in depends:
        name, _, version = spec.strip().partition(" ")
        out[name] = version.strip() or "*"
    return out


def write_conda_lock(
    path: Path,
    conda: list[CondaRecord],
    pylock: Pylock | None,
    pip_parents: dict[str, frozenset[str]],
    *,
    channels: list[str],
    input_sha256: str,
    profile: str,
    vpkgs: dict[str, str],
    subdir: str = PLATFORM,
) -> str:
    """conda-lock.yml through conda-lock's writer; returns its text."""
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v1.models import HashModel, LockMeta
    from conda_lock.lockfile.v2prelim.models import LockedDependency, Lockfile

    from envbuilder.lock.pip import pip_artifact
    from envbuilder.render.plan import normalize

    packages = [
        LockedDependency(
            name=r.name,
            version=r.version,
            manager="conda",
            platform=subdir,
            dependencies=_dependencies(r.depends),
            url=r.url,
            hash=HashModel(md5=r.md5, sha256=r.sha256 or None),
            build=r.build,
            categories={"main"},
        )
        for r in conda
    ]
    for p in pylock.packages if pylock else ():
        name = normalize(p.name)
        url, sha256 = pip_artifact(p)
        deps = {child: "*" for child, parents in pip_parents.items() if name in parents}
        packages.append(
            LockedDependency(
                name=name,
                version=p.version,
                manager="pip",
                platform=subdir,
                dependencies=dict(sorted(deps.items())),
                url=url,
                hash=HashModel(sha256=sha256),
                categories={"main"},
            )
        )
    meta = LockMeta(
        content_hash={subdir: input_sha256},
        channels=list(channels),
        platforms=[subdir],
        sources=["environment.yml"],
        custom_metadata={
            "envbuild_profile": profile,
            "virtual_packages": ", ".join(f"{k}={v}" for k, v in sorted(vpkgs.items())),
        },
    )
    write_conda_lock_file(
        Lockfile(package=packages, metadata=meta), path, metadata_choices=None, include_help_text=False
    )
    return path.read_text(encoding="utf-8")
