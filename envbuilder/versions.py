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
