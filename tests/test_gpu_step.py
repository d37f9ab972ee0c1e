"""The GPU tier: verl's own workers ran a PPO step with the rendered configuration of p40 and
4090 (tests/fixtures/gpu/step/h200-run.json, written by bench/gpu_step.py on the H200 device
under each card's memory cap; its README says how). Replayed here against today's render: a
render whose configuration differs from the one that ran (overrides, exported variables,
patches, card cap, model shape, pins, precision) fails until the run is repeated."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import FIXTURES, shipped

ROOT = FIXTURES.parent.parent

RUN = json.loads((FIXTURES / "gpu" / "step" / "h200-run.json").read_text(encoding="utf-8"))
RUNS = {r["name"]: r for r in RUN["runs"]}
GIB = 1024**3
# what verl's trainer calls for a PPO step with a critic (GAE) and no reference policy, in order
STEP = ("generate", "compute_log_prob", "compute_values", "update_critic", "update_actor")
TORCH = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_step", ROOT / "bench" / "gpu_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def today():
    """The cases bench/gpu_step.py would send today, by profile."""
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    bench = _bench()
    return {p: bench.case_of(p, render_files, resolve, shipped()) for p in bench.PROFILES}


@pytest.mark.parametrize("profile", ["p40", "4090"])
def test_the_configuration_that_ran_is_todays_render(profile, today):
    run, case = RUNS[profile], today[profile]
    assert run["overrides"] == case["overrides"], "the run script's overrides changed since the GPU run"
    assert run["fingerprint"] == case["fingerprint"], (
        "the rendered configuration (overrides, exports, patches, card cap, model shape, pins or "
        "precision) changed since the GPU run: repeat it (tests/fixtures/gpu/step/README.md)"
    )


@pytest.mark.parametrize("profile", ["p40", "4090"])
def test_every_worker_phase_ran_on_the_gpu_under_the_cards_cap(profile, today):
    run = RUNS[profile]
    assert run["ok"] is True and run["error"] is None
    meta = run["meta"]
    assert meta["device"].startswith("NVIDIA") and meta["cap_bytes"] == today[profile]["cap_bytes"]
    assert meta["versions"]["verl"] == today[profile]["verl"]
    names = [p["phase"] for p in run["phases"]]
    assert names[:2] == ["init_model critic", "init_model actor"]
    assert names[2] == "validation generate"
    # the validation batch is the planned one, the whole batch in one HF generate
    val = run["phases"][2]
    assert val["batch"] == today[profile]["plan"]["batch"]["val_batch_size"]
    assert run["validation_response_shape"][0] == val["batch"]
    for step in (1, 2):
        assert [n.split(" ", 1)[1] for n in names if n.startswith(f"step{step} ")] == list(STEP)
    for p in run["phases"]:
        assert p["peak_reserved"] <= meta["cap_bytes"] < meta["total_bytes"], p
    # the updates did something: finite losses from verl's own metrics
    for m in run["actor_metrics"] + run["critic_metrics"]:
        loss = m.get("actor/pg_loss", m.get("critic/vf_loss"))
        assert isinstance(loss, float) and loss == loss


@pytest.mark.parametrize("profile", ["p40", "4090"])
def test_each_part_computed_in_the_dtype_of_the_precision_plan(profile, today):
    """Forward hooks saw, per phase, the autocast state and the output dtype of the decoder's
    first attention projection, the lm_head and the critic's score head."""
    run, prec = RUNS[profile], today[profile]["precision"]
    part_of = {
        "generate": "rollout",
        "compute_log_prob": "actor",
        "update_actor": "actor",
        "compute_values": "critic",
        "update_critic": "critic",
    }
    checked = 0
    for key, seen in run["dtypes"].items():
        phase, role, module = key.split("|")
        step = phase.split(" ", 1)[1] if " " in phase else phase
        part = part_of.get(step)
        # the matrix products (norms upcast to fp32 under autocast by design; embeddings look up)
        if part is None or not module.endswith(
            ("q_proj", "base_layer", "lora_A.default", "mlp", "lm_head", "score")
        ):
            continue
        want = TORCH[prec[part]]
        for rec in seen:
            if want == "float32":  # computed in fp32 end to end: no autocast, fp32 out
                assert rec["autocast"] is None and rec["output"] == "float32", (key, rec)
            else:
                assert rec["autocast"] == want and rec["output"] == want, (key, rec)
            checked += 1
    assert checked > 20


