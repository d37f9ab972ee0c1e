"""The building blocks (model/components/): each component's refusals live in its block alone,
so the resolver composes them and cannot hold a second, drifting copy of a component's rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import resolved

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = ROOT / "envbuilder" / "model" / "components"
# the resolver's modules: none spells a block's refusal codes
RESOLVER = ("resolve.py", "stages.py", "selection.py", "sizing.py", "rules.py", "assemble.py")


def codes(text: str) -> set[str]:
    """The rule codes a module spells as the first argument of a refusal."""
    return set(re.findall(r'(?:Refusal|add)\(\s*"([a-z0-9-]+)"', text))


@pytest.mark.parametrize(
    "block, prefix",
    [
        ("vllm", "vllm-"),
        ("sglang", "sglang"),
        ("apex", "apex-"),
        ("flash_attn", "flash-attn-"),
        ("registry", "nvcc-arch"),
        ("registry", "attention"),
        ("torch", "torch-"),
        ("torch", "arch"),
        ("cuda", "driver"),
        ("cuda", "image-python"),
        ("verl", "verl-"),
        ("verl", "rollout"),
        ("verl", "training-path"),
    ],
)
def test_a_components_refusals_are_spelled_in_its_block_alone(block, prefix):
    mine = {c for c in codes((BLOCKS / f"{block}.py").read_text()) if c.startswith(prefix)}
    assert mine, block
    for module in RESOLVER:  # (the resolver's path: entry points, stages, rules, assembly)
        resolver = (ROOT / "envbuilder" / "model" / module).read_text()
        elsewhere = {c for c in codes(resolver) if c.startswith(prefix)}
        assert elsewhere == set(), f"{module} spells {sorted(elsewhere)}: that is the {block} block's to say"


def test_the_resolver_takes_the_blocks_refusals_as_they_are_given():
    """The vLLM block's refusals reach the user as the resolver's own: code, hardness and fix.
    vLLM below its card floor is soft (the block keeps the resolver's default); an ABI mismatch
    is hard."""
    from envbuilder.model.components import Refusal
    from envbuilder.model.resolve import ResolveError

    assert Refusal("x", "w", "y", "f").hard is False
    with pytest.raises(ResolveError) as e:
        resolved("h200", vllm="0.8.5")
    got = {v.rule: v.hard for v in e.value.violations}
    assert got == {"vllm-torch": True, "verl-vllm": True, "vllm-cuda": True}
    assert "Fix: use --vllm 0.24.0" in str(e.value)
    with pytest.raises(ResolveError) as e:
        resolved("p40", rollout="vllm")
    assert {v.rule: v.hard for v in e.value.violations}["vllm-cc"] is False
