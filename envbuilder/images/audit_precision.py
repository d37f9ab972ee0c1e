#!/usr/bin/env python3
"""Precision audit for an envbuild profile: run in the image after apply_patches.py.

Scans the installed verl's files that the run loads (the modules of the training path and the
files the recorded patches touch) for what the profile's GPU cannot run: a torch.autocast(...)
naming torch.bfloat16 where the profile does not compute in bf16, a "flash_attention_2" literal
where flash-attn is not used. Each one left fails the build with its file:line, unless the matrix
records it as a reviewed exception (matrices/patches.yaml `reviewed`, with why). A reviewed
line that is no longer there fails too: the release changed and needs a new review. The checks,
modules, files and reviewed lines are read from envbuild-scripts.json beside this file, as
`envbuild render` wrote it for the profile.

Exit 0 when nothing is left, 1 when something is (or verl or one of its files is missing), 2
when the sidecar is missing or is not one.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import pathlib
import re
import stat
import sys
from typing import TypedDict, Union, cast

# what a sidecar value may be: a kind (a key of KINDS) or a shape made of kinds (shape_problem)
Kind = Union[type, str, None]
Shape = Union[Kind, "frozenset[str]", "set[str]", "tuple[Kind, ...]", "list[Shape]", "dict[Kind, Shape]"]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "audit_precision"  # this script's part of it
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
WHAT = {
    "autocast_bf16": "torch.autocast(..., dtype=torch.bfloat16)",
    "flash_attention_2": 'a "flash_attention_2" literal',
}
AUTOCAST = re.compile(r"\b(?:torch\.(?:cuda\.amp\.|amp\.)?)?autocast\s*\(")
BF16 = re.compile(r"\btorch\.bfloat16\b|[\"'](?:bfloat16|bf16)[\"']")
FA2 = re.compile(r"[\"']flash_attention_2[\"']")
SHAPE: dict[Kind, Shape] = {
    "profile": str,
    "gpu": str,
    "verl": str,
    "checks": [set(WHAT)],
    "reasons": {str: str},
    "modules": ["module"],
    "files": ["path"],
    "reviewed": [{"file": "path", "check": set(WHAT), "line": str, "name": str, "why": str}],
}


class Reviewed(TypedDict):
    file: str
    check: str
    line: str
    name: str
    why: str


class Plan(TypedDict):
    """This script's part of the sidecar, as SHAPE holds it."""

    profile: str
    gpu: str
    verl: str
    checks: list[str]
    reasons: dict[str, str]
    modules: list[str]
    files: list[str]
    reviewed: list[Reviewed]


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


def code_part(line: str) -> str:
    """The line up to a comment (a # outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def call_args(text: str, start: int) -> str:
    """The text from `start` (just after an opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return text[start:]


def findings(text: str, checks: list[str]) -> list[tuple[int, str, str]]:
    """(line number, check, stripped line) of every hit of `checks` in a file's text."""
    lines = text.splitlines()
    out = []
    if "autocast_bf16" in checks:
        for m in AUTOCAST.finditer(text):
            n = text.count("\n", 0, m.start())
            line = lines[n]
            column = m.start() - (text.rfind("\n", 0, m.start()) + 1)
            if column >= len(code_part(line)):
                continue  # in a comment
            if BF16.search(call_args(text, m.end())):
                out.append((n + 1, "autocast_bf16", line.strip()))
    if "flash_attention_2" in checks:
        for n, line in enumerate(lines):
            if FA2.search(code_part(line)):
                out.append((n + 1, "flash_attention_2", line.strip()))
    return sorted(out)


def verl_root() -> pathlib.Path | None:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]).parent


def module_file(root: pathlib.Path, module: str) -> pathlib.Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def main() -> int:
    part = load_data(KEY, SHAPE)
    if part is None:
        return 2
    plan = cast(Plan, part)  # (load_data held it to SHAPE, which Plan spells)
    checks = plan["checks"]
    if not checks:
        print(f"audit_precision: nothing to audit: the {plan['gpu']} computes in bf16 with flash-attn")
        return 0
    root = verl_root()
    if root is None:
        print("audit_precision: verl is not installed", file=sys.stderr)
        return 1
    files: list[str] = []
    problems: list[str] = []
    for module in plan["modules"]:
        path = module_file(root, module)
        if path is None:
            problems.append(
                f"{module}: no file for this module of the training path; is the installed verl "
                f"the {plan['verl']} the matrix records?"
            )
        else:
            files.append(path.relative_to(root).as_posix())
    for rel in plan["files"]:
        if not (root / rel).is_file():
            problems.append(f"{rel}: no such file, though a recorded patch names it")
        else:
            files.append(rel)
    files = list(dict.fromkeys(files))
    reviewed = {(r["file"], r["check"], r["line"]): r for r in plan["reviewed"]}
    used = set()
    checked = 0
    for rel in files:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{rel}: cannot be read ({e})")
            continue
        checked += 1
        for lineno, check, line in findings(text, checks):
            key = (rel, check, line)
            if key in reviewed:
                used.add(key)
                print(
                    f"audit_precision: {rel}:{lineno}: reviewed ({reviewed[key]['name']}): {reviewed[key]['why']}"
                )
                continue
            problems.append(
                f"{rel}:{lineno}: {WHAT[check]} left on the run's path ({plan['reasons'].get(check, 'the profile does without it')}): {line}"
            )
    for key, r in reviewed.items():
        if key not in used:
            problems.append(
                f"{r['file']}: the reviewed line ({r['name']}) is not there any more: {r['line']}; "
                "the release changed, review the file again"
            )
    if problems:
        for p in problems:
            print(f"audit_precision: {p}", file=sys.stderr)
        print(
            f"audit_precision: FAILED for {plan['profile']} (verl {plan['verl']}): {len(problems)} finding(s). "
            "Record a patch (matrices/patches.yaml) for each line the run executes, or a reviewed "
            "exception, with why, for a line it never reaches.",
            file=sys.stderr,
        )
        return 1
    print(
        f"audit_precision: ok: {checked} verl files on the run's path; none of "
        f"{', '.join(WHAT[c] for c in checks)} left ({plan['profile']}, verl {plan['verl']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
