"""What the GPU bench scripts may delete and how they read records (standard library only: they
run on a bare GPU machine, where envbuild itself is not installed).

- A folder a script empties or deletes is one it made: it carries MARK, a file naming the script,
  written when the script creates the folder (or finds it empty). A folder without its marker that
  holds anything is refused (`Refused`, exit 2), never emptied or reused: `--work ~` or
  `--site ~/project` must not cost the user a file. A link is refused, never followed.
- A name that becomes part of a path (`--case`) is a plain name: letters, digits, `.`, `_`, `-`,
  no leading dot, so it never climbs out of its folder.
- A JSON record is read only when it is a regular file (a FIFO would block for good, a device
  never end) of at most `limit` bytes; envbuilder.limits.open_regular is the same rule for envbuild.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat

MARK = ".envbuild-bench"
MAX_RECORD_BYTES = 16 << 20  # a run's record is ~100 KB
PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class Refused(Exception):
    """Bad input (exit 2): the message says what, why and what to do."""


def plain_name(value: str, what: str) -> str:
    if not PLAIN_NAME.fullmatch(value):
        raise Refused(
            f"{what} {value!r} is not a plain name: it becomes a file and folder name, so it may "
            "hold only letters, digits, '.', '_' and '-' (at most 128, no leading dot). "
            "Pass a plain name such as h200-gae."
        )
    return value


def _marked_by(folder: str) -> str | None:
    """The script named by folder's marker, None when there is none (or it is not a file)."""
    try:
        fd = os.open(os.path.join(folder, MARK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 256).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def claim(folder: str, script: str) -> str:
    """`folder` as `script`'s own: created with its marker when missing, marked when empty, kept
    when its marker names `script`; Refused otherwise (a file, a link, another's folder)."""
    folder = os.path.abspath(folder)
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        os.makedirs(folder)
        st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise Refused(
            f"{folder} is {kind}; {script} writes and deletes only in folders it made itself. "
            "Pass a new folder (or the real path of an empty one)."
        )
    owner = _marked_by(folder)
    if owner == script:
        return folder
    if owner is None and not os.listdir(folder):
        with open(os.path.join(folder, MARK), "w", encoding="utf-8") as fh:
            fh.write(script + "\n")
        return folder
    made = f"is {owner}'s" if owner else f"holds files and no {MARK} marker"
    raise Refused(
        f"{folder} {made}: it is not a folder {script} made, and {script} empties the folders it "
        "uses, so it will not touch this one. Pass a new or empty folder (if an earlier "
        f"{script} made this one before it marked its folders, mark it: "
        f"echo {script} > {os.path.join(folder, MARK)})."
    )


def empty(folder: str, script: str) -> str:
    """`folder` claimed (see claim), then emptied of everything but its marker."""
    folder = claim(folder, script)
    for name in os.listdir(folder):
        if name != MARK:
            remove_in(folder, name)
    return folder


def remove_in(folder: str, name: str) -> None:
    """Delete `name` inside a folder this script claimed: a link is unlinked, never followed."""
    path = os.path.join(folder, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def read_json(path: str, what: str, limit: int = MAX_RECORD_BYTES):
    """The JSON document in `path` (a regular file of at most `limit` bytes, UTF-8); Refused
    with what is wrong otherwise. It never blocks on a FIFO: opened non-blocking, fstat first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        why = "there is no such file" if e.errno == errno.ENOENT else e.strerror
        raise Refused(f"cannot read {what} {path}: {why}. Check the path.") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(
                f"{what} {path} is not a regular file (a pipe, device or folder); only a "
                "record file is read. Pass the file itself."
            )
        os.set_blocking(fd, True)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(
            f"{what} {path} is larger than {limit >> 20} MiB; it is not a record. Pass the right file."
        )
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Refused(f"{what} {path} is not JSON ({e}); it is not a record. Pass the right file.") from None
