"""The package's layout keeps its shape (bench/structure.py reads it from the source): the
layers import each other in one direction only, no module takes another's private names, no
module of the command line is over 150 lines, and records are of one style (issue 22)."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import structure  # noqa: E402


def test_every_package_is_ranked_and_imports_only_below_it():
    """Issue 35: the packages' ranks are declared once (structure.RANKS) and no import (at module
    level, inside a function or under TYPE_CHECKING) reaches a package ranked at or above its own."""
    f = structure.facts()
    assert f["unranked"] == []
    assert f["against_rank"] == []
    assert f["package_cycles"] == []


def test_no_module_reaches_through_an_attribute_for_another_modules_private_names():
    assert structure.facts()["private_attributes"] == []


@pytest.fixture(scope="session")
def package_copy(tmp_path_factory):
    """One copy of envbuilder/ for the whole session (not one per test): each test that plants
    an import appends it to one file of this copy, and `plant` puts that file back after."""
    root = tmp_path_factory.mktemp("structure")
    shutil.copytree(structure.PKG, root / "envbuilder", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def plant(package_copy, monkeypatch):
    """plant("render/quoting.py", text): the facts read the session's copy of the package with
    `text` appended to that file; the file holds its own bytes again after the test."""
    monkeypatch.setattr(structure, "ROOT", package_copy)
    monkeypatch.setattr(structure, "PKG", package_copy / "envbuilder")
    originals: dict = {}

    def append(relative: str, text: str) -> None:
        target = package_copy / "envbuilder" / relative
        originals.setdefault(target, target.read_bytes())
        target.write_text(target.read_text() + "\n" + text)

    yield append
    for target, data in originals.items():
        target.write_bytes(data)


@pytest.mark.parametrize(
    "planted",
    [
        "from envbuilder.machine import reach\n",
        "def later():\n    from envbuilder.machine import reach  # noqa\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import envbuilder.machine.reach\n",
    ],
    ids=["module-level", "in-a-function", "under-TYPE_CHECKING"],
)
def test_a_planted_import_against_the_rank_fails(plant, planted):
    """render/quoting.py importing machine/ (ranked above render) is found, however it is spelled."""
    before = structure.facts()["against_rank"]
    plant("render/quoting.py", planted)
    f = structure.facts()
    found = [a for a in f["against_rank"] if a not in before]
    assert len(found) == 1
    assert found[0].startswith("envbuilder.render.quoting:")
    assert "-> envbuilder.machine.reach (render imports machine, ranked 9 against its 4)" in found[0]
    assert any({"machine", "render"} <= set(c) for c in f["package_cycles"])
    assert structure.main() == 1


def test_two_packages_importing_each_other_fail(tmp_path, monkeypatch):
    pkg = tmp_path / "envbuilder"
    for sub in ("model", "render"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "a.py").write_text("from envbuilder.render import b\n")
    (pkg / "render" / "b.py").write_text("x = 1\n")
    (pkg / "render" / "c.py").write_text("from envbuilder.model import a\n")
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    f = structure.facts()
    assert f["cycles"] == []  # no circle between modules: only the packages go round
    assert f["package_cycles"] == [["model", "render"]]
    assert f["against_rank"] == [
        "envbuilder.model.a:1 -> envbuilder.render.b (model imports render, ranked 4 against its 3)"
    ]


def test_an_unranked_package_fails(tmp_path, monkeypatch):
    pkg = tmp_path / "envbuilder"
    (pkg / "extra").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "extra" / "__init__.py").write_text("")
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    assert structure.facts()["unranked"] == ["extra"]


def test_a_private_name_reached_through_a_module_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "envbuilder"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    (pkg / "model" / "matrix.py").write_text("def _load():\n    pass\n")
    (pkg / "a.py").write_text(
        "from envbuilder.model import matrix\nimport envbuilder.model.matrix as m\n"
        "import envbuilder.model.matrix\n"
        "matrix._load()\nm._load\nenvbuilder.model.matrix._load\nmatrix.__name__\n"
    )
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    assert structure.facts()["private_attributes"] == [
        "envbuilder.a:4 reaches envbuilder.model.matrix._load",
        "envbuilder.a:5 reaches envbuilder.model.matrix._load",
        "envbuilder.a:6 reaches envbuilder.model.matrix._load",
    ]


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


def test_a_circle_through_a_modules_own_package_is_found(plant):
    """Issue 46: the check skipped a module's imports of its own parent package, so the circle
    lock/__init__ -> lockfile -> conda -> pip -> lock (pip took target_glibc from the package)
    went unseen. A planted one is found now: the package's __init__ imports its module, which
    takes a name back from the package."""
    plant("render/__init__.py", "from envbuilder.render import quoting\nPLANTED = 1\n")
    plant("render/quoting.py", "def later():\n    from envbuilder.render import PLANTED  # noqa\n")
    assert ["envbuilder.render", "envbuilder.render.quoting"] in structure.facts()["cycles"]


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
    one record style, envbuilder/record.Record)."""
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


