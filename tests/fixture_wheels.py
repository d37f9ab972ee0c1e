"""Tiny real wheels that stand in for torch, verl and the rest on a loopback index.

Each is a valid wheel (METADATA, WHEEL, RECORD with sha256) that pip installs like any other;
its top-level module records its name and version so a smoke test can import it.
"""

from __future__ import annotations

import base64
import hashlib
import random
import re
import zipfile
from pathlib import Path


ZIP_DATE = (2024, 1, 1, 0, 0, 0)  # fixed, so every fixture wheel is byte-reproducible


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def make_wheel(
    dest: Path,
    name: str,
    version: str,
    *,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    extras: dict[str, tuple[str, ...]] | None = None,
    files: dict[str, str | bytes] | None = None,
    payload: int = 0,
    salt: str = "",
) -> Path:
    """A minimal valid wheel written by hand: a package whose __init__ records the version,
    extra `files`, then METADATA, WHEEL and RECORD, the .dist-info last as real wheels have it
    (a reader without Range requests must read through the package to reach METADATA).
    `payload` adds that many incompressible bytes (stored, seeded: the same bytes every time),
    so a stand-in weighs what the real wheel does."""
    dest.mkdir(parents=True, exist_ok=True)
    dist = dist_name(name)
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r} ; extra == "{extra}"' for r in reqs]
    contents = {
        f"{dist}/__init__.py": f'__version__ = "{version}"  # envbuild test stand-in {salt}\n'.encode()
    }
    for path, data in (files or {}).items():
        contents[path] = data.encode() if isinstance(data, str) else data
    if payload:
        rng = random.Random(f"{name}{version}{salt}")  # in chunks: randbytes caps near 256 MiB
        contents[f"{dist}/_payload.bin"] = b"".join(
            rng.randbytes(min(1 << 24, payload - i)) for i in range(0, payload, 1 << 24)
        )
    contents |= {
        f"{info}/METADATA": ("\n".join(meta) + "\n").encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: envbuild-tests\nRoot-Is-Purelib: "
            f"{'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n"
        ).encode(),
    }
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in contents.items())
    contents[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = dest / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in contents.items():
            zi = zipfile.ZipInfo(p, ZIP_DATE)
            zi.compress_type = zipfile.ZIP_STORED if p.endswith(".bin") else zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    return path


_IN_TREE_BACKEND = """\
import base64, hashlib, os, zipfile

{hook}

def _hash(d):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "{dist}-{version}.dist-info"
    init = open(os.path.join("{module}", "__init__.py"), "rb").read() + _built()
    files = {{"{module}/__init__.py": init}}
    files[info + "/METADATA"] = b"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
    files[info + "/WHEEL"] = b"Wheel-Version: 1.0\\nGenerator: standin\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    rec = "".join(p + "," + _hash(d) + "," + str(len(d)) + "\\n" for p, d in files.items())
    files[info + "/RECORD"] = (rec + info + "/RECORD,,\\n").encode()
    name = "{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for p, d in files.items():
            z.writestr(zipfile.ZipInfo(p, (2024, 1, 1, 0, 0, 0)), d)
    return name
"""
# what the in-tree backend's build adds to the module's __init__.py: nothing, unless make_sdist's
# build_hook defines its own _built() (a stand-in whose build checks what it is built with)
_NO_HOOK = 'def _built():\n    return b""\n'


def make_sdist(
    dest: Path,
    name: str,
    version: str,
    *,
    module: str | None = None,
    platform: bool = False,
    requires: tuple[str, ...] = (),
    in_tree_backend: bool = False,
    build_hook: str | None = None,
) -> Path:
    """A real, minimal setuptools sdist laid out like antlr4-python3-runtime 4.9.3's: setup.py
    and PKG-INFO, no pyproject.toml (so a PEP 517 frontend builds it with setuptools'
    legacy backend, `setuptools>=40.8.0`). Its module records its name and version. With
    `platform`, setup.py declares extension modules without compiling any, so the wheel gets
    CPython and platform tags (cp310-cp310-linux_x86_64) and needs no compiler. `module` is the
    import name (default: the name with _). With `in_tree_backend`, a pyproject.toml names a
    backend inside the sdist that needs nothing (`requires = []`): it builds a pure wheel with no
    index at all. `build_hook`: code defining `_built()`, run by that backend's build, whose
    bytes it appends to the module's __init__.py (implies the in-tree backend). Byte-reproducible."""
    import gzip
    import io
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    module = module or dist_name(name)
    root = f"{name}-{version}"
    distclass = (
        (
            "from setuptools.dist import Distribution\n\n\n"
            "class BinaryDistribution(Distribution):\n"
            "    def has_ext_modules(self):\n        return True\n\n\n"
        )
        if platform
        else ""
    )
    setup_py = (
        f"from setuptools import setup\n{distclass}"
        f"setup(name={name!r}, version={version!r}, packages=[{module!r}], "
        f"install_requires={list(requires)!r}"
        + (", distclass=BinaryDistribution" if platform else "")
        + ")\n"
    )
    pkg_info = (
        "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Requires-Dist: {r}" for r in requires]
        )
        + "\n"
    )
    contents = {
        f"{root}/PKG-INFO": pkg_info,
        f"{root}/setup.py": setup_py,
        f"{root}/{module}/__init__.py": f'__version__ = "{version}"  # envbuild test stand-in\n',
    }
    if in_tree_backend or build_hook is not None:
        contents[f"{root}/pyproject.toml"] = (
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        )
        contents[f"{root}/backend.py"] = _IN_TREE_BACKEND.format(
            name=name, version=version, module=module, dist=dist_name(name), hook=build_hook or _NO_HOOK
        )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, text in sorted(contents.items()):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644  # 2024-01-01
            tar.addfile(info, io.BytesIO(data))
    path = dest / f"{root}.tar.gz"
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return path


