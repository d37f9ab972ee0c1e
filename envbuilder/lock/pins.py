"""requirements.lock, the pip part of a lock: its format read (parse: name -> version, hashes,
parents) and each install layer's share of its pins (layers, constraint_layers). The one reader
of a lock's pins: the lock's integrity check, its layer files, the SBOM and the constraints a
render takes (lock/constraints.py) all parse here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING

from envbuilder.record import Record
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.render.plan import BUILD_TOOLS, REQ, layer_roots, normalize

if TYPE_CHECKING:
    from collections.abc import Iterable

# Packages whose files differ between torch's CUDA builds (torch's own, and the CUDA runtime
# wheels it pulls in): a lock solved with PyPI's build of a torch version pins none of them for
# another build of that version.
TORCH_BUILD_PACKAGES = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*)$")
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
# a pinned version as a lock may hold it: PEP 440 (epoch!, local +label) in one plain token
PIN_VERSION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.+!_-]{0,62}[A-Za-z0-9])?")
_HASH_LINE = re.compile(r"^[ \t]+--hash=[^\n]*\n?", re.M)


class Locked(Record):
    """A package's pin in a lock: version, hashes, and parents (the packages that pull it in;
    "" = asked for directly)."""

    version: str
    hashes: tuple[str, ...]
    parents: frozenset[str]


def parse(text: str, with_hashes: bool = True) -> dict[str, Locked]:
    """requirements.lock (uv's format, annotated) -> {normalized name: Locked}. Without
    `with_hashes` (what constraints need), the hash lines, most of a lock, are skipped unread."""
    out: dict[str, Locked] = {}
    name: str | None = None
    version = ""  # (read only once a name is)
    hashes: list[str] = []
    parents: set[str] = set()
    in_via = False

    def flush() -> None:
        if name:
            out[name] = Locked(version, tuple(hashes), frozenset(parents))

    if not with_hashes:  # one pass in C rather than a Python test per hash line
        text = _HASH_LINE.sub("", text)
    for line in text.splitlines():
        m = REQ.match(line)
        if m:
            flush()
            name, version, hashes, parents, in_via = normalize(m[1]), m[2], [], set(), False
            if not PIN_VERSION.fullmatch(version):
                from envbuilder.errors import UserError
                from envbuilder.text import shorten

                raise UserError(
                    f"requirements.lock pins {name} at {shorten(version, 60)!r}, which is not a "
                    "version (one token of letters, digits, '.', '+', '!', '_', '-'): it would "
                    "reach the pip files as it is. Re-lock with `envbuild lock`."
                )
            if with_hashes:
                hashes += HASH.findall(line)
            continue
        stripped = line.strip()
        if with_hashes:
            hashes += HASH.findall(stripped)
        if stripped.startswith("# via"):
            rest = stripped[len("# via") :].strip()
            in_via = not rest
            if rest:
                parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif in_via and stripped.startswith("#   "):
            rest = stripped[4:].strip()
            parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif not stripped.startswith("#"):
            in_via = False
    flush()
    return out


def layers(env: ResolvedEnv, locked: dict[str, Locked]) -> dict[str, list[str]]:
    """Each layer's packages: the closure of its roots over the lock's dependency edges, minus
    what an earlier layer installs. Anything left over goes into the last layer. The builder's
    `build` layer is the closure of the build tools on its own (it may overlap the others)."""
    children: dict[str, set[str]] = {}
    for name, entry in locked.items():
        for parent in entry.parents:
            children.setdefault(parent, set()).add(name)

    def closure(roots: Iterable[str], skip: frozenset[str] | set[str] = frozenset()) -> set[str]:
        todo = [normalize(m[1]) if (m := REQ.match(r)) else normalize(r) for r in roots]
        mine: set[str] = set()
        while todo:
            n = todo.pop()
            if n in skip or n in mine or n not in locked:
                continue
            mine.add(n)
            todo += children.get(n, ())
        return mine

    done: set[str] = set()
    out: dict[str, list[str]] = {}
    for layer, roots in layer_roots(env).items():
        mine = closure(roots, frozenset(done))
        done |= mine
        out[layer] = sorted(mine)
    build = closure(BUILD_TOOLS) if env.needs_builder else set()
    last = list(out)[-1]  # (verl's layer, or the Megatron engine's after it)
    out[last] = sorted(set(out[last]) | (set(locked) - done - build))
    if env.needs_builder:
        out["build"] = sorted(build)
    return out


def constraint_layers(
    env: ResolvedEnv, requirements_lock: str | bytes, torch_swapped: bool, lock_sha256: str | None = None
) -> dict[str, list[str]]:
    """{layer: `name==version` of the packages that layer installs} (pip constraints take no
    extras and no hashes). One set per layer, so that a changed verl pin leaves the torch
    layer's set, and with it Docker's cache of that layer, as it was. From a lock solved with
    PyPI's torch: none of the packages that differ between torch builds.

    Kept as a sealed cache entry (paths.sealed_text) by the sha256 of the lock (`lock_sha256` where
    the caller has it), of what decides the layers (their roots, the builder, the swap) and of
    this file's code: a render of every profile reads a few MB of locks, and parsing and
    layering them was a third of `render --all`. A cache that can't be read or written is
    worked out afresh."""
    from envbuilder.paths import sealed_text, source

    def fresh() -> str:
        text = requirements_lock
        locked = parse(text.decode("utf-8") if isinstance(text, bytes) else text, with_hashes=False)
        return json.dumps(
            {
                layer: [
                    f"{n}=={locked[n].version}"
                    for n in names
                    if not (torch_swapped and TORCH_BUILD_PACKAGES.match(n))
                ]
                for layer, names in layers(env, locked).items()
            }
        )

    try:
        h = hashlib.sha256(source(__file__))
    except OSError:
        return json.loads(fresh())  # type: ignore[no-any-return]
    if lock_sha256 is None:
        data = requirements_lock.encode() if isinstance(requirements_lock, str) else requirements_lock
        lock_sha256 = hashlib.sha256(data).hexdigest()
    h.update(lock_sha256.encode())
    h.update(json.dumps([layer_roots(env), env.needs_builder, torch_swapped]).encode())
    return json.loads(sealed_text("lock", h.hexdigest(), fresh))  # type: ignore[no-any-return]
