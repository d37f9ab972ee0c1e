"""Names people type: a profile's key in any case, a marketed name and the name nvidia-smi
prints all name a profile, and a card of its own size (issue 34, item 5)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import shipped
from envbuilder.cli import cli
from envbuilder.errors import UserError
from envbuilder.model.names import profile_named
from envbuilder.model.resolve import resolve


@pytest.mark.parametrize(
    "typed, profile, card",
    [
        ("h100", "h100", None),
        ("H100", "h100", None),
        ("RTX-PRO-6000", "rtx-pro-6000", None),
        ("B200", "b200", None),
        ("A100", "a100", None),
        ("RTX 4090", "4090", None),
        ("NVIDIA GeForce RTX 5090", "5090", None),
        ("NVIDIA H100 80GB HBM3", "h100", None),
        ("A100-SXM4-40GB", "a100", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100", "a100-40gb-pcie"),
        ("Tesla V100-SXM2-16GB", "v100", "v100-16gb"),
        ("H100 NVL", "h100", "h100-nvl"),
        ("NVIDIA L4", "4090", "l4"),
    ],
)
def test_a_typed_name_names_a_profile_and_a_card(typed, profile, card):
    named = profile_named(shipped(), typed)
    assert named is not None and (named.profile, named.gpu) == (profile, card)


def test_a_card_named_is_planned_at_its_own_size():
    m = shipped()
    env = resolve(m, "H100 NVL")
    assert env.profile == "h100" and env.memory["card"]["mib"] == 95830
    assert env.card == "h100-nvl"  # (the rendered README's command replays it by its name)
    assert any("H100 NVL" in n and "memory" in n for n in env.notes)
    assert resolve(m, "H100").memory["card"]["mib"] == 81559


def test_an_explicit_gpu_memory_wins_over_the_named_card():
    assert resolve(shipped(), "A100-SXM4-40GB", _ov(gpu_memory=81920)).memory["card"]["mib"] == 81920


def _ov(**kw):
    from envbuilder.model.resolve import Overrides

    return Overrides(**kw)


@pytest.mark.parametrize("typed, close", [("H10", "'h100'"), ("P4O", "'p40'"), ("b2OO", "'b200'")])
def test_an_unknown_name_is_matched_without_case(typed, close):
    with pytest.raises(UserError, match=f"did you mean {close}"):
        resolve(shipped(), typed)


def test_check_H100_is_h100_not_v100():
    r = CliRunner().invoke(cli, ["check", "H100"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("OK: h100 resolves") and "v100" not in r.output


def test_check_says_which_card_a_name_was_taken_for():
    r = CliRunner().invoke(cli, ["check", "A100-SXM4-40GB", "--algo", "grpo"])
    assert r.exit_code == 0, r.output
    assert (
        r.output.startswith("OK: a100-40gb resolves on profile a100's stack")
        and "planned for the NVIDIA A100-SXM4-40GB's own memory" in r.output
    )


def test_an_unknown_card_is_offered_the_nearest_cards_profile_not_the_nearest_key():
    """'RTX 3070' (no card of the matrix) is closest to the RTX 3090 of the cards' names, not
    to the key rtx-pro-6000. (The RTX 3080 is a card of its own now: tests/test_cards.py.)"""
    with pytest.raises(UserError) as e:
        resolve(shipped(), "RTX 3070")
    assert "did you mean 'RTX 3090' (profile 3090)?" in str(e.value)
    assert "rtx-pro-6000?" not in str(e.value)


def test_a_card_the_grid_knows_without_a_profile_is_named_as_such():
    """The Tesla P100 is a card of the matrix (a grid row), which no profile's build runs on: the
    refusal says so and where to look, not 'did you mean a100'."""
    with pytest.raises(UserError) as e:
        resolve(shipped(), "Tesla P100")
    said = str(e.value)
    assert "'Tesla P100' is the Tesla P100 (CC 6.0)" in said
    assert "`envbuild grid --gpu p100`" in said
    assert "did you mean" not in said
