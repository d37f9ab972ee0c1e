"""Release-version ordering and ranges for the versions the matrix holds (2.6.0, 0.8.5.post1,
2.9.0rc1, 570.26, 24.04.01), PEP 440's rules for release, pre-, post- and dev segments; and the
one NVIDIA driver version pattern (the schema, --driver and detect use it).

Own code rather than `packaging`: importing packaging.specifiers costs more than a whole render.
"""

from __future__ import annotations

import re

# what the matrix schema accepts as a version, and exactly what version_key orders (which also
# takes a local suffix, +cu118, as pip's pins carry it)
VERSION_PATTERN = r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.?post(\d+))?(?:\.?dev(\d+))?"
DRIVER_PATTERN = r"\d+\.\d+(?:\.\d+)?"  # 550.54.14, 570.26

_VERSION = re.compile(VERSION_PATTERN + r"(?:\+[\w.]+)?")
_CLAUSE = re.compile(r"\s*(~=|==|!=|>=|<=|>|<)\s*([\w.+]+?)(\.\*)?\s*")
_ARBITRARY = re.compile(r"\s*===\s*(\S+)\s*")
_PRE = {"a": 0, "b": 1, "rc": 2}


def is_driver_version(text: object) -> bool:
    return isinstance(text, str) and re.fullmatch(DRIVER_PATTERN, text) is not None


# version_key and in_range of the matrix's few hundred versions, each computed once (a grid or a
# fix walk asks them tens of thousands of times); bounded, so odd input cannot grow them
_KEYS: dict[str, tuple[int, ...]] = {}
_RANGES: dict[tuple[str, str], bool] = {}
_MAX_CACHED = 4096


def version_key(text: str) -> tuple[int, ...]:
    """A sort key, PEP 440's order: X.devN < XaN < XbN < XrcN < X < X.postN; the release
    numbers zero-padded. Raises ValueError (naming the text) for anything else."""
    plain = str(text).strip()
    key = _KEYS.get(plain)
    if key is None:
        key = _version_key(text, plain)
        if len(_KEYS) < _MAX_CACHED:
            _KEYS[plain] = key
    return key


def _version_key(text: object, plain: str) -> tuple[int, ...]:
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


def _is_post_of(version: tuple[int, ...], base: tuple[int, ...]) -> bool:
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
    """PEP 440's rules as pip applies them with pre-releases allowed (packaging's
    SpecifierSet(spec).contains(version, prereleases=True); tests/test_versions.py holds the two
    to agree): `<V` takes no pre-release of V itself, `>V` no post-release or local build of V,
    `==V`/`!=V` ignore a local label V lacks, `~=V` is `>=V` within V's series, `===` compares
    text. Raises ValueError for anything it does not read (an epoch, a malformed clause)."""
    v = version_key(version)
    result = True  # (every clause read, so an unreadable one raises wherever it stands)
    for op, text, prefix in _read(spec):
        if op == "===":
            result = result and version.strip().lower() == text.lower()
            continue
        if prefix:  # a prefix match, PEP 440's `==5.0.*` / `!=5.0.*`
            if op not in ("==", "!=") or "+" in text:
                raise ValueError(f"not a version range: {spec!r}")
            result = result and _has_prefix(version, text) == (op == "==")
            continue
        bound = version_key(text)
        if "+" in text and op not in ("==", "!="):
            raise ValueError(f"not a version range: {spec!r}")  # (a local label only with ==/!=)
        if op == "~=":
            parts = _series(text.split("+")[0], spec)
            result = result and v >= bound and _has_prefix(version, ".".join(parts[:-1]))
            continue
        same = v == bound and (_local(text) is None or _local(text) == _local(version))
        ok = {
            "==": same,
            "!=": not same,
            ">=": v >= bound,
            "<=": v <= bound,
            "<": v < bound and not _is_pre_of(v, bound),
            ">": v > bound and not _is_post_of(v, bound),
        }[op]
        result = result and ok
    return result


