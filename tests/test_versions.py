"""model/versions.py is envbuild's one version-range engine: the matrix's ranges (resolve,
fixes, the schema) and PyPI's requirement strings (`envbuild refresh`) are both read by it, so
the two cannot drift apart. packaging (pip's own rules) is the oracle here, never a second engine
in the code: every generated version and specifier is judged by both, and they must agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from envbuilder.model.versions import in_range, ranges_overlap, same_range, satisfies

num = st.integers(0, 3)
release = st.lists(num, min_size=1, max_size=3).map(lambda p: ".".join(map(str, p)))
pre = st.one_of(st.just(""), st.tuples(st.sampled_from(["a", "b", "rc"]), num).map(lambda t: f"{t[0]}{t[1]}"))
post = st.one_of(st.just(""), num.map(lambda n: f".post{n}"))
dev = st.one_of(st.just(""), num.map(lambda n: f".dev{n}"))
local = st.one_of(st.just(""), st.sampled_from(["+cu118", "+cu121", "+cpu"]))
public = st.tuples(release, pre, post, dev).map("".join)
version = st.tuples(public, local).map("".join)


@st.composite
def clause(draw) -> str:
    kind = draw(st.sampled_from(["cmp", "cmp", "cmp", "prefix", "compatible", "local", "arbitrary"]))
    if kind == "prefix":
        return f"{draw(st.sampled_from(['==', '!=']))}{draw(release)}.*"
    if kind == "compatible":
        return f"~={draw(release)}{draw(pre)}{draw(post)}"
    if kind == "local":
        return f"{draw(st.sampled_from(['==', '!=']))}{draw(version)}"
    if kind == "arbitrary":
        return f"==={draw(version)}"
    return f"{draw(st.sampled_from(['==', '!=', '>=', '<=', '>', '<']))}{draw(public)}"


spec = st.lists(clause(), min_size=1, max_size=3).map(",".join)


@settings(max_examples=1000, deadline=None)
@given(version, spec)
def test_every_range_is_judged_as_pip_judges_it(v, s):
    try:
        oracle = SpecifierSet(s)
    except InvalidSpecifier:
        with pytest.raises(ValueError):
            in_range(v, s)
        return
    assert in_range(v, s) == oracle.contains(v, prereleases=True), (v, s)


@settings(max_examples=400, deadline=None)
@given(spec, spec)
def test_one_range_spelled_twice_is_one_range(a, b):
    try:
        same = SpecifierSet(a) == SpecifierSet(b)
    except InvalidSpecifier:
        return
    if same:
        assert same_range(a, b) and same_range(b, a)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([">=", "<=", ">", "<", "==", "~="]), public), min_size=1, max_size=4),
    version,
)
def test_two_ranges_that_a_version_satisfies_overlap(clauses, v):
    """ranges_overlap never says 'no version fits both' of two ranges one version satisfies."""
    texts = [f"{op}{x}" for op, x in clauses]
    try:
        SpecifierSet(",".join(texts))
    except InvalidSpecifier:
        return
    half = len(texts) // 2
    a, b = ",".join(texts[:half]), ",".join(texts[half:])
    if in_range(v, ",".join(texts)):
        assert ranges_overlap(a, b), (a, b, v)


@pytest.mark.parametrize(
    "v, s, want",
    [
        ("2.0rc1", "<2.0", False),  # <V takes no pre-release of V itself
        ("2.0rc1", "<2.0rc2", True),
        ("1.0.post1", ">1.0", False),  # >V no post-release of V
        ("1.0+cu118", ">1.0", False),  # ... nor a local build of V
        ("1.0+cu118", "==1.0", True),  # ==V ignores a local label V lacks
        ("1.0+cu118", "==1.0+cu121", False),
        ("1.4.5", "~=1.4.2", True),
        ("1.5.0", "~=1.4.2", False),
        ("5.10", "==5.1.*", False),
        ("1.0", "===1.0", True),
        ("1.0.0", "===1.0", False),
    ],
)
def test_the_rules_pip_applies_are_the_rules_envbuild_applies(v, s, want):
    assert in_range(v, s) is want
    assert SpecifierSet(s).contains(v, prereleases=True) is want


def test_refresh_reads_pypis_requirements_with_the_same_engine():
    from envbuilder.upstream import refresh

    assert refresh.satisfies is satisfies and refresh.same_range is same_range
    assert satisfies("1!2.0", ">=1.0")  # an epoch is not read: no evidence of a conflict
