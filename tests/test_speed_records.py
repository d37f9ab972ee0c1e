"""The training-speed records (tests/fixtures/gpu/speed/, issue 42), replayed without a GPU.

h100-grpo.json is bench/gpu_ppo.py's record of today's h100 GRPO render (verl's fused log-prob
kernels on the torch backend, token-budget micro-batches, expandable segments) on a real H100,
train batch cut to 256 prompts; h100-grpo-before.json holds the figures issue 42 measured for the
render before it on the same kind of card and cut; microbatch-h100.json is
bench/actor_microbatch.py's side-by-side of one micro-batch. Each counts only while today's
render is what ran, and the targets hold: the update phases at most a fifth of before, the step
at most a third, the actor's MFU at least 10%, and generation within the plan + 10% with at
least 5% of the card free.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import FIXTURES, bench_module, resolved
from envbuilder.render.context import BuildContext

SPEED = FIXTURES / "gpu" / "speed"
# what a device run may change of a render: its length, the train batch and the response
# length (device time; bench/speed.py holds both records of a comparison to one cut)
MAY_CHANGE = {
    "trainer.total_training_steps",
    "trainer.val_before_train",
    "data.train_batch_size",
    "data.max_response_length",
}
# what changed in the h100 GAE render after its run (h100-gae.json): the run's critic took the
# actor's token cap, 32 sequences a micro-batch, and ran at 0.17 MFU where the render before,
# at 128, ran at 0.25-0.29 (../ppo/); the critic's micro-batches are counted, not token budgets,
# so today's plan no longer caps them by tokens
CRITIC_MICRO = {
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.fsdp.micro_batch_size_per_gpu",
    "critic.fsdp.infer_micro_batch_size_per_gpu",
}


def load(name: str) -> dict:
    return json.loads((SPEED / name).read_text(encoding="utf-8"))


def todays(rec: dict):
    algo = next(part for part in rec["case"].split("-") if part in ("gae", "grpo"))
    return resolved(rec["profile"], model=rec["model"], gpus_per_node=1, algo=algo)


def test_the_after_record_ran_todays_render():
    """What ran, key for key (the render's overrides with the run's changes applied), is
    today's plan, but for the keys a device run may cut."""
    r = load("h100-grpo.json")
    assert (r["rc"], r["status"], r["gpu"]) == (0, "ok", "NVIDIA H100 80GB HBM3")
    assert {"1", "2"} <= set(r["step_metrics"])
    ran = dict(r["render_overrides"])
    ran.update({k: c["run"] for k, c in r["overrides_changed"].items()})
    plan = {a.key.lstrip("+"): a.value for a in todays(r).run}
    differ = {k for k in set(plan) | set(ran) if plan.get(k) != ran.get(k)}
    assert differ <= MAY_CHANGE, sorted(differ - MAY_CHANGE)
    env = todays(r)
    assert env.features.fused_kernels == ran["actor_rollout_ref.model.fused_kernel_options.impl_backend"]
    assert (
        r["script_exports"]["PYTORCH_CUDA_ALLOC_CONF"]
        == f"${{PYTORCH_CUDA_ALLOC_CONF-{env.cuda_alloc_conf.value}}}"
    )
    assert {k: r["versions"][k] for k in ("verl", "vllm", "torch")} == {
        "verl": env.verl.version,
        "vllm": env.vllm.version,
        "torch": env.torch.version,
    }


def test_the_before_and_after_are_one_case_and_meet_the_targets():
    speed = bench_module("speed")
    out = speed.compare(load("h100-grpo-before.json"), load("h100-grpo.json"))
    step = out["steps"]["1"]
    assert float(step["update phases s"]["ratio"]) <= 1 / 5
    assert float(step["step s"]["ratio"]) <= 1 / 3
    after = load("h100-grpo.json")["step_metrics"]
    assert all(after[s]["perf/mfu/actor"] >= 0.10 for s in ("1", "2"))
    assert float(out["time_to_first_step_s"]["step1"]["ratio"]) < 1


def test_generation_stays_within_the_plan_and_leaves_the_card_a_margin():
    r = load("h100-grpo.json")
    plan = todays(r).memory
    outside = next(p for p in plan["phases"] if p["key"] == "generate_outside")
    peaks = r["smi"]["phase_peak_mib"]
    for phase in ("validation_done->step1", "step1->step2"):  # each holds a step's generation
        assert peaks[phase] <= 1.10 * outside["total_gib"] * 1024, (phase, peaks[phase])
        assert peaks[phase] <= 0.95 * r["gpu_total_mib"], (phase, peaks[phase])


def test_the_actors_planned_update_covers_what_torch_allocated():
    """The plan's actor_update at the rendered token budget against torch's own peak in the
    steps: at or above it, and at most 25% over it."""
    r = load("h100-grpo.json")
    plan = todays(r).memory
    update = next(p for p in plan["phases"] if p["key"] == "actor")
    measured = max(r["step_metrics"][s]["actor/perf/max_memory_allocated_gb"] for s in ("1", "2"))
    assert measured <= update["total_gib"] <= 1.25 * measured, (measured, update["total_gib"])


def test_the_rendered_backend_is_one_the_micro_batch_bench_saw_train():
    """The render's fused backend ran forward and backward on the GPU, near the floor, where
    verl's row loop (the render before) was more than five times the floor."""
    m = load("microbatch-h100.json")["results"]
    backend = resolved("h100").features.fused_kernels
    assert backend
    mine = m[f"verl-fused-{backend}"]
    assert "fwd_bwd_ms" in mine and mine["fwd_bwd_x_floor"] <= 1.5 and mine["fwd_logprob_x_floor"] <= 1.5
    assert m["verl-rowloop"]["fwd_bwd_x_floor"] >= 5 and m["verl-rowloop"]["fwd_logprob_x_floor"] >= 5
    assert "fwd_bwd_error" in m["verl-fused-triton"]  # (why triton is not rendered: verl.yaml)


