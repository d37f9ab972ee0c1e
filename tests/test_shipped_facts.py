"""The shipped matrix's own facts: every profile resolves as shipped, without warnings, within its
verl's torch floor, into an environment of the kinds `render --from` checks. The resolver's rules
are tested on the frozen fixture matrix (tests/test_resolve.py, tests/fixtures/matrix); a matrix
update changes these tests and the goldens only."""

from __future__ import annotations

import json

import pytest

from conftest import PROFILES, resolved, shipped
from envbuilder import matrix as M
from test_resolve import resolved_variants


@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_resolves_without_warnings(profile):
    assert resolved(profile).to_dict()["warnings"] == []


@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_meets_its_verls_torch_floor(profile):
    d = resolved(profile).to_dict()
    assert M.in_range(d["torch"]["version"], shipped().verl[d["verl"]["version"]]["torch"])


def test_every_shipped_environment_is_of_the_kinds_render_from_checks():
    from envbuilder import schema as S
    from envbuilder.matrix_schema import RESOLVED

    for label, env in resolved_variants(shipped()):
        S.check(json.loads(env.to_json()), RESOLVED, f"{label}: ")


def test_the_frozen_matrix_is_a_real_matrix_of_its_own():
    """The fixture loads and validates like the shipped one and names the profiles the rule
    tests use; it is a copy of a day's matrix, not a link to it."""
    from conftest import FROZEN, frozen

    assert not FROZEN.is_symlink() and (FROZEN / "profiles.yaml").is_file()
    assert {"p40", "4090", "t4", "v100", "3090", "h200"} <= set(frozen().profiles)


# flash-attn's published wheels, as each tag's .github/workflows/publish.yml builds them
# (torch-version, python-version and cuda-version of its matrix; read 2026-12-03)
PUBLISHED = {
    "2.5.8": (["2.1.2", "2.2.2", "2.3.0"], ["3.8", "3.9", "3.10", "3.11"], ["11", "12"]),
    "2.6.3": (["2.2.2", "2.3.1", "2.4.0"], ["3.8", "3.9", "3.10", "3.11", "3.12"], ["11", "12"]),
    "2.7.4.post1": (["2.2.2", "2.3.1", "2.4.0", "2.5.1", "2.6.0"], ["3.9", "3.10", "3.11", "3.12", "3.13"], ["12"]),
    "2.8.3": (["2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0"], ["3.9", "3.10", "3.11", "3.12", "3.13"], ["12"]),
}
NOT_PUBLISHED = {"2.5.8": "2.4.0", "2.6.3": "2.5.1", "2.7.4.post1": "2.7.1", "2.8.3": "2.9.1"}


@pytest.mark.parametrize("version", list(PUBLISHED))
def test_flash_attn_wheel_facts_match_what_each_release_published(version):
    from envbuilder.resolve import flash_attn_wheel_gap

    rec = shipped().flash_attn["versions"][version]
    torches, pythons, cudas = PUBLISHED[version]
    assert sorted(rec["wheel_cuda"]) == cudas and rec["wheel_python"] == pythons
    for torch in torches:
        assert flash_attn_wheel_gap(rec, torch, f"{cudas[-1]}.4", pythons[0]) is None, torch
    assert "torch" in flash_attn_wheel_gap(rec, NOT_PUBLISHED[version], f"{cudas[-1]}.4", pythons[0])


def test_every_shipped_flash_attn_profile_has_a_prebuilt_wheel():
    for name in PROFILES:
        env = resolved(name)
        if env.flash_attn:
            assert not any("flash-attn" in n for n in env.notes), name
