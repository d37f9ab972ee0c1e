#!/usr/bin/env python3
"""verl's recorded source patches for the profile's GPU, applied to the installed release.

The patches (each file, each find/replace) are read from envbuild-scripts.json beside this file,
as `envbuild render` wrote it for the profile (matrices/patches.yaml). Each replacement must
match at least once: a patch that no longer fits its release stops the build instead of leaving
the hard-coded behaviour in place.

The verl patched is the one in this Python's own site-packages (sysconfig's purelib and
platlib), or in `--site DIR` where that is given: never one that PYTHONPATH, the working
directory or an editable install puts first on the path, and never a file outside that folder.
The script runs itself again as `python -I` without PYTHON* variables (a PYTHONHOME moves the
prefix). Each file is written as a new file moved over the old name, never in place: uv
hard-links installed files to its cache, and a write through the link would patch every later
install on the machine.

  --site DIR   the site-packages folder whose verl to patch (default: this Python's own)

Exit 0 when every patch is in place, 1 when one does not fit (or verl is missing), 2 when the
sidecar is missing, is not one or holds a value that is not what it should be, or on a bad
argument.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import stat
import sys
import sysconfig
from typing import Callable, TypedDict, Union, cast

# what a sidecar value may be: a kind (a key of KINDS) or a shape made of kinds (shape_problem)
Kind = Union[type, str, None]
Shape = Union[Kind, "frozenset[str]", "set[str]", "tuple[Kind, ...]", "list[Shape]", "dict[Kind, Shape]"]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "apply_patches"  # this script's part of it
PATCH: Shape = {"name": "text", "files": ["path"], "replace": [["text", "text"]]}
SHAPE: dict[Kind, Shape] = {"profile": str, "gpu": str, "verl": str, "patches": [PATCH]}
MAX_SOURCE_BYTES = 16 << 20  # a verl source file is tens of KB


class Patch(TypedDict):
    name: str
    files: list[str]
    replace: list[list[str]]


class Patches(TypedDict):
    """This script's part of the sidecar, as SHAPE holds it."""

    profile: str
    gpu: str
    verl: str
    patches: list[Patch]


MAX_SIDECAR_BYTES = 4 << 20  # the sidecar is ~10 KB: anything this large is not one
KINDS: dict[Kind, str] = {
    str: "a string",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    None: "null",
    "text": "a non-empty string",
    "path": "a relative path of a .py file (letters, digits, _ and /; no '..', no leading /)",
    "module": "a dotted module name",
    "version": "a version (digits and dots)",
    "pattern": "a regular expression",
}
# the matrix's RELPATH (envbuilder/model/schema.py), held equal by a test: what render, overlays
# and `render --from` let a patch name, so a sidecar names nothing else
PATTERNS = {
    "path": r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.py",
    "module": r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
    "version": r"[0-9]+(\.[0-9]+)*",
}