def _read(spec: str, shown: str | None = None) -> list[tuple[str, str, bool]]:
    """The clauses of `spec` as (op, version text, prefix match `.*`); `===`'s text as it is.
    The one reader of a clause's grammar; ValueError (naming `shown`, else `spec`) otherwise."""
    out = []
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        arbitrary = _ARBITRARY.fullmatch(clause)
        if arbitrary:
            out.append(("===", arbitrary.group(1), False))
            continue
        m = _CLAUSE.fullmatch(clause)
        if not m:
            raise ValueError(f"not a version range: {shown or spec!r}")
        out.append((m.group(1), m.group(2), bool(m.group(3))))
    return out


def _series(text: str, spec: str) -> list[str]:
    """`~=V`'s release segments (two at least: `~=1` means nothing), as text."""
    series = re.match(r"\d+(?:\.\d+)*", text)
    parts = series.group(0).split(".") if series else []
    if len(parts) < 2:
        raise ValueError(f"not a version range: {spec!r}")
    return parts


def _local(text: str) -> str | None:
    """A version's local label, lower-cased with its separators as dots (1.0+CU_118 -> cu.118)."""
    _, plus, local = text.strip().partition("+")
    return re.sub(r"[-_]", ".", local.lower()) if plus else None


def _is_pre_of(version: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    """`<bound` is `<bound.dev0` unless bound is a pre- or dev release: it excludes the pre- and
    dev releases of a final bound's release, and the dev releases of a post-release bound."""
    if bound[8:10] != (3, 0) or bound[11] != 1 << 62:
        return False
    dev = version[11] != 1 << 62
    if bound[10] >= 0:  # a post-release: only its own dev releases
        return dev and version[:11] == bound[:11]
    return (version[8:10] != (3, 0) or dev) and version[:8] == bound[:8]


def same_range(a: str, b: str) -> bool:
    """The same specifier set whatever its order and spelling (">=0.8.5,<=0.11.0" and
    "<=0.11.0, >=0.8.5"; 1.0 and 1.0.0); text compared where a clause is not read."""
    try:
        return _clause_set(a) == _clause_set(b)
    except ValueError:
        return a.replace(" ", "") == b.replace(" ", "")


def _clause_set(spec: str) -> frozenset[tuple[object, ...]]:
    out: set[tuple[object, ...]] = set()
    for op, text, prefix in _read(spec):
        if op == "===":
            out.add(("===", text.lower()))
        elif prefix:
            out.add((op, "*", tuple(int(p) for p in text.split("."))))
        else:
            out.add((op, version_key(text), _local(text)))
    return frozenset(out)


def satisfies(version: str, spec: str) -> bool:
    """in_range for requirement strings read from elsewhere (PyPI's metadata): a version or
    range this module does not read is no evidence of a conflict (True)."""
    try:
        return in_range(version, spec)
    except ValueError:
        return True


def _has_prefix(version: str, prefix: str) -> bool:
    """`version`'s release segments begin with `prefix`'s (5.0.2 with 5.0; 5.10 not with 5.1)."""
    head = tuple(int(p) for p in prefix.split("."))
    return version_key(version)[: len(head)] == head


def _clauses(op: str, text: str, prefix: bool, spec: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """One clause as (op, key) pairs: `==5.0.*` is >=5.0 and <5.1; `!=5.0.*` gives none (it
    excludes one series, never a whole interval)."""
    if op == "===":
        return (("==", version_key(text)),)
    if op == "~=" and not prefix:
        parts = _series(text, spec)
        upper = ".".join(parts[:-2] + [str(int(parts[-2]) + 1)])
        return ((">=", version_key(text)), ("<", version_key(upper)))
    if not prefix:
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
    low: tuple[tuple[int, ...], bool] | None = None  # (key, inclusive)
    high: tuple[tuple[int, ...], bool] | None = None
    shown = f"{a} / {b}"
    for clause in _read(f"{a},{b}", shown):
        for op, bound in _clauses(*clause, shown):
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
