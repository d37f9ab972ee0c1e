"""The optional compiled components are one registry (model/components/registry.py): each
registered one has the Component protocol's members, and --with/--without (their check, help
and completion), the resolver, the grid and the SBOM take the names from REGISTRY, so a
component added there shows up in each of them; a refusal is one type, components.Refusal."""

from __future__ import annotations

import inspect

import pytest

from conftest import resolved, shipped
from envbuilder.model.components import Refusal
from envbuilder.model.components import registry as C

PROTOCOL = [
    n
    for n, v in vars(C.Component).items()
    if not n.startswith("_") and (callable(v) or isinstance(v, property))
]


class Extra(C.Apex):
    """A component added in a test: apex's matrix section and build, under another name."""

    name = "extra-ops"

    def source(self, env, key, ref):
        return C.Source(self.name, "1.0", "github", "someone") if key == self.name else None


@pytest.fixture
def extra(monkeypatch):
    monkeypatch.setattr(C, "REGISTRY", (*C.REGISTRY, Extra()))
    return "extra-ops"


def test_the_protocol_names_what_the_issue_asks_of_a_component():
    want = {"name", "section", "problems", "record", "part", "build_argv", "build_shell", "modules"}
    assert want <= set(PROTOCOL)


@pytest.mark.parametrize("c", C.REGISTRY, ids=lambda c: c.name)
def test_every_registered_component_satisfies_the_protocol(c):
    m = shipped()
    for member in PROTOCOL:
        assert hasattr(c, member), f"{c.name} lacks {member}"
        theirs = getattr(C.Component, member)
        if callable(theirs):
            got = inspect.signature(getattr(c, member))
            assert list(got.parameters) == list(inspect.signature(theirs).parameters)[1:], (c.name, member)
    assert isinstance(c.name, str) and isinstance(c.section, str)
    assert m.sections.get(c.section), f"{c.name}: the matrix has no section {c.section}"
    assert c.modules(m) and all(isinstance(x, str) for x in c.modules(m))
    newest = c.newest(m, "2.11.0")
    assert newest is None or newest in m.sections[c.section]["versions"]
    assert C.by_name(c.name) is c


def test_the_registry_is_in_the_training_paths_order_and_its_names_are_the_matrixs():
    from envbuilder.model import matrix

    assert [c.name for c in C.REGISTRY] == ["flash-attn", "apex"]
    assert C.names() == ["apex", "flash-attn"] == sorted(matrix.COMPONENTS)  # (matrix.py is below it)


def test_with_and_without_take_their_names_from_the_registry(extra):
    from envbuilder.errors import UserError
    from envbuilder.model import fixes
    from envbuilder.model.flags import BY_FIELD

    assert "apex, flash-attn" in BY_FIELD["with_"].help and "apex, flash-attn" in BY_FIELD["without"].help
    m = shipped()
    assert fixes._valid(m, "with", f"apex,{extra}") and fixes._valid(m, "without", extra)
    assert not fixes._valid(m, "with", "apexx")
    got = C.select(m, {}, {}, (extra,), (), "2.11.0")
    assert got == {extra: C.Apex().newest(m, "2.11.0")}
    with pytest.raises(UserError, match=f"components are apex, {extra}, flash-attn"):
        C.select(m, {}, {}, ("nope",), (), "2.11.0")
    with pytest.raises(UserError, match="did you mean 'apex'"):
        C.select(m, {}, {}, (), ("apx",), "2.11.0")


def test_completion_takes_the_names_from_the_registry(extra):
    from envbuilder.cli.complete import from_matrix

    got = [i.value for i in from_matrix("components")(None, None, "")]
    assert got == ["apex", extra, "flash-attn"]


def test_the_grid_has_a_column_per_registered_component(extra):
    from envbuilder.render.grid import columns

    cols = columns(shipped())
    assert [c.label for c in cols[-3:]] == ["flash-attn", "apex", extra]
    assert cols[-1].flags == (("with", extra),)


def test_the_sbom_takes_the_source_files_of_the_registered_components(extra):
    from envbuilder.lock.documents import SourcePin
    from envbuilder.lock.sbom import source_components

    env = resolved("h100")
    pins = {extra: SourcePin(url="https://github.com/someone/extra.tar.gz", sha256="0" * 64)}
    (got,) = source_components(env, pins)
    assert (got["name"], got["version"], got["purl"]) == (extra, "1.0", "pkg:github/someone/extra-ops@1.0")
    assert source_components(env, {"unknown": pins[extra]}) == []


def test_a_refusal_is_one_type():
    import envbuilder.model.components.flash_attn as FA
    from envbuilder.model.components import apex as APEX

    assert not hasattr(FA, "Problem")
    m = shipped()
    apex = m.typed.apex
    assert apex is not None
    refused = APEX.nvcc_problem({**apex, "nvcc_must_match_torch_cuda": True}, "12.8", "13.0")
    assert isinstance(refused, Refusal) and refused.code == "apex-nvcc" and refused.hard
    fa = m.typed.flash_attn
    assert fa is not None
    version = max(fa["versions"])
    choice = FA.Choice(FA.SOURCE, None, None, "test")
    found = FA.problems(fa, version, torch_v="1.0.0", cc="6.0", gpu="P40", choice=choice)
    assert found and all(isinstance(x, Refusal) for x in found)
    assert {type(x) for x in found} == {Refusal}
