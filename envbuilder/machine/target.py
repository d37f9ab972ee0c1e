"""An environment as `envbuild diagnose` reads it, without running any of its code: the
distributions its dist-info METADATA declares (name, version, Requires-Dist), torch's CUDA build
from torch/version.py, every compiled extension's ELF (machine/elf.py), and, where envbuild
installed it, the profile in PREFIX/envbuild/envbuild.json.

A venv, a conda prefix or an image's unpacked files all read the same: a folder with
lib/pythonX.Y/site-packages. Every file is read bounded (limits.read_limited), no link is
followed out of the folder, and the walk of site-packages stops at a count no environment has.
"""

from __future__ import annotations

import email.parser
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from envbuilder.errors import UserError
from envbuilder.limits import NotRegularFile, TooLarge, read_limited
from envbuilder.machine.elf import Elf, read_elf
from envbuilder.record import Record
from envbuilder.text import canonical_name, printable

MAX_METADATA = 4 << 20  # torch's METADATA is ~40 KB
MAX_SMALL = 1 << 20  # version.py, envbuild.json's profile line
MAX_FILES = 500_000  # a venv with torch, vLLM and their CUDA wheels holds ~60,000
# the packages whose libraries are not extensions built against the torch beside them: torch's
# own and NVIDIA's CUDA wheels (their GPU code is judged by the torch build's arch list)
OWN_LIBRARIES = ("torch", "torch.libs", "nvidia", "triton")
# a C++ symbol of torch's own namespaces (c10::, at::, torch::, caffe2::), mangled: what an
# extension built against torch needs from libtorch/libc10 (the only symbols diagnose compares)
TORCH_SYMBOL = re.compile(rb"_Z(?:N[KVRO]*|T[IVS]N)(?:3c10|2at|5torch|6caffe2)")
_SITE = re.compile(r"python(3\.\d+)$")
_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)
_VERSION = re.compile(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)


class Dist(Record):
    """One installed distribution, as its dist-info says."""

    name: str  # canonical (PEP 503)
    version: str
    requires: tuple[str, ...]  # its Requires-Dist lines
    folder: str  # the dist-info folder's name


class Extension(Record):
    path: str  # relative to site-packages
    elf: Elf


class Target(Record):
    """What diagnose judges. python: X.Y from the site-packages folder's name."""

    where: str
    site: str
    python: str | None
    dists: Mapping[str, Dist]
    duplicates: tuple[tuple[str, tuple[str, ...]], ...]  # a name with 2+ dist-info folders
    torch_version: str | None
    torch_cuda: str | None  # "12.4"; None: a CPU build, or no torch
    extensions: tuple[Extension, ...]
    installed_json: str | None  # PREFIX/envbuild/envbuild.json: what envbuild installed there


def prefix_of(python: Path) -> Path:
    """The environment an interpreter path belongs to (PREFIX/bin/python -> PREFIX), without
    running it or following its link (a venv's bin/python links to the base interpreter)."""
    python = Path(os.path.abspath(python))
    if python.parent.name != "bin":
        raise UserError(
            f"--python {printable(str(python))} is not an environment's bin/python (diagnose reads "
            "PREFIX/lib/pythonX.Y/site-packages beside PREFIX/bin). Pass the environment's "
            "bin/python, or its folder with --prefix."
        )
    return python.parent.parent


def site_packages(prefix: Path) -> tuple[Path, str]:
    """PREFIX/lib/pythonX.Y/site-packages and X.Y; the newest Python where there are several."""
    if not prefix.is_dir():
        raise UserError(
            f"{printable(str(prefix))} is not a folder; pass the environment's folder (a venv or a "
            "conda prefix: the one that holds bin/ and lib/)."
        )
    found = []
    lib = prefix / "lib"
    if lib.is_dir() and not lib.is_symlink():
        for d in lib.iterdir():
            m = _SITE.match(d.name)
            if m and (d / "site-packages").is_dir():
                found.append((tuple(int(p) for p in m[1].split(".")), d / "site-packages", m[1]))
    if not found:
        raise UserError(
            f"{printable(str(prefix))} holds no lib/pythonX.Y/site-packages, so it is no Python "
            "environment diagnose can read (a venv or a conda prefix has one). Pass the "
            "environment's folder, or its bin/python with --python."
        )
    _, site, version = max(found)
    return site, version