def test_the_p40_runs_fp32_eager_with_its_critic_offloaded_and_its_actor_on_the_gpu():
    run = RUNS["p40"]
    assert run["attn_implementation"] == "eager"
    cfg = run["config"]
    assert cfg["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert cfg["critic.model.fsdp_config.param_offload"] is True
    assert cfg["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is True


def test_the_4090_trains_lora_with_use_orig_params():
    run = RUNS["4090"]
    assert run["config"]["actor_rollout_ref.model.lora_rank"] == 32
    assert run["config"]["actor_rollout_ref.actor.fsdp_config.use_orig_params"] is True
    assert any("lora_A" in k for k in run["dtypes"])
    assert "verl-actor-use-orig-params" in run["apply_patches"]["stdout"] or run["apply_patches"]["rc"] == 0


@pytest.mark.parametrize(
    "name, phase, error",
    [
        ("p40-control-actor-offload", "validation generate", "Expects tensor to be on the compute device"),
        (
            "4090-control-flat-lora",
            "init_model actor",
            "uniform `requires_grad` when `use_orig_params=False`",
        ),
    ],
)
def test_the_controls_fail_where_the_plan_says_they_would(name, phase, error):
    """Undo the plan's fix (the actor offloaded on the HF rollout; LoRA without
    use_orig_params) and verl's own code fails on the GPU, as verl.yaml's hf_rollout says."""
    run = RUNS[name]
    assert run["control"] is True
    assert run["error"]["phase"] == phase and error in run["error"]["message"]


def test_the_controls_differ_from_the_profile_only_in_the_undone_fix(today):
    p40, lora = RUNS["p40-control-actor-offload"], RUNS["4090-control-flat-lora"]
    assert p40["overrides"] == today["p40"]["overrides"] + [
        "actor_rollout_ref.actor.fsdp_config.param_offload=True"
    ]
    assert lora["overrides"] == [o for o in today["4090"]["overrides"] if "use_orig_params" not in o]
    assert len(lora["overrides"]) == len(today["4090"]["overrides"]) - 1


PPO = {
    r["name"]: r
    for r in json.loads((FIXTURES / "gpu" / "step" / "h200-main-ppo.json").read_text(encoding="utf-8"))[
        "runs"
    ]
}


@pytest.mark.parametrize("profile", ["p40", "4090"])
def test_verls_own_trainer_ran_validation_and_two_steps_through_ray(profile, today):
    """`python -m verl.trainer.main_ppo` with the rendered overrides (plus validation first, two
    steps and the fixture's data files), through Ray: the first validation (step 0) and steps 1
    and 2 logged their metrics, and it exited 0."""
    run = PPO[profile]
    assert run["mode"] == "main_ppo" and run["fingerprint"] == today[profile]["fingerprint"]
    assert run["rc"] == 0 and run["steps"] == [0, 1, 2] and run["validation"]
    assert set(run["extra_overrides"]) == {
        "trainer.val_before_train=True",
        "trainer.total_training_steps=2",
        "ray_init.num_cpus=8",
        *[o for o in run["extra_overrides"] if o.startswith(("data.train_files=", "data.val_files="))],
    }
    last = run["metrics"][-1]
    for metric in ("critic/vf_loss", "actor/pg_loss", "val-core/openai/gsm8k/reward/mean@1"):
        assert metric in " ".join(run["metrics"]), metric
    assert "step:2 " in last


def test_verify_reports_the_gpu_tier_for_this_very_render():
    from envbuilder.model import gpu_tier
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    m = shipped()
    for profile in ("p40", "4090"):
        env = resolve(m, profile)
        assert gpu_tier.status(env, render_files(env), m.models) == (
            "ran: 2 steps (NVIDIA H200), main_ppo+Ray 2 steps"
        )
    env = resolve(m, "t4")
    assert gpu_tier.status(env, render_files(env), m.models) == "not run"
    # another configuration of a profile that ran: the record does not count for it
    from envbuilder.model.resolve import Overrides

    env = resolve(m, "p40", Overrides(verl="0.5.0"))
    assert gpu_tier.status(env, render_files(env), m.models).startswith("stale")
