"""The memory estimate against what a real GPU measured: tests/fixtures/gpu/memory/h200-run.json,
written by bench/memory_gpu.py on an H200 capped to each profile's card (see the README there).
The estimate of today's code is replayed against every measurement, so it cannot drift from
what the GPU showed without this failing; a changed profile or architecture needs a new run."""

from __future__ import annotations

import json
import re

import pytest

from conftest import FIXTURES, resolved, shipped
from envbuilder.model import memory

RUN = json.loads((FIXTURES / "gpu" / "memory" / "h200-run.json").read_text(encoding="utf-8"))
MEASURED = {p["profile"]: p for p in RUN["profiles"]}
# The Blackwell profiles, on the same H200 on 2026-12-03 (five runs merged: see the README).
BLACKWELL = json.loads((FIXTURES / "gpu" / "memory" / "h200-blackwell.json").read_text(encoding="utf-8"))
MEASURED.update({p["profile"]: p for p in BLACKWELL["profiles"]})
# What a card bigger than the H200 leaves unchecked: a phase that ran out under the H200's whole
# memory, below the card's cap (cap_clamped_to_card), or a run the device's time did not allow
# (B300's generation of 4096-token responses; twice B200's generation batch). Each is said in
# the README; the test holds the list to the runs.
UNCHECKED = {("b200", "log_prob"), ("b300", "log_prob"), ("b300", "generation")}
UNCHECKED_TWICE = {"b200", "b300"}
# A second run at the plan of today's code (after hf_generate_overhead was set from the first),
# with the allocator settings the rendered run script exports: see the fixtures' README.
CHECK = json.loads((FIXTURES / "gpu" / "memory" / "h200-plan-check.json").read_text(encoding="utf-8"))
CHECKED = {p["profile"]: p for p in CHECK["profiles"]}
# Where a phase fitted, the part of its peak the estimate models from counts of tensors (the
# working set: activations, logits, KV cache; weights and optimizer state are exact byte counts)
# must match the measurement: at most 10% under it, at most 25% over it.
UNDER, OVER = 0.90, 1.25


def setup_of(profile: str):
    m = shipped()
    env = resolved(profile).to_dict()
    total = m.memory["total_mib"].get(env["gpu"]["key"])
    consts = dict(m.memory, total_gib=total["mib"] / 1024 if total else float(env["gpu"]["vram_gb"]))
    s = memory.setup(env, m.models[env["train"]["model"]], consts, m.datasets["gsm8k"]["rows"]["test"])
    # what the harness ran (bench/memory_gpu.py, 2026-12-03): HF generate, and verl's
    # log-probs over the materialised logits; the fused kernels and vLLM's sampler, which the
    # verl 0.9.1 renders plan since, are held to the H100 run of tests/fixtures/gpu/speed/
    s.fused, s.sampler_copies = None, 0
    return s


def measured_peak(run: dict) -> int:
    return run.get("update_peak_allocated", run.get("peak_allocated"))


def runs():
    return [
        pytest.param(p, i, id=f"{p}-{r['key']}-{r['label']}-{r['batch']}")
        for p, rec in MEASURED.items()
        for i, r in enumerate(rec["runs"])
    ]


def test_the_run_is_the_device_it_says_and_caps_each_profile_below_the_card():
    for run in (RUN, BLACKWELL):
        meta = run["meta"]
        assert meta["device"] == "NVIDIA H200" and meta["total_bytes"] > 139 * memory.GIB
        for rec in run["profiles"]:
            for r in rec["runs"]:
                assert r["cap_applied_bytes"] <= meta["total_bytes"]
                assert r["cap_applied_bytes"] == min(r["cap_bytes"], meta["total_bytes"])


def test_what_a_card_bigger_than_the_h200_leaves_unchecked_is_what_the_runs_show():
    for profile, key in sorted(UNCHECKED):
        mine = [r for r in MEASURED[profile]["runs"] if r["key"] == key]
        assert all(r["oom"] and r["cap_clamped_to_card"] for r in mine), (profile, key)
    for profile in UNCHECKED_TWICE:
        assert not [
            r for r in MEASURED[profile]["runs"] if r["key"] == "generation" and r["label"] == "twice"
        ]
    # and the small Blackwell cards were checked whole: no run of theirs was clamped
    for profile in ("5090", "rtx-pro-6000"):
        assert not any(r["cap_clamped_to_card"] for r in MEASURED[profile]["runs"])


