"""Every fix a refusal suggests works: a walk over a grid of overrides (GPU x CUDA x torch x
rollout x verl x vLLM) on the shipped matrix applies each suggested fix, as a user would type it
after their own flags, and the profile must then resolve. A fix that leads to a new refusal is
the trap a new user falls into ("--torch 2.9.1" for a P40 on CUDA 13.0: no sm_61 kernels)."""

from __future__ import annotations

import itertools
import re

import pytest

from conftest import resolved, shipped, violations
from envbuilder.errors import UserError
from envbuilder.model.resolve import ResolveError

# what a user copies out of a fix: `--flag value` pairs, and `drop --flag` (leave it out)
FLAG = re.compile(
    r"(drop )?--(cuda|torch|python|verl|rollout|vllm|with|without|driver|ecc)\b"
    r"(?:[ =]([\w.+-]+(?:,[\w.+-]+)*))?"
)
KW = {"with": "with_"}
NO_FIX = "no one change of"


def typed(fix_alternative: str, given: dict) -> dict | None:
    """The overrides after the user applies this alternative; None when it names no flag."""
    found = FLAG.findall(fix_alternative)
    if not found:
        return None
    out = dict(given)
    for drop, flag, value in found:
        key = KW.get(flag, flag)
        if drop:
            out.pop(key, None)
        else:
            assert value, f"{fix_alternative!r}: --{flag} without a value to type"
            out[key] = value.rstrip(".").split(",") if key in ("with_", "without") else value.rstrip(".")
    return out


def _grid() -> list[tuple[str, dict]]:
    m = shipped()
    dims = {
        "cuda": list(m.cuda),
        "torch": list(m.torch),
        "rollout": ["hf", "vllm", "sglang"],
        "verl": list(m.verl),
        "vllm": list(m.vllm),
    }
    grid = []
    for p in ("p40", "4090", "v100", "t4", "h100", "b200"):  # six generations, Pascal to Blackwell
        grid += [(p, {d: v}) for d, vals in dims.items() for v in vals]
        grid += [(p, {"rollout": r, "verl": v}) for r, v in itertools.product(dims["rollout"], dims["verl"])]
    for p in ("p40", "t4", "b200"):
        grid += [(p, {"cuda": c, "torch": t}) for c, t in itertools.product(dims["cuda"], dims["torch"])]
    # the drivers of most clusters (issue 34): a refusal offers a stack they run, not only an upgrade
    for p, d in itertools.product(("v100", "4090", "h100", "b200"), ("535.183.01", "550.54.15", "575.57.08")):
        grid += [(p, {"driver": d})] + [(p, {"driver": d, "verl": v}) for v in dims["verl"]]
    return grid


GRID = _grid()


def _refusal(profile: str, given: dict) -> ResolveError | None:
    try:
        resolved(profile, **given)
    except ResolveError as e:
        return e
    return None


@pytest.mark.parametrize("chunk", range(8))
def test_every_suggested_fix_resolves(chunk):
    refusals = fixes_tried = 0
    for profile, given in GRID[chunk::8]:
        try:
            e = _refusal(profile, given)
        except UserError:
            continue  # not a refusal with fixes (an unknown name), tested elsewhere
        if e is None:
            continue
        refusals += 1
        for v in e.violations:
            assert v.fix, (profile, given, v.rule)
            for alternative in re.split(r"\s+or\s+", v.fix):
                if alternative.startswith(NO_FIX):
                    continue
                after = typed(alternative, given)
                if after is None:
                    continue  # prose: an overlay to write, another image
                fixes_tried += 1
                try:
                    resolved(profile, **after)
                except UserError as again:
                    pytest.fail(
                        f"envbuild check {profile} {given}: [{v.rule}] suggests "
                        f"{alternative!r}, and with it: {again}"
                    )
    assert refusals and fixes_tried, "the grid must refuse something and suggest fixes"


def test_the_first_hour_fixes_lead_somewhere():
    """The fixes the field found leading nowhere (issue 20), now each one that resolves."""
    p40_cuda13 = violations("p40", cuda="13.0")
    assert "2.9.1" not in str(p40_cuda13) and "--cuda 11.8" in p40_cuda13["torch-cuda"].fix
    resolved("p40", cuda="11.8")
    p40_vllm = violations("p40", rollout="vllm")
    assert all("--cuda 12.6" not in v.fix for v in p40_vllm.values())
    assert any(re.search(r"--rollout hf\b", v.fix) for v in p40_vllm.values())