def requirement_pins(lines: list[str]) -> list[tuple[str, str]]:
    """(name, version) of every `name==version` (extras dropped) in a requirements text."""
    out = []
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)", line)
        if m:
            out.append((m.group(1), m.group(3)))
    return out


def verl_files(fixture_root: Path) -> dict[str, bytes]:
    """The recorded real verl sources (for the source patches) under fixture_root/verl/."""
    return {
        str(p.relative_to(fixture_root)): p.read_bytes()
        for p in sorted((fixture_root / "verl").rglob("*.py"))
        if p.name != "__init__.py"
    }


def importable_source(real: bytes) -> bytes:
    """A recorded real verl file as a stand-in module: its text held in a string, so the image's
    source patches apply to the real lines while the module imports without verl's dependencies
    (torch.distributed, transformers, ...), which the stand-ins do not have."""
    text = real.decode("utf-8")
    if "'''" in text or text.endswith("\\"):
        raise ValueError("a recorded verl file cannot sit in r'''...'''; quote it otherwise")
    return (
        "# envbuild test stand-in: the real file's text, patchable but not executed\n"
        "SOURCE = r'''" + text + "'''\n"
    ).encode()


def module_files(
    modules: list[str], body=lambda module: f"# envbuild test stand-in for {module}\n"
) -> dict[str, str]:
    """Files that make each dotted module importable: NAME.py, or NAME/__init__.py where another
    module sits under it, and an __init__.py for every package on the way. body(module) is
    each module's text (packages on the way only get `body(package)` when listed)."""
    packages = {".".join(m.split(".")[:i]) for m in modules for i in range(1, m.count(".") + 1)}
    files = {}
    for name in sorted(packages | set(modules)):
        path = name.replace(".", "/") + ("/__init__.py" if name in packages else ".py")
        files[path] = body(name) if name in modules else ""
    return files


def training_path_files(d: dict, dist: str) -> dict[str, str]:
    """Stand-ins for the modules of d's training path inside the package `dist`; its own
    __init__.py is left to make_wheel, which writes __version__ there."""
    modules = [m for m in d["training_path"] if m.split(".")[0] == dist]
    return {p: text for p, text in module_files(modules).items() if p != f"{dist}/__init__.py"}


def wheels_for_env(
    out_dir: Path, d: dict, verl_fixture: Path | None = None, weights_mb: dict[str, int] | None = None
) -> list[Path]:
    """Stand-in wheels for every package a resolved environment installs; `weights_mb` gives
    some of them a realistic size (e.g. {"torch": 512}). torch says which CUDA it is built for
    (torch.version.cuda, as preflight reads it); verl holds a module for every verl module of
    the training path, the recorded real sources among them (see importable_source)."""
    pins = [p for p in d["torch"]["packages"]]
    if d.get("vllm"):
        pins.append(f"vllm=={d['vllm']['version']}")
    pins += [f"{n}=={v}" for n, v in d["verl"]["pins"].items()]
    made = []
    for name, version in requirement_pins(pins):
        files = training_path_files(d, dist_name(name))  # vllm._C for one
        if name == "torch":
            files["torch/version.py"] = f"__version__ = {version!r}\ncuda = {d['torch']['cuda']!r}\n"
            # what flash-attn's setup.py (and envbuild's builder) read for the wheel's C++ ABI
            files["torch/_C/__init__.py"] = "_GLIBCXX_USE_CXX11_ABI = False\n"
        made.append(
            make_wheel(out_dir, name, version, files=files, payload=(weights_mb or {}).get(name, 0) << 20)
        )
    files = training_path_files(d, "verl")
    if verl_fixture:
        files.update({path: importable_source(data) for path, data in verl_files(verl_fixture).items()})
    made.append(make_wheel(out_dir, "verl", d["verl"]["version"], files=files))
    return made