@pytest.mark.parametrize("profile", list(MEASURED))
def test_the_measured_setup_is_still_the_profiles(profile):
    """A profile whose shape changed since the run makes its measurements stale."""
    rec, s = MEASURED[profile], setup_of(profile)
    a = s.arch
    assert rec["arch"]["layers"] == a.L and rec["arch"]["hidden_size"] == a.H
    assert rec["arch"]["intermediate_size"] == a.I and rec["arch"]["vocab_size"] == a.V
    assert (rec["compute_bytes"], rec["generation_bytes"], rec["rollout"], rec["n_gpus"]) == (
        s.c,
        s.g,
        s.rollout,
        s.n,
    )
    assert (rec["prompt"], rec["response"], rec["lora_rank"]) == (s.prompt, s.response, s.lora)
    assert (rec["param_offload"], rec["optimizer_offload"], rec["gradient_checkpointing"]) == (
        s.param_offload,
        s.optimizer_offload,
        s.ckpt,
    )
    assert rec["test_attention"] == ("eager" if s.eager else "sdpa")


@pytest.mark.parametrize("profile, index", runs())
def test_the_estimate_matches_what_the_gpu_measured(profile, index):
    r, s = MEASURED[profile]["runs"][index], setup_of(profile)
    est = memory.estimate(s, r["key"], r["batch"])
    work = sum(t["bytes"] for t in est["terms"] if t["kind"] == "work")
    expected = est["bytes"] + r["extra_bytes"]  # (extra: what the harness holds beyond one rank)
    if r["oom"]:
        # the GPU ran out under the card's cap: the estimate must not have planned it either
        assert expected * (1 + memory.overhead(s, r["key"])) > r["cap_applied_bytes"], (
            f"measured OOM at {r['cap_applied_bytes'] / memory.GIB:.2f} GiB, estimate "
            f"{expected / memory.GIB:.2f} GiB says it fits"
        )
        return
    measured_work = measured_peak(r) - (expected - work)
    ratio = work / measured_work
    assert UNDER <= ratio <= OVER, (
        f"working set measured {measured_work / memory.GIB:.2f} GiB, estimated "
        f"{work / memory.GIB:.2f} GiB (estimate/measured {ratio:.2f})"
    )
    if r.get("step_peak_allocated") is not None:
        step = memory.estimate(s, f"{r['key']}_step", 0)["bytes"]
        assert abs(r["step_peak_allocated"] / step - 1) <= 0.05


@pytest.mark.parametrize("profile", list(MEASURED))
def test_the_planned_sizes_fit_and_twice_the_generation_batch_does_not(profile):
    """Each planned size is at or below one the GPU ran, or between a size that fitted (where the
    estimate was at or above the measurement, so its slope is conservative) and one that ran out.
    Twice the planned generation batch ran out where memory bounds the plan."""
    rec, plan = MEASURED[profile], resolved(profile).to_dict()["memory"]
    s = setup_of(profile)
    sizes = {
        "generation": plan["batch"]["val_batch_size"] // s.n,
        "log_prob": plan["batch"]["log_prob_micro_batch_size_per_gpu"],
        "actor": plan["batch"]["actor_ppo_micro_batch_size_per_gpu"],
        "critic": plan["batch"]["critic_ppo_micro_batch_size_per_gpu"],
    }
    if resolved(profile).features.fused_kernels:
        # planned for verl's fused log-prob kernels, which these runs predate: the H100 run of
        # tests/fixtures/gpu/speed/ holds those sizes (test_speed_records.py)
        del sizes["log_prob"], sizes["actor"]
    for key, planned in sizes.items():
        if (profile, key) in UNCHECKED:
            continue
        # a run that ran out under the H200's whole memory, below its card's cap, says nothing
        mine = [r for r in rec["runs"] if r["key"] == key and not (r["oom"] and r.get("cap_clamped_to_card"))]
        fitted = [r["batch"] for r in mine if not r["oom"]]
        ran_out = [r["batch"] for r in mine if r["oom"]]
        if fitted and planned <= max(fitted):
            continue
        est = {r["batch"]: memory.estimate(s, key, r["batch"])["bytes"] + r["extra_bytes"] for r in mine}
        for r in mine:
            if not r["oom"]:
                assert est[r["batch"]] >= measured_peak(r), (key, r["batch"])
        if len(fitted) >= 2 and not ran_out:
            # above the sizes that ran, none ran out: the estimate grows at least as fast as the
            # measurement did between the two largest, so extrapolating it is conservative
            hi, lo = sorted(fitted)[-1], sorted(fitted)[-2]
            peak = {r["batch"]: measured_peak(r) for r in mine}
            assert est[hi] - est[lo] >= peak[hi] - peak[lo], (key, lo, hi)
            continue
        assert ran_out and planned < min(ran_out), (key, planned, fitted, ran_out)
        if not fitted:  # only the size that ran out brackets it: the estimate predicted that
            top = memory.estimate(s, key, min(ran_out))["bytes"]
            assert not memory.fits(
                s,
                top,
                plan["phases"][0]["budget_gib"] if key == "generation" else plan["usable_gib"],
                margin=False,
            )
    if plan["bound_by"]["generation"] == "memory" and profile not in UNCHECKED_TWICE:
        # the plan keeps headroom for HF generate's churn (hf_generate_overhead), not half the
        # card: a batch at most 2.5 times the planned one ran out
        ran_out = [r["batch"] for r in rec["runs"] if r["key"] == "generation" and r["oom"]]
        assert ran_out and min(ran_out) <= 2.5 * sizes["generation"], (ran_out, sizes["generation"])


