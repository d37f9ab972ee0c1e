"""Release-version ordering and ranges for the versions the matrix holds (2.6.0, 0.8.5.post1,
2.9.0rc1, 570.26, 24.04.01), PEP 440's rules for release, pre-, post- and dev segments; and the
one NVIDIA driver version pattern (the schema, --driver and detect use it).

Own code rather than `packaging`: importing packaging.specifiers costs more than a whole render.
"""

from __future__ import annotations

from typing import Any

import re

# what the matrix schema accepts as a version, and exactly what version_key orders (which also
# takes a local suffix, +cu118, as pip's pins carry it)
VERSION_PATTERN = r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.?post(\d+))?(?:\.?dev(\d+))?"
DRIVER_PATTERN = r"\d+\.\d+(?:\.\d+)?"  # 550.54.14, 570.26

_VERSION = re.compile(VERSION_PATTERN + r"(?:\+[\w.]+)?")
_CLAUSE = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*([\w.+]+?)(\.\*)?\s*")
_PRE = {"a": 0, "b": 1, "rc": 2}


def is_driver_version(text: object) -> bool:
    return isinstance(text, str) and re.fullmatch(DRIVER_PATTERN, text) is not None


# version_key and in_range of the matrix's few hundred versions, each computed once (a grid or a
# fix walk asks them tens of thousands of times); bounded, so odd input cannot grow them
_KEYS: dict[str, tuple[Any, ...]] = {}
_RANGES: dict[tuple[str, str], bool] = {}
_MAX_CACHED = 4096


def version_key(text: str) -> tuple[Any, ...]:
    """A sort key, PEP 440's order: X.devN < XaN < XbN < XrcN < X < X.postN; the release
    numbers zero-padded. Raises ValueError (naming the text) for anything else."""
    plain = str(text).strip()
    key = _KEYS.get(plain)
    if key is None:
        key = _version_key(text, plain)
        if len(_KEYS) < _MAX_CACHED:
            _KEYS[plain] = key
    return key


def _version_key(text: object, plain: str) -> tuple[Any, ...]:
    m = _VERSION.fullmatch(plain)
    if not m:
        raise ValueError(f"not a release version: {text!r}")
    release = tuple(int(p) for p in m.group(1).split("."))
    release += (0,) * (8 - len(release))
    pre, post, dev = m.group(2), m.group(4), m.group(5)
    if pre:
        pre_key = (_PRE[pre], int(m.group(3)))
    elif dev is not None and post is None:
        pre_key = (-1, 0)  # X.devN comes before X's pre-releases
    else:
        pre_key = (3, 0)
    return (
        release + pre_key + (int(post) if post is not None else -1, int(dev) if dev is not None else 1 << 62)
    )


def _is_post_of(version: tuple[Any, ...], base: tuple[Any, ...]) -> bool:
    """`version` is a post-release of `base` (which is none): `>base` excludes it (PEP 440)."""
    return version[:-2] == base[:-2] and base[-2] == -1 and version[-2] >= 0


def in_range(version: str, spec: str) -> bool:
    """True when `version` satisfies every clause of `spec` (">=0.7.3,<=0.8.5")."""
    key = (str(version), str(spec))
    found = _RANGES.get(key)
    if found is None:
        found = _in_range(version, spec)
        if len(_RANGES) < _MAX_CACHED:
            _RANGES[key] = found
    return found


def _in_range(version: str, spec: str) -> bool:
    v = version_key(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = _CLAUSE.fullmatch(clause)
        if not m:
            raise ValueError(f"not a version range: {spec!r}")
        op = m.group(1)
        if m.group(3):  # a prefix match, PEP 440's `==5.0.*` / `!=5.0.*`
            if op not in ("==", "!="):
                raise ValueError(f"not a version range: {spec!r}")
            if _has_prefix(version, m.group(2)) != (op == "=="):
                return False
            continue
        bound = version_key(m.group(2))
        ok = {
            "==": v == bound,
            "!=": v != bound,
            ">=": v >= bound,
            "<=": v <= bound,
            "<": v < bound,
            ">": v > bound and not _is_post_of(v, bound),
        }[op]
        if not ok:
            return False
    return True


def _has_prefix(version: str, prefix: str) -> bool:
    """`version`'s release segments begin with `prefix`'s (5.0.2 with 5.0; 5.10 not with 5.1)."""
    head = tuple(int(p) for p in prefix.split("."))
    return version_key(version)[: len(head)] == head


def _clauses(clause: str, spec: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """One clause as (op, key) pairs: `==5.0.*` is >=5.0 and <5.1; `!=5.0.*` gives none (it
    excludes one series, never a whole interval)."""
    m = _CLAUSE.fullmatch(clause)
    if not m:
        raise ValueError(f"not a version range: {spec!r}")
    op, text = m.group(1), m.group(2)
    if not m.group(3):
        return ((op, version_key(text)),)
    if op == "!=":
        return ()
    if op != "==":
        raise ValueError(f"not a version range: {spec!r}")
    head = [int(p) for p in text.split(".")]
    upper = ".".join(map(str, head[:-1] + [head[-1] + 1]))
    return ((">=", version_key(text)), ("<", version_key(upper)))


def ranges_overlap(a: str, b: str) -> bool:
    """True when some version can satisfy both ranges (">=1.26.0,<1.27.0" and ">=1.30.0": no).
    `!=` clauses are ignored: they exclude single versions or series, never a whole interval."""
    low: tuple[Any, ...] | None = None  # (key, inclusive)
    high: tuple[Any, ...] | None = None
    for clause in filter(None, (c.strip() for c in f"{a},{b}".split(","))):
        for op, bound in _clauses(clause, f"{a} / {b}"):
            if op in (">=", ">", "=="):
                cand = (bound, op != ">")
                if low is None or cand[0] > low[0] or (cand[0] == low[0] and not cand[1]):
                    low = cand
            if op in ("<=", "<", "=="):
                cand = (bound, op != "<")
                if high is None or cand[0] < high[0] or (cand[0] == high[0] and not cand[1]):
                    high = cand
    if low is None or high is None:
        return True
    return bool(low[0] < high[0] or (low[0] == high[0] and low[1] and high[1]))
