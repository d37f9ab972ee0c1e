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
