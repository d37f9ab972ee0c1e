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

import importlib.util
import json
import pathlib
import re
import sys
from typing import Any

Data = dict[str, Any]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "audit_precision"  # this script's part of it
REQUIRED = ("profile", "gpu", "verl", "checks", "reasons", "modules", "files", "reviewed")
WHAT = {
    "autocast_bf16": "torch.autocast(..., dtype=torch.bfloat16)",
    "flash_attention_2": 'a "flash_attention_2" literal',
}
AUTOCAST = re.compile(r"\b(?:torch\.(?:cuda\.amp\.|amp\.)?)?autocast\s*\(")
BF16 = re.compile(r"\btorch\.bfloat16\b|[\"'](?:bfloat16|bf16)[\"']")
FA2 = re.compile(r"[\"']flash_attention_2[\"']")


def load_data(key: str, required: tuple[str, ...]) -> Data | None:
    """This script's part (`key`) of the sidecar beside it, or None, said on stderr, when the
    file is missing, is no JSON object or lacks a `required` field."""
    path = pathlib.Path(__file__).resolve().with_name(SIDECAR)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        why = f"cannot be read ({type(e).__name__}: {e})"
    else:
        part = data.get(key) if isinstance(data, dict) else None
        missing = [k for k in required if k not in part] if isinstance(part, dict) else []
        if isinstance(part, dict) and not missing:
            return part
        why = f"has no {missing[0]!r} in its {key!r} part" if missing else f"holds no {key!r} object"
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
    plan = load_data(KEY, REQUIRED)
    if plan is None:
        return 2
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
                f"{rel}:{lineno}: {WHAT[check]} left on the run's path ({plan['reasons'][check]}): {line}"
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
