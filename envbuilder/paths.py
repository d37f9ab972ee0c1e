"""Where the shipped data lives: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

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
