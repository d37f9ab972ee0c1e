"""Tiny real wheels that stand in for torch, verl and the rest on a loopback index.

Each is a valid wheel (METADATA, WHEEL, RECORD with sha256) that pip installs like any other;
its top-level module records its name and version so a smoke test can import it.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def make_wheel(out_dir: Path, name: str, version: str, *, tag: str = "py3-none-any",
               files: dict[str, str | bytes] | None = None, requires: list[str] = (),
               module: str | None = None, payload_mb: int = 0) -> Path:
    """Write NAME-VERSION-TAG.whl into out_dir; returns its path. `payload_mb` adds that much
    incompressible data (stored, not deflated) so a stand-in weighs what the real wheel does."""
    dist = dist_name(name)
    module = module if module is not None else dist
    info = f"{dist}-{version}.dist-info"
    contents: dict[str, bytes] = {}
    if module:
        contents[f"{module}/__init__.py"] = (
            f'"""envbuild test stand-in for {name}."""\n__version__ = "{version}"\n').encode()
    for path, data in (files or {}).items():
        contents[path] = data.encode() if isinstance(data, str) else data
    if payload_mb:
        import os

        contents[f"{module or dist}/_payload.bin"] = os.urandom(payload_mb << 20)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    contents[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    contents[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: envbuild-tests\n"
                                 f"Root-Is-Purelib: true\nTag: {tag}\n").encode()
    record = [f"{p},{_record_hash(d)},{len(d)}" for p, d in sorted(contents.items())]
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, d in sorted(contents.items()):
            info_ = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))
            info_.external_attr = 0o644 << 16
            info_.compress_type = zipfile.ZIP_STORED if p.endswith("_payload.bin") else zipfile.ZIP_DEFLATED
            zf.writestr(info_, d)
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
    return {str(p.relative_to(fixture_root)): p.read_bytes()
            for p in sorted((fixture_root / "verl").rglob("*.py")) if p.name != "__init__.py"}


def wheels_for_env(out_dir: Path, d: dict, verl_fixture: Path | None = None,
                   weights_mb: dict[str, int] | None = None) -> list[Path]:
    """Stand-in wheels for every package a resolved environment installs; `weights_mb` gives
    some of them a realistic size (e.g. {"torch": 512})."""
    pins = [p for p in d["torch"]["packages"]]
    if d.get("vllm"):
        pins.append(f"vllm=={d['vllm']['version']}")
    pins += [f"{n}=={v}" for n, v in d["verl"]["pins"].items()]
    made = []
    for name, version in requirement_pins(pins):
        made.append(make_wheel(out_dir, name, version,
                               payload_mb=(weights_mb or {}).get(name, 0)))
    files = verl_files(verl_fixture) if verl_fixture else {}
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