@pytest.mark.parametrize(
    "planted",
    ["from envbuilder.text import shorten\n", "from . import preflight\n", "import envbuilder.images\n"],
    ids=["top-level-module", "a-sibling-script", "its-own-package"],
)
def test_an_image_script_importing_envbuilder_fails(plant, planted):
    """envbuilder/images/ is copied into an image alone: an import of anything of envbuilder
    there, a sibling script or its own package included, would fail in the image."""
    assert structure.facts()["standalone_imports"] == []
    plant("images/audit_precision.py", planted)
    found = structure.facts()["standalone_imports"]
    assert len(found) == 1 and found[0].startswith("envbuilder.images.audit_precision:"), found
    assert structure.main() == 1


def test_the_model_and_the_renderers_do_no_io():
    """No network client, process, thread pool or Hydra in model/ or render/ (mirror probes are
    oci/probe.py's, the hub's config.json oci/hub.py's, verl's composed config machine/compose.py's)."""
    assert structure.facts()["io_in_pure"] == []


@pytest.mark.parametrize(
    "planted",
    ["import subprocess\n", "def f():\n    from concurrent.futures import ThreadPoolExecutor  # noqa\n"],
)
def test_io_planted_in_the_model_is_found(plant, planted):
    plant("model/versions.py", planted)
    found = structure.facts()["io_in_pure"]
    assert len(found) == 1 and found[0].startswith("envbuilder.model.versions:"), found
    assert structure.main() == 1


def test_each_file_is_parsed_once_however_often_the_facts_are_read(tmp_path, monkeypatch):
    """The tests read the facts ~30 times: a text is parsed the first time it is met only (two
    files of the same text, once), and each check reads that one parse."""
    pkg = tmp_path / "envbuilder"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from envbuilder.b import _secret\nimport collections\nT = collections.namedtuple('T', 'x')\n"
    )
    (pkg / "b.py").write_text("from envbuilder import a\n_secret = a._hidden\n")
    (pkg / "cli" / "long.py").write_text("x = 1\n" * 151)
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    parsed = []
    real_parse = structure.ast.parse
    monkeypatch.setattr(structure, "_SEEN", {})
    monkeypatch.setattr(structure.ast, "parse", lambda text, *a, **k: parsed.append(text) or real_parse(text))
    first = structure.facts()
    assert sorted(parsed) == sorted({p.read_text() for p in pkg.rglob("*.py")})
    assert first["private_imports"] and first["private_attributes"] and first["cycles"]
    assert first["other_records"] and first["long_cli_modules"]
    parsed.clear()
    assert structure.facts() == first
    assert parsed == []


def test_a_file_changed_between_two_readings_is_read_again(tmp_path, monkeypatch):
    """The facts come from the files' text now, not from what an earlier reading parsed."""
    pkg = tmp_path / "envbuilder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "b.py").write_text("x = 1\n")
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "PKG", pkg)
    assert structure.facts()["private_imports"] == []
    (pkg / "a.py").write_text("from envbuilder.b import _secret\n")
    assert structure.facts()["private_imports"] == ["envbuilder.a:1 takes envbuilder.b._secret"]


def _branchy(name: str, branches: int) -> str:
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(branches))
    return f"def {name}(x):\n{body}    return -1\n"


def test_a_function_above_complexity_30_needs_a_written_reason(plant):
    """Issue 46: no function above radon's rank D (McCabe 30) without a `# complexity:` comment
    right above it; the count is radon's (31 branches: 32), and each shipped exception says why."""
    assert structure.facts()["complex_functions"] == []
    assert structure.complexity(ast.parse(_branchy("f", 31)).body[0]) == 32
    plant("render/quoting.py", _branchy("planted_complex", 31))
    found = structure.facts()["complex_functions"]
    assert len(found) == 1 and "planted_complex: 32" in found[0]
    assert structure.main() == 1
    plant(
        "render/quoting.py", "# complexity: a planted table, one branch a row\n" + _branchy("explained", 31)
    )
    assert [c for c in structure.facts()["complex_functions"] if "explained" in c] == []
    plant("render/quoting.py", _branchy("simple_enough", 29))
    assert not any("simple_enough" in c for c in structure.facts()["complex_functions"])
