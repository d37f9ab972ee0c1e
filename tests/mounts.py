"""Folders that cannot take a write, for the tests that prove a command says so: a read-only or
a full tmpfs (root only; skipped elsewhere, except under CI=true, where it must run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


from conftest import unavailable


@pytest.fixture
def mounted(tmp_path):
    """mounted(options) -> a fresh tmpfs with those mount options (root only)."""
    if os.geteuid() != 0:
        unavailable("a read-only or full folder needs a tmpfs mount, which needs root")
    mounts = []

    def mount(options: str) -> Path:
        mnt = tmp_path / f"mnt{len(mounts)}"
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", mnt], capture_output=True, text=True
        )
        if r.returncode != 0:
            unavailable(f"mount -t tmpfs failed: {r.stderr.strip()}")
        mounts.append(mnt)
        return mnt

    yield mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", mnt], check=False)


def full_folder(mount) -> Path:
    """A tmpfs with no byte free."""
    mnt = mount("size=64k")
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # no space left
    finally:
        os.close(fd)
    return mnt
