"""The CI-only tiers' one rule (conftest.unavailable): a test that lacks what it needs skips saying
why, except under CI=true, where it fails; and no test file spells that rule a second time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import TESTS, need, unavailable


def test_a_missing_need_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no widget"):
        unavailable("no widget")
    need(True, "never said")


def test_a_missing_need_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true.*no widget"):
        need(False, "no widget")


def test_only_conftest_reads_ci():
    reads = re.compile(r"""environ(\.get\(|\[)\s*["']CI["']""")
    readers = sorted(p.name for p in Path(TESTS).rglob("*.py") if reads.search(p.read_text(encoding="utf-8")))
    assert readers == ["conftest.py"], f"CI=true's rule spelled outside tests/conftest.py: {readers}"