def _read(path: Path, limit: int) -> bytes | None:
    try:
        return read_limited(path, limit, follow=False)
    except (OSError, NotRegularFile, TooLarge):
        return None


def read_dists(site: Path) -> tuple[dict[str, Dist], list[tuple[str, tuple[str, ...]]]]:
    """Each distribution's dist-info METADATA (an .egg-info's PKG-INFO where that is all there
    is), by canonical name; and the names installed twice (two dist-info folders)."""
    parser = email.parser.BytesHeaderParser()
    dists: dict[str, Dist] = {}
    twice: dict[str, list[str]] = {}
    for entry in sorted(os.scandir(site), key=lambda e: e.name):
        if entry.name.endswith(".dist-info"):
            meta = Path(entry.path) / "METADATA"
        elif entry.name.endswith(".egg-info"):
            meta = Path(entry.path) / "PKG-INFO" if entry.is_dir() else Path(entry.path)
        else:
            continue
        data = _read(meta, MAX_METADATA)
        if data is None:
            continue
        msg = parser.parsebytes(data)
        name, version = msg.get("Name"), msg.get("Version")
        if not name or not version:
            continue
        dist = Dist(
            canonical_name(str(name)),
            str(version).strip(),
            tuple(map(str, msg.get_all("Requires-Dist") or ())),
            entry.name,
        )
        if dist.name in dists:
            twice.setdefault(dist.name, [dists[dist.name].version]).append(dist.version)
        dists[dist.name] = dist
    return dists, [(n, tuple(vs)) for n, vs in sorted(twice.items())]


def torch_build(site: Path) -> tuple[str | None, str | None]:
    """torch's version and the CUDA it is built with, from torch/version.py read as text."""
    data = _read(site / "torch" / "version.py", MAX_SMALL)
    if data is None:
        return None, None
    text = data.decode("utf-8", "replace")
    cuda = _CUDA.search(text)
    version = _VERSION.search(text)
    return (version[1] if version else None), (cuda[1] or cuda[2] if cuda else None) or None


def shared_objects(site: Path, skip: tuple[str, ...] = OWN_LIBRARIES) -> Iterator[Path]:
    """Every `*.so` / `*.so.N` file under site-packages, but for the folders in `skip` (links
    are not followed; the walk stops at MAX_FILES entries)."""
    seen = 0
    stack = [site]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MAX_FILES:
                return
            if e.is_dir(follow_symlinks=False):
                if folder != site or e.name not in skip:
                    stack.append(Path(e.path))
            elif e.is_file(follow_symlinks=False) and (e.name.endswith(".so") or ".so." in e.name):
                yield Path(e.path)


def torch_exports(site: Path) -> frozenset[str]:
    """The symbols the torch beside the extensions exports (torch/lib/*.so)."""
    out: set[str] = set()
    lib = site / "torch" / "lib"
    if not lib.is_dir():
        return frozenset()
    for so in sorted(lib.glob("*.so*")):
        elf = read_elf(so, symbols=TORCH_SYMBOL, gpu=False)
        if elf is not None:
            out |= elf.defined
    return frozenset(out)


def read_target(prefix: Path) -> Target:
    """The environment at `prefix`, read (never run)."""
    site, python = site_packages(prefix)
    dists, twice = read_dists(site)
    version, cuda = torch_build(site)
    extensions = []
    for so in shared_objects(site):
        elf = read_elf(so, symbols=TORCH_SYMBOL)
        if elf is not None:
            extensions.append(Extension(str(so.relative_to(site)), elf))
    installed = _read(prefix / "envbuild" / "envbuild.json", 8 << 20)
    return Target(
        str(prefix),
        str(site),
        python,
        dists,
        tuple(twice),
        version,
        cuda,
        tuple(extensions),
        installed.decode("utf-8", "replace") if installed else None,
    )
