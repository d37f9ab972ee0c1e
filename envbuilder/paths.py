"""Where the shipped data lives: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """`matrices` or `templates`: the wheel's copy, else the checkout's."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"envbuild's {name}/ folder is missing from {_PKG}; reinstall envbuild")


def cache_file(name: str) -> Path | None:
    """`name` in envbuild's cache folder: $XDG_CACHE_HOME/envbuild, else ~/.cache/envbuild;
    None where there is no home to put it in."""
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild" / name
    except RuntimeError:  # no home directory
        return None


def read_cache(path: Path | None) -> str | None:
    """A cache file's text; None where it is absent or unreadable, or caching is off
    (ENVBUILD_NO_CACHE). What it holds is data for the caller to check, never code."""
    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def write_cache(path: Path | None, text: str) -> None:
    """`text` into a cache file, whole or not at all (a temporary file renamed over it); a
    read-only home only costs speed."""
    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
