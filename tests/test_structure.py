"""The package's layout keeps its shape (bench/structure.py reads it from the source): the
layers import each other in one direction only, no module takes another's private names, no
module of the command line is over 150 lines, and records are of one style (issue 22)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import structure  # noqa: E402


def test_no_circles_between_modules():
    assert structure.facts()["cycles"] == []


def test_no_module_takes_another_modules_private_names():
    assert structure.facts()["private_imports"] == []


def test_nothing_below_the_command_line_imports_it():
    assert structure.facts()["cli_imported_below"] == []


def test_the_facts_can_fail(tmp_path, monkeypatch):
    """A planted circle and a planted private import are found (the check is not vacuous)."""
    pkg = tmp_path / "envbuilder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from envbuilder.b import _secret\n")
    (pkg / "b.py").write_text("from envbuilder import a\n_secret = 1\n")
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    f = structure.facts()
    assert f["cycles"] == [["envbuilder.a", "envbuilder.b"]]
    assert f["private_imports"] == ["envbuilder.a:1 takes envbuilder.b._secret"]


def test_no_command_line_module_is_over_150_lines():
    """Each command only parses, calls one library function and formats (issue 22)."""
    assert structure.CLI_MAX_LINES == 150
    assert structure.facts()["long_cli_modules"] == []


def test_a_long_command_line_module_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "envbuilder"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "long.py").write_text("x = 1\n" * 151)
    (pkg / "cli" / "short.py").write_text("x = 1\n" * 150)
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    assert structure.facts()["long_cli_modules"] == ["envbuilder.cli.long: 151 lines"]


def test_every_record_is_a_record():
    """No NamedTuple, and a dataclass only for a mutable working object that says why (issue 22:
    one record style, model/record.Record)."""
    assert structure.facts()["other_records"] == []


def test_a_record_of_another_style_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "envbuilder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "import collections, dataclasses, typing\n"
        "from typing import NamedTuple\n"
        "class A(NamedTuple):\n    x: int\n"
        "class B(typing.NamedTuple):\n    x: int\n"
        "C = collections.namedtuple('C', 'x')\n"
        "@dataclasses.dataclass(frozen=True)\nclass D:\n    x: int\n"
        "@dataclasses.dataclass  # not a record: appended to as it runs\nclass E:\n    x: list\n"
        "class F:  # not a record: filled in as it runs\n    x: list\n"
    )
    (pkg / "b.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass G:  # not a record: counts as it goes\n    n: int\n"
    )
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    assert structure.facts()["other_records"] == [
        "envbuilder.a:3 A is a NamedTuple",
        "envbuilder.a:5 B is a NamedTuple",
        "envbuilder.a:7 namedtuple()",
        "envbuilder.a:9 D is a dataclass without '# not a record:'",
    ]