def apex_archive(standin: Path, url: str) -> tuple[str, bytes]:
    """(path on the server, .tar.gz bytes) of the apex stand-in, laid out as GitHub serves
    `url` (https://github.com/NVIDIA/apex/archive/refs/tags/REF.tar.gz)."""
    import io
    import tarfile

    path = url.split("://", 1)[1].split("/", 1)[1]
    ref = path.rsplit("/", 1)[-1].removesuffix(".tar.gz")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(standin, arcname=f"apex-{ref}")
    return path, buf.getvalue()


def flash_attn_release_wheel(dest: Path, release_filename: str, version: str, salt: str = "") -> Path:
    """A stand-in of a flash-attn release wheel, saved under the release's file name
    (flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp311-cp311-linux_x86_64.whl). Its METADATA
    says the bare version, as the release's renamed wheels do; it holds the modules of the
    training path (flash_attn_2_cuda, flash_attn.bert_padding) as plain Python. `salt` changes
    its bytes (and sha256), e.g. so a locked build step is never a BuildKit cache hit."""
    tag = "-".join(release_filename[: -len(".whl")].split("-")[-3:])
    files = {
        "flash_attn_2_cuda.py": "# envbuild test stand-in for flash_attn_2_cuda\n",
        "flash_attn/bert_padding.py": "# envbuild test stand-in for flash_attn.bert_padding\n",
    }
    built = make_wheel(dest / ".build", "flash_attn", version, tag=tag, files=files, salt=salt)
    out = dest / release_filename
    out.write_bytes(built.read_bytes())
    built.unlink()
    return out


def torch_standin(dest: Path, version: str, cuda: str, cxx11_abi: bool) -> Path:
    """An importable stand-in torch package (on PYTHONPATH=dest) with what flash-attn's wheel
    name is read from: __version__, version.cuda, _C._GLIBCXX_USE_CXX11_ABI."""
    (dest / "torch" / "_C").mkdir(parents=True, exist_ok=True)
    (dest / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (dest / "torch" / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\n")
    (dest / "torch" / "_C" / "__init__.py").write_text(f"_GLIBCXX_USE_CXX11_ABI = {cxx11_abi!r}\n")
    return dest


def flash_attn_sdist(standin: Path, dest: Path, version: str) -> Path:
    """flash_attn-VERSION.tar.gz from tests/fixtures/flash-attn-standin (its in-tree backend
    builds in a second, compiling nothing), with a PKG-INFO naming the version."""
    import gzip
    import io
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    root = f"flash_attn-{version}"
    contents = {f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n".encode()}
    for p in sorted(standin.iterdir()):
        if p.is_file() and p.suffix in (".py", ".toml"):
            contents[f"{root}/{p.name}"] = p.read_bytes()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(contents.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
            tar.addfile(info, io.BytesIO(data))
    out = dest / f"{root}.tar.gz"
    out.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return out


def real_uv_wheel(dest: Path) -> Path:
    """The real uv wheel the matrix pins (defaults.uv: the runtime stage installs it first, by its
    sha256, then installs with it), copied into `dest`. Downloaded from PyPI with pip once and
    kept in the user's cache (envbuild-test/), checked against the pinned sha256 each time: a
    stand-in cannot take its place, since the Dockerfile runs `uv pip install`."""
    import os
    import shutil
    import subprocess
    import sys

    from envbuilder.model import matrix
    from envbuilder.model.resolve import uv_pin

    pin = uv_pin(matrix.load().defaults or {})
    name = pin.filename
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-test"
    cached = cache / name
    if not (cached.is_file() and hashlib.sha256(cached.read_bytes()).hexdigest() == pin.sha256):
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"uv=={pin.version}",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux2014_x86_64",
                "--python-version",
                "3.11",
                "--index-url",
                "https://pypi.org/simple",
                "--no-cache-dir",
                "-q",
                "-d",
                str(cache),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0 or not cached.is_file():
            raise RuntimeError(
                f"cannot download {name} from PyPI (the build tests need the real "
                f"uv wheel): {proc.stderr[-2000:]}"
            )
        if hashlib.sha256(cached.read_bytes()).hexdigest() != pin.sha256:
            cached.unlink()
            raise RuntimeError(f"{name} from PyPI does not hash to the matrix's pin {pin.sha256}")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, dest / name)
    return dest / name
