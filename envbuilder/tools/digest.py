"""A file's sha256, the one way envbuild hashes a file it checks (an archive, a download, a
file it wrote): read in 1 MiB blocks, never whole, optionally without following a link."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

BLOCK = 1 << 20


def sha256_hasher(path: Path, follow: bool = True) -> tuple[hashlib._Hash, int]:
    """A running sha256 seeded with the file's bytes (to go on hashing a resumed download),
    and the size it read: (hasher, size). `follow=False`: a link is an OSError, not its target."""
    h, size = hashlib.sha256(), 0
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(BLOCK):
            h.update(chunk)
            size += len(chunk)
    return h, size


def sha256_file(path: Path, follow: bool = True) -> tuple[str, int]:
    """(hex sha256, size in bytes) of a file."""
    h, size = sha256_hasher(path, follow)
    return h.hexdigest(), size
