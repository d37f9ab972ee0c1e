"""Release-version ordering and ranges for the versions the matrix holds (2.6.0, 0.8.5.post1,
570.26, 24.04.01), PEP 440's rules for release and post segments.

Own code rather than `packaging`: importing packaging.specifiers costs more than a whole render.
"""

from __future__ import annotations

import re

_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:\.?post(\d+))?(?:\+[\w.]+)?")
_CLAUSE = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*([\w.+]+)\s*")


def version_key(text: str) -> tuple:
    """A sort key: the release numbers (zero-padded) then the post number (-1 for none)."""
    m = _VERSION.fullmatch(str(text).strip())
    if not m:
        raise ValueError(f"not a release version: {text!r}")
    release = tuple(int(p) for p in m.group(1).split("."))
    release += (0,) * (8 - len(release))
    return release + (int(m.group(2)) if m.group(2) is not None else -1,)


def _is_post_of(version: tuple, base: tuple) -> bool:
    return version[:-1] == base[:-1] and base[-1] == -1 and version[-1] >= 0


def in_range(version: str, spec: str) -> bool:
    """True when `version` satisfies every clause of `spec` (">=0.7.3,<=0.8.5")."""
    v = version_key(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = _CLAUSE.fullmatch(clause)
        if not m:
            raise ValueError(f"not a version range: {spec!r}")
        op, bound = m.group(1), version_key(m.group(2))
        ok = {"==": v == bound, "!=": v != bound, ">=": v >= bound, "<=": v <= bound,
              "<": v < bound, ">": v > bound and not _is_post_of(v, bound)}[op]
        if not ok:
            return False
    return True


def ranges_overlap(a: str, b: str) -> bool:
    """True when some version can satisfy both ranges (">=1.26.0,<1.27.0" and ">=1.30.0": no).
    `!=` clauses are ignored: they exclude single versions, never a whole interval."""
    low: tuple | None = None  # (key, inclusive)
    high: tuple | None = None
    for clause in filter(None, (c.strip() for c in f"{a},{b}".split(","))):
        m = _CLAUSE.fullmatch(clause)
        if not m:
            raise ValueError(f"not a version range: {a!r} / {b!r}")
        op, bound = m.group(1), version_key(m.group(2))
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
    return low[0] < high[0] or (low[0] == high[0] and low[1] and high[1])