def test_speed_refuses_two_runs_of_different_cases(tmp_path, capsys):
    speed = bench_module("speed")
    before = load("h100-grpo-before.json")
    before["overrides_changed"]["data.train_batch_size"]["run"] = "64"
    (tmp_path / "b.json").write_text(json.dumps(before), encoding="utf-8")
    assert speed.main(["--before", str(tmp_path / "b.json"), "--after", str(SPEED / "h100-grpo.json")]) == 2
    assert "not of one case" in capsys.readouterr().err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert speed.main(["--before", str(fifo), "--after", str(SPEED / "h100-grpo.json")]) == 2
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("profile", ["h100", "h200", "a100", "b200", "3090", "5090", "p40", "t4", "v100"])
def test_every_profile_says_which_speed_settings_it_uses_and_why(profile, tmp_path):
    from envbuilder.render.files import render_files

    env = resolved(profile)
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    lines = [ln for ln in script.splitlines() if ln.startswith("# SPEED: ")]
    assert len(lines) == len(env.features.speed) >= 2
    assert any("remove padding" in ln for ln in lines)
    if env.features.fused_kernels:
        assert "use_fused_kernels=True" in script
        assert f"impl_backend={env.features.fused_kernels}" in script
    if env.features.dynamic_bsz:
        assert "actor_rollout_ref.actor.use_dynamic_bsz=True" in script


def _ran_and_planned(r: dict) -> tuple[dict, dict]:
    ran = dict(r["render_overrides"])
    ran.update({k: c["run"] for k, c in r["overrides_changed"].items()})
    return ran, {a.key.lstrip("+"): a.value for a in todays(r).run}


def test_the_gae_record_ran_todays_render_but_the_critics_micro_batches():
    """The h100 GAE run (one step within the device's time: the second was cut by the run's
    timeout) is today's render but for the cut, and for the critic's micro-batches, which today's
    plan sizes by memory alone: larger than the 32 the token cap gave the run."""
    r = load("h100-gae.json")
    assert (r["status"], r["gpu"]) == ("timeout", "NVIDIA H100 80GB HBM3")
    assert "1" in r["step_metrics"]
    ran, plan = _ran_and_planned(r)
    differ = {k for k in set(plan) | set(ran) if plan.get(k) != ran.get(k)}
    assert differ - MAY_CHANGE == CRITIC_MICRO, sorted(differ - MAY_CHANGE)
    token_cap = 65536 // (int(plan["data.max_prompt_length"]) + int(plan["data.max_response_length"]))
    for key in CRITIC_MICRO:
        assert int(ran[key]) == token_cap < int(plan[key]), key
    assert int(plan["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) <= 65536


def test_the_gae_case_against_the_render_before():
    """The h100 GAE render before issue 42 (../ppo/h100-gae.json, run on an H200 under the
    H100's memory) and after (a real H100): the actor's phases at most a fifth, its MFU at least
    10%. The critic's phases were not slow before, and the run's critic was slower (its token cap,
    fixed since: test above); the step's ratio is the note's and docs/speed.md's, not a target met."""
    speed = bench_module("speed")
    before = json.loads((FIXTURES / "gpu" / "ppo" / "h100-gae.json").read_text(encoding="utf-8"))
    after = load("h100-gae.json")
    out = speed.compare(before, after)
    assert out["gpus"] == {"before": "NVIDIA H200", "after": "NVIDIA H100 80GB HBM3"}
    step = out["steps"]["1"]
    actor = [
        sum(step[f"{p} s"][side] for p in ("old_log_prob", "update_actor")) for side in ("before", "after")
    ]
    assert actor[1] <= actor[0] / 5, actor
    assert step["actor MFU"]["after"] >= 0.10
    assert step["critic MFU"]["after"] < step["critic MFU"]["before"]


def test_triton_trains_on_the_bench_but_fails_inside_verl_where_padding_is_kept():
    """Re-run with verl's masked token mean, Triton's backward works on the bench and beats the
    torch backend; inside verl 0.9.1 without remove padding it fails at the first log-prob pass
    (forward_with_triton_backend's flat log-probs), so no profile renders it without remove
    padding (verl.yaml speed)."""
    m = load("microbatch-h100-masked.json")["results"]
    triton, torch = m["verl-fused-triton"], m["verl-fused-torch"]
    assert "fwd_bwd_error" not in triton
    assert triton["fwd_bwd_x_floor"] < torch["fwd_bwd_x_floor"]
    r = load("h100-gae-triton.json")
    assert (r["status"], r["gpu"]) == ("failed", "NVIDIA H100 80GB HBM3")
    backend = r["overrides_changed"]["actor_rollout_ref.model.fused_kernel_options.impl_backend"]
    assert backend == {"render": "torch", "run": "triton"}
    assert r["render_overrides"]["actor_rollout_ref.model.use_remove_padding"] == "False"
    assert not r["step_metrics"]
    tail = r["log_tail"]
    assert "in prepare_model_outputs" in tail and "IndexError: tuple index out of range" in tail
    from conftest import shipped

    for name in sorted(shipped().profiles):
        f = resolved(name).features
        assert f.fused_kernels != "triton" or f.remove_padding, name