def test_a_fix_that_names_no_working_change_says_so_rather_than_guessing(overlay):
    """A GPU no torch in the matrix has kernels for (a Kepler K10, CC 3.0): the refusal says that no
    one change resolves it, and offers no flag to try."""
    from conftest import record
    from envbuilder.model import matrix as M

    gpu = record(
        "gpus",
        "p40",
        compute_capability="3.0",
        name="Tesla K10",
        match=[r"\bK10\b"],
        source="https://example.org",
    )
    prof = record("profiles", "p40", gpu="k10", source="https://example.org")
    m = M.load((overlay({"gpus": {"k10": gpu}, "profiles": {"k10": prof}}),))
    with pytest.raises(ResolveError) as e:
        resolved("k10", m)
    alternatives = [a for v in e.value.violations for a in re.split(r"\s+or\s+", v.fix)]
    assert any(a.startswith(NO_FIX) for a in alternatives), alternatives
    assert all(a.startswith(NO_FIX) or typed(a, {}) is None for a in alternatives), alternatives


STACK = ("cuda", "torch", "verl", "vllm")


@pytest.mark.parametrize("chunk", range(4))
def test_fixes_keep_the_users_stack_flags_when_some_completion_of_them_resolves(chunk):
    """Issue 34: a fix changes the fewest flags the user did not give, and keeps those the user
    gave whenever some completion of them resolves (`--verl 0.5.0` on an H100: `--vllm 0.8.5
    --torch 2.6.0 --cuda 12.x`, not `--verl 0.9.1`)."""
    from envbuilder.model import fixes
    from envbuilder.model.resolve import Overrides

    m = shipped()
    checked = 0
    for profile, given in [g for g in GRID if set(g[1]) & set(STACK)][chunk::4]:
        try:
            e = _refusal(profile, given)
        except UserError:
            continue
        if e is None or any(v.hard and v.rule == "arch" for v in e.violations):
            continue
        ov = fixes.applied(Overrides(), dict(given))
        completion = next(
            (c for c in fixes.completions(m, ov) if _refusal(profile, {**given, **c}) is None), None
        )
        if completion is None:
            continue
        checked += 1
        for v in e.violations:
            for alternative in re.split(r"\s+or\s+", v.fix):
                after = typed(alternative, given)
                if after is None:
                    continue
                assert all(after.get(f) == given[f] for f in given if f in STACK), (
                    f"envbuild check {profile} {given}: [{v.rule}] {alternative!r} drops a flag "
                    f"the user gave, though {completion} keeps them and resolves"
                )
    assert checked


def test_h100_verl_050_keeps_verl_050():
    e = violations("h100", verl="0.5.0")
    assert all("--verl 0.9.1" not in v.fix for v in e.values())
    assert "--vllm 0.8.5 --torch 2.6.0" in e["verl-vllm"].fix
    resolved("h100", verl="0.5.0", vllm="0.8.5", torch="2.6.0", cuda="12.4")


def test_a_memory_refusal_names_the_flag_for_more_gpus():
    e = violations("a100", model="Qwen/Qwen2-7B-Instruct", algo="grpo", gpu_memory=40960, gpus_per_node=2)
    assert "train.n_gpus" not in e["memory"].fix and "--gpus-per-node 8" in e["memory"].fix


def test_a_fix_that_drops_with_or_without_is_tried_with_an_empty_tuple():
    """`drop --with` in a fix's text: the walk applies it as no components asked for (()), never
    None, which the resolver iterates (it crashed the walk with a TypeError before)."""
    from envbuilder.model.fixes import applied, concrete
    from envbuilder.model.resolved import Overrides

    flags = concrete(shipped(), "use --verl 0.9.1 and drop --with")
    assert flags == {"with": None, "verl": "0.9.1"}
    ov = applied(Overrides(with_=("flash-attn",), without=("apex",)), {**flags, "without": None})
    assert ov.with_ == () and ov.without == () and ov.verl == "0.9.1"
    from envbuilder.model.resolve import resolve

    assert resolve(shipped(), "h100", ov).verl.version == "0.9.1"