def read_regular(path: pathlib.Path, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, OSError otherwise:
    a FIFO is never waited on, a device such as /dev/zero never read without end."""
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def kind_ok(value: object, kind: Kind) -> bool:
    """`value` is of `kind`, a key of KINDS (a string: one that UTF-8 can write)."""
    if kind is None or kind is bool:
        return value is None if kind is None else isinstance(value, bool)
    if kind is int or kind is float:
        return isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
        if kind == "pattern":
            re.compile(value)
    except (UnicodeError, re.error, RecursionError, OverflowError):
        return False
    if isinstance(kind, str) and kind in PATTERNS:
        return re.fullmatch(PATTERNS[kind], value) is not None
    return kind is str or value != ""


def shape_problem(value: object, shape: Shape, where: str) -> str | None:
    """What in `value` is not as `shape` says, as a phrase naming the place; None when all is.
    A shape is a kind (KINDS), a set of the strings allowed, a tuple (either shape), [item]
    (a list of items), [first, second] (a list of exactly these), {key: shape} (an object with
    these keys; others are left alone) or {str: shape} (an object whose every value is shape)."""
    if isinstance(shape, tuple):
        if any(shape_problem(value, s, where) is None for s in shape):
            return None
        what = " or ".join(KINDS.get(s, "another shape") for s in shape)
    elif isinstance(shape, (set, frozenset)):
        if isinstance(value, str) and value in shape:
            return None
        what = "one of " + ", ".join(sorted(shape))
    elif isinstance(shape, list):
        if isinstance(value, list) and len(shape) in (1, len(value)):
            items: list[object] = value
            for i, item in enumerate(items):
                problem = shape_problem(item, shape[0] if len(shape) == 1 else shape[i], f"{where}[{i}]")
                if problem:
                    return problem
            return None
        what = "a list" if len(shape) == 1 else f"a list of {len(shape)}"
    elif isinstance(shape, dict):
        if isinstance(value, dict):
            fields: dict[object, object] = value
            missing = [k for k in shape if k is not str and k not in fields]
            if missing:
                return f"has no {missing[0]!r} in its {where!r} part"
            pairs: list[tuple[object, Shape]]
            pairs = [(k, shape[str]) for k in fields] if str in shape else list(shape.items())
            for k, s in pairs:
                problem = shape_problem(k, str, f"{where} key") or shape_problem(fields[k], s, f"{where}.{k}")
                if problem:
                    return problem
            return None
        what = "an object"
    else:
        if kind_ok(value, shape):
            return None
        what = KINDS[shape]
    shown = "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else ascii(value)
    return f"has {where} = {shown[:80]}, not {what}"


def load_data(key: str, shape: dict[Kind, Shape]) -> dict[str, object] | None:
    """This script's part (`key`) of the sidecar beside it, as `shape` says it is, or None, said
    on stderr, when the file is missing or no regular file, is no JSON object, lacks a field or
    holds a value that is not what it should be."""
    path = pathlib.Path(__file__).resolve().with_name(SIDECAR)
    try:
        data: object = json.loads(read_regular(path, MAX_SIDECAR_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        why = f"cannot be read ({type(e).__name__}: {e})"
    else:
        doc: dict[object, object] = data if isinstance(data, dict) else {}
        part = doc.get(key)
        if not isinstance(part, dict):
            why = f"holds no {key!r} object"
        else:
            problem = shape_problem(part, shape, key)
            if problem is None:
                return part
            why = problem
    print(
        f"{key}: {path} {why}. This script reads the profile's data from the {SIDECAR} that "
        f"`envbuild render` writes beside it: render the profile again and keep the two together.",
        file=sys.stderr,
    )
    return None


def isolated(argv: list[str]) -> None:
    """Run this script again as `python -I` (no user site, no script folder on the path, PYTHON*
    variables ignored) with those variables gone, unless it already runs so."""
    if (sys.flags.isolated and not any(k.startswith("PYTHON") for k in os.environ)) or not sys.executable:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    flags = ["-I"] + (["-S"] if sys.flags.no_site else [])
    script = str(pathlib.Path(__file__).resolve())
    try:
        os.execve(sys.executable, [sys.executable, *flags, script, *argv], env)
    except OSError:
        pass  # (then in this process: the patched verl is found by sysconfig, not by the path)


def target_sites(argv: list[str]) -> list[pathlib.Path] | None:
    """The folders whose verl this run patches: `--site DIR`, else this Python's own
    site-packages; None (said on stderr) on a bad argument."""
    if argv[:1] == ["--site"] and len(argv) == 2 and argv[1]:
        return [pathlib.Path(argv[1])]
    if argv:
        print(
            f"apply_patches: unknown arguments {' '.join(map(ascii, argv))}; the one option is "
            "--site DIR (the site-packages whose verl to patch)",
            file=sys.stderr,
        )
        return None
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(pathlib.Path(paths[k]) for k in ("purelib", "platlib")))


def verl_site(sites: list[pathlib.Path]) -> pathlib.Path | None:
    """The first of `sites` with verl installed in it: a real verl/ folder (not a link to one
    elsewhere) with its __init__.py."""
    for site in sites:
        package = site / "verl"
        if package.is_dir() and not package.is_symlink() and (package / "__init__.py").is_file():
            return site
    return None


def inside(site: pathlib.Path, rel: str) -> pathlib.Path | None:
    """site/rel when it is a regular file whose real path stays inside site (a link that leads
    out of it is never followed)."""
    path = site / rel
    try:
        real, top = path.resolve(strict=True), site.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if top != real and top not in real.parents:
        return None
    return path if real.is_file() else None


def replace_file(path: pathlib.Path, text: str) -> None:
    """Write `text` to a new file beside `path` and move it over the name: a hard link's other
    names (uv's cache) and a symbolic link's target keep their bytes, and a failure leaves the
    old file whole. The mode is the old file's."""
    mode = stat.S_IMODE(path.stat().st_mode)
    tmp = path.with_name(f".{path.name}.envbuild-patch-{os.getpid()}")
    fd = os.open(
        str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def patched(site: pathlib.Path, patches: list[Patch]) -> tuple[dict[str, str], str | None]:
    """({file: its patched text} for each file that changes, None), or ({}, why) when a
    patch does not fit this release; nothing is written."""
    texts: dict[str, str] = {}
    changed: dict[str, str] = {}
    for patch in patches:
        for rel in patch["files"]:
            path = inside(site, rel)
            if path is None:
                return (
                    {},
                    f"{rel} does not exist in {site}; this verl release does not match the recorded patch",
                )
            if rel not in texts:
                try:
                    texts[rel] = read_regular(path, MAX_SOURCE_BYTES).decode("utf-8")
                except (OSError, UnicodeDecodeError) as e:
                    return {}, f"{rel} cannot be read ({type(e).__name__}: {e})"
            text = texts[rel]
            for find, new in patch["replace"]:
                count = text.count(find)
                if count == 0 and new in text:
                    print(f"apply_patches: {rel}: already patched")
                    continue
                if count == 0:
                    return (
                        {},
                        f"{rel}: {find!r} not found; this verl release does not match the recorded patch",
                    )
                text = text.replace(find, new)
                print(f"apply_patches: {rel}: {find.strip()!r} replaced ({count}x)")
            if text != texts[rel]:
                texts[rel] = changed[rel] = text
    return changed, None


def main(argv: list[str]) -> int:
    try:
        for stream in (sys.stdout, sys.stderr):
            found: object = getattr(stream, "reconfigure", None)
            if not callable(found):
                break  # (as the AttributeError did: the next stream is left as it is too)
            reconfigure: Callable[..., object] = found
            reconfigure(errors="backslashreplace")
    except Exception:
        pass
    sites = target_sites(argv)
    if sites is None:
        return 2
    part = load_data(KEY, SHAPE)
    if part is None:
        return 2
    data = cast(Patches, part)  # (load_data held it to SHAPE, which Patches spells)
    patches = data["patches"]
    names = ", ".join(p["name"] for p in patches)
    print(f"apply_patches: {data['profile']} ({data['gpu']}), verl {data['verl']}: {names}")
    site = verl_site(sites)
    if site is None:
        print(
            f"apply_patches: verl is not installed in {', '.join(map(str, sites))}. Only the verl "
            "installed in the environment is patched, never a checkout on PYTHONPATH or an "
            "editable install: install verl into it (or name its site-packages with --site).",
            file=sys.stderr,
        )
        return 1
    changed, why = patched(site, patches)
    if why is not None:
        print(f"apply_patches: {why}", file=sys.stderr)
        return 1
    for rel, text in changed.items():
        try:
            replace_file(site / rel, text)
        except OSError as e:
            print(f"apply_patches: {site / rel} cannot be written ({type(e).__name__}: {e})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    isolated(sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
