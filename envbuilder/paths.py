"""Where the shipped data lives (inside the wheel, or at the top of a source checkout), and
envbuild's cache folder: used only when it is this user's own and private (mode 0700, not a
link), its files read without following a link and written through a temporary file created
exclusively in it. What a cache file holds is validated by its reader like any other input."""

from __future__ import annotations

import os
import stat
from functools import lru_cache
from pathlib import Path
from typing import Callable

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """`matrices` or `templates`: the wheel's copy, else the checkout's."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"envbuild's {name}/ folder is missing from {_PKG}; reinstall envbuild")


# where `envbuild lock` writes and `render --locked`, `wheelhouse` and the constraints look
# first (a relative folder: the project's), before envbuild's shipped copy (data_dir)
LOCK_ROOT = Path("lockfiles")


def cache_file(name: str) -> Path | None:
    """`name` in envbuild's cache folder: $XDG_CACHE_HOME/envbuild, else ~/.cache/envbuild;
    None where there is no home to put it in."""
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild" / name
    except RuntimeError:  # no home directory
        return None


MAX_CACHE_BYTES = 16 << 20  # far above any cache file (the validated matrix is ~0.3 MiB)


def private_dir(folder: Path, create: bool = False) -> int | None:
    """An open descriptor of `folder` when only this user can have put anything in it: a real
    folder (not a link), owned by this user, mode 0700 (one of this user's that others may only
    read and enter, as an older envbuild or jinja's `mkdir -p` left it, is tightened to 0700;
    one that others may write into is never used: it may hold their files). None otherwise, and
    the caller goes without its cache. `create`: make it (0700) first where it is missing."""
    if create:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == os.getuid() and not mode & 0o022:
            if mode != 0o700:
                os.fchmod(fd, 0o700)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_cache(path: Path | None) -> str | None:
    """A cache file's text; None where it is absent or unreadable, or caching is off
    (ENVBUILD_NO_CACHE), or it is not this user's own regular file in this user's private cache
    folder (private_dir): a file another user planted there, or a link, is never read. What it
    holds is data for the caller to validate like any input (readers.py), never code."""
    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return None
    folder = private_dir(path.parent)
    if folder is None:
        return None
    try:
        return _read_in(folder, path.name)
    finally:
        os.close(folder)


def _read_in(folder: int, name: str) -> str | None:
    """read_cache's file `name` in the private folder `folder` (a descriptor)."""
    from envbuilder.limits import read_upto

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MAX_CACHE_BYTES:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = read_upto(f, MAX_CACHE_BYTES)
        return data.decode("utf-8") if len(data) <= MAX_CACHE_BYTES else None
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def write_cache(path: Path | None, text: str) -> None:
    """`text` into a cache file, whole or not at all: a temporary file created exclusively (never
    through a link someone planted) in the private cache folder, then renamed over the file; a
    read-only home, or a cache folder that is not private, only costs speed."""
    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return
    folder = private_dir(path.parent, create=True)
    if folder is None:
        return
    tmp = f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder
        )
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
    finally:
        os.close(folder)


# -- sealed caches --------------------------------------------------------------------------------
# A cache whose content took long to validate (the matrix) is sealed: its first line is an HMAC
# of the rest under a key of 32 random bytes kept in the private cache folder (mode 0600, made
# once). Only text this envbuild validated and sealed passes `read_sealed`; a file planted in the
# folder, edited, or sealed under another key is None, and the caller validates afresh. (Whoever
# can read the key can already write the user's files: they are the user.)
SEAL = "envbuild-sealed 1 "
_KEY = ".key"


def _cache_key(folder: int) -> bytes | None:
    """The cache key in the private folder `folder` (a descriptor), made when missing."""
    try:
        fd = os.open(_KEY, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        try:
            fd = os.open(
                _KEY,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=folder,
            )
            key = os.urandom(32)  # (what secrets.token_bytes reads)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            return key
        except OSError:
            return None
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return None
        key = os.read(fd, 33)
        return key if len(key) == 32 else None
    finally:
        os.close(fd)


def _seal(key: bytes, body: str) -> str:
    import hmac

    return hmac.new(key, body.encode("utf-8"), "sha256").hexdigest()


def read_sealed(path: Path | None) -> str | None:
    """The body of a sealed cache file (write_sealed) when its seal is this user's key's; None
    otherwise (absent, another's, planted, edited)."""
    import hmac

    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return None
    folder = private_dir(path.parent)
    if folder is None:
        return None
    try:  # (the file and the key through one descriptor of the folder)
        text = _read_in(folder, path.name)
        if text is None or not text.startswith(SEAL):
            return None
        key = _cache_key(folder)
    finally:
        os.close(folder)
    head, _, body = text.partition("\n")
    if key is None or not hmac.compare_digest(head[len(SEAL) :], _seal(key, body)):
        return None
    return body


def write_sealed(path: Path | None, body: str) -> None:
    """`body` as a sealed cache file (see read_sealed); nothing where there is no private
    folder or key."""
    if path is None or os.environ.get("ENVBUILD_NO_CACHE"):
        return
    folder = private_dir(path.parent, create=True)
    if folder is None:
        return
    try:
        key = _cache_key(folder)
    finally:
        os.close(folder)
    if key is not None:
        write_cache(path, f"{SEAL}{_seal(key, body)}\n{body}")


def sealed_text(kind: str, key: str, make: Callable[[], str]) -> str:
    """The text make() returns, kept as the sealed cache entry `KIND-<key>.json` (`key`: a
    sha256 of everything the text is worked out from, the code included where it is not the
    standard library's): read back only when this user's envbuild sealed it (read_sealed),
    else made and sealed. envbuild.json's text, each lock's layered pins and each memory plan
    are kept so."""
    path = cache_file(f"{kind}-{key[:32]}.json")
    text = read_sealed(path)
    if text is None:
        text = make()
        write_sealed(path, text)
    return text


@lru_cache(maxsize=None)
def source(path: str) -> bytes:
    """The bytes of one of envbuild's own modules (`path`, its __file__ or a sibling), read once
    a process: a cache key that names the code which worked an entry out (sealed_text)."""
    with open(path, "rb") as f:
        return f.read()
