"""The compiled-template cache (render/files.py `jinja_env`): compiled templates are code
(jinja loads them with marshal), so they are kept only as sealed cache entries (paths.py) and
never read from a folder by a path that someone else could swap for a link. Each test renders
in a fresh `envbuild` process with a cache folder of its own.
"""

from __future__ import annotations

import base64
import marshal
import os
import pickle
import subprocess
from pathlib import Path

import jinja2
from jinja2.bccache import bc_magic

from conftest import clean_env, envbuild_exe

ROOT = Path(__file__).resolve().parents[1]


def render(tmp_path: Path, cache: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [envbuild_exe(), "render", "t4", "-o", str(tmp_path / "out"), "--force"],
        env=clean_env(XDG_CACHE_HOME=str(cache), ENVBUILD_DEBUG="1", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def planted_bytecode(marker: Path, template: str) -> tuple[str, bytes]:
    """A compiled template as jinja's FileSystemBytecodeCache stores it, for the shipped
    `template` (its key and checksum right), whose code writes `marker` when it is loaded."""
    path = ROOT / "templates" / template
    cache = jinja2.BytecodeCache()
    key = cache.get_cache_key(template, str(path))
    checksum = cache.get_source_checksum(path.read_text(encoding="utf-8"))
    code = compile(f"open({str(marker)!r}, 'w').write('ran')", "<planted>", "exec")
    return key, bc_magic + pickle.dumps(checksum, 2) + marshal.dumps(code)


def test_a_compiled_template_planted_in_the_cache_is_never_run(tmp_path):
    """Issue 33 #1: the old cache read `<cache>/envbuild/jinja/__jinja2_<key>.cache` by path
    (a folder another user could swap for a link to theirs between the check and the open) and
    ran whatever bytecode it held; on main the marker appeared. Now neither that file nor an
    unsealed `jinja-<key>.json` entry is loaded."""
    cache = tmp_path / "cache"
    folder = cache / "envbuild"
    (folder / "jinja").mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)
    marker = tmp_path / "marker"
    for template in ("Dockerfile.j2", "README.md.j2"):
        key, data = planted_bytecode(marker, template)
        (folder / "jinja" / f"__jinja2_{key}.cache").write_bytes(data)
        os.chmod(folder / "jinja" / f"__jinja2_{key}.cache", 0o600)
        (folder / f"jinja-{key}.json").write_text(base64.b64encode(data).decode())  # not sealed
    r = render(tmp_path, cache)
    assert not marker.exists()
    assert r.returncode == 0, r.stderr
    assert "FROM " in (tmp_path / "out" / "t4" / "Dockerfile").read_text()


def test_no_cache_means_no_compiled_templates_either(tmp_path):
    """Issue 33 #1: ENVBUILD_NO_CACHE=1 turned off every cache but jinja's, which main still
    wrote to (and read from) `<cache>/envbuild/jinja`."""
    cache = tmp_path / "cache"
    r = render(tmp_path, cache, ENVBUILD_NO_CACHE="1")
    assert r.returncode == 0, r.stderr
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))


def test_the_compiled_templates_are_sealed_entries_and_render_the_same(tmp_path):
    """The cache still works (it saves about a third of a warm render): the second render reads
    sealed entries and writes the same bytes as the first."""
    cache = tmp_path / "cache"
    assert render(tmp_path, cache).returncode == 0
    first = (tmp_path / "out" / "t4" / "Dockerfile").read_bytes()
    entries = sorted((cache / "envbuild").glob("jinja-*.json"))
    assert entries and all(p.read_text().startswith("envbuild-sealed 1 ") for p in entries)
    assert not (cache / "envbuild" / "jinja").exists()
    r = render(tmp_path, cache)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "t4" / "Dockerfile").read_bytes() == first