def test_the_field_reports_validation_runs_out_on_a_p40():
    """verl 0.4.1 without data.val_batch_size generates the 1,319 GSM8K test prompts at once:
    on a P40's 24 GB in fp32 with eager attention that ran out of memory; the plan's batch did not."""
    whole = [r for r in MEASURED["p40"]["runs"] if r["label"] == "whole validation set"]
    assert whole and whole[0]["batch"] == 1319 and whole[0]["oom"]
    assert re.search(r"CUDA out of memory", whole[0]["error"])


def test_the_plan_check_ran_on_the_device_it_says():
    meta = CHECK["meta"]
    assert meta["device"] == "NVIDIA H200" and meta["total_bytes"] > 139 * memory.GIB
    assert CHECKED and all(rec["runs"] for rec in CHECKED.values())


@pytest.mark.parametrize("profile", list(CHECKED))
def test_todays_plan_fitted_with_the_run_scripts_allocator(profile):
    """The check run measured today's planned generation batch (a changed plan makes it stale:
    run bench/memory_gpu.py again), under the card's cap and with the PYTORCH_CUDA_ALLOC_CONF the
    rendered script exports. It fitted, its peak allocation is within the estimate, and what the
    allocator reserved is within the estimate plus the phase's overhead: the overhead the plan
    keeps free is at least what the allocator took."""
    rec, plan, s = CHECKED[profile], resolved(profile).to_dict(), setup_of(profile)
    assert rec["arch"]["layers"] == s.arch.L and rec["arch"]["hidden_size"] == s.arch.H
    assert (rec["compute_bytes"], rec["generation_bytes"], rec["rollout"], rec["n_gpus"]) == (
        s.c,
        s.g,
        s.rollout,
        s.n,
    )
    assert (rec["prompt"], rec["response"]) == (s.prompt, s.response)
    planned = {
        "generation": plan["memory"]["batch"]["val_batch_size"] // s.n,
        "log_prob": plan["memory"]["batch"]["log_prob_micro_batch_size_per_gpu"],
        "actor": plan["memory"]["batch"]["actor_ppo_micro_batch_size_per_gpu"],
        "critic": plan["memory"]["batch"]["critic_ppo_micro_batch_size_per_gpu"],
    }
    conf = (plan.get("cuda_alloc_conf") or {}).get("value")
    for r in rec["runs"]:
        assert r["label"] == "planned" and r["batch"] == planned[r["key"]], (
            f"{profile} {r['key']}: the check ran {r['batch']}, today's plan is {planned[r['key']]}"
        )
        assert r.get("alloc_conf_applied") == (conf or "expandable_segments:False")
        assert not r["oom"] and r["peak_reserved"] <= r["cap_applied_bytes"]
        est = memory.estimate(s, r["key"], r["batch"])["bytes"] + r["extra_bytes"]
        assert measured_peak(r) <= est
        assert r["peak_reserved"] <= est * (1 + memory.overhead(s, r["key"]))
