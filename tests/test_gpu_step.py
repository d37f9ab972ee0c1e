"""The GPU tier: verl's own workers ran a PPO step with the rendered configuration of p40 and
4090 (tests/fixtures/gpu/step/h200-run.json, written by bench/gpu_step.py on the H200 device
under each card's memory cap; its README says how). Replayed here against today's render: a
render whose configuration differs from the one that ran (overrides, exported variables,
patches, card cap, model shape, pins, precision) fails until the run is repeated."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, bench_module, shipped
from envbuilder.render.context import BuildContext


RUN = json.loads((FIXTURES / "gpu" / "step" / "h200-run.json").read_text(encoding="utf-8"))
RUNS = {r["name"]: r for r in RUN["runs"]}
GIB = 1024**3
# what verl's trainer calls for a PPO step with a critic (GAE) and no reference policy, in order
STEP = ("generate", "compute_log_prob", "compute_values", "update_critic", "update_actor")
TORCH = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _bench():
    return bench_module("gpu_step")


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
        assert gpu_tier.status(env, render_files(BuildContext.of(env)), m.models) == (
            "ran: 2 steps (NVIDIA H200), main_ppo+Ray 2 steps"
        )
    env = resolve(m, "t4")
    assert gpu_tier.status(env, render_files(BuildContext.of(env)), m.models) == "not run"
    # another configuration of a profile that ran: the record does not count for it
    from envbuilder.model.resolve import Overrides

    env = resolve(m, "p40", Overrides(verl="0.5.0"))
    assert gpu_tier.status(env, render_files(BuildContext.of(env)), m.models).startswith("stale")


# -- the seed 4090 report's own run: Qwen2-7B with LoRA, GRPO, one RTX 4090 ---------------------

GRPO7B = {
    r["name"]: r
    for r in json.loads((FIXTURES / "gpu" / "grpo7b" / "h200-run.json").read_text(encoding="utf-8"))["runs"]
}
MODEL7B = "Qwen/Qwen2-7B-Instruct"
# what the device run changed from the render to fit its time: the number of prompts (so the
# number of generate chunks) and the steps; every per-GPU micro-batch is the render's
REDUCED = {"data.train_batch_size", "data.val_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"}


@pytest.fixture(scope="module")
def grpo7b_case():
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    return _bench().case_of("4090", render_files, resolve, shipped(), "grpo", MODEL7B)


def test_the_4090_trains_qwen2_7b_with_lora_and_grpo_as_rendered(grpo7b_case):
    """`envbuild render 4090 --algo grpo --model Qwen/Qwen2-7B-Instruct`: verl 0.4.1's workers
    ran generate, old and reference log-probs and a LoRA update on random weights of the 7B's
    shape under the 4090's cap, with the rendered overrides and patches."""
    run = GRPO7B["4090-grpo-Qwen_Qwen2-7B-Instruct"]
    assert run["ok"] is True and run["error"] is None
    assert run["meta"]["cap_bytes"] == grpo7b_case["cap_bytes"]
    assert run["patches"] == [p["name"] for p in grpo7b_case["patches"]]
    assert "verl-hf-rollout-lora-wrap" in run["patches"]
    key = lambda o: o.split("=", 1)[0]  # noqa: E731
    same = [o for o in run["overrides"] if key(o) not in REDUCED]
    assert same == [o for o in grpo7b_case["overrides"] if key(o) not in REDUCED]
    assert "++actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" in same
    assert (
        run["config"]["algorithm.adv_estimator"] == "grpo"
        and run["config"]["actor_rollout_ref.actor.use_kl_loss"]
    )
    # one copy of the weights: the reference is the actor with its adapters off
    assert run["roles"] == {"critic": False, "reference": "in the actor (LoRA off)"}
    names = [p["phase"] for p in run["phases"]]
    assert names == [
        "init_model actor",
        "validation generate",
        "step1 generate",
        "step1 compute_log_prob",
        "step1 compute_ref_log_prob",
        "step1 update_actor",
    ]
    assert run["actor_metrics"][0]["actor/grad_norm"] > 0  # the adapters learned something
    # the frozen base's parameters are bf16; peft casts each adapter's input to the adapter's
    # own dtype, so an fp32 input there says the adapters kept fp32 parameters
    update = {
        k.split("|")[2]: v for k, v in run["dtypes"].items() if k.startswith("step1 update_actor|actor|")
    }
    assert update["model.layers.0.self_attn.q_proj.base_layer"][0]["params"] == ["bfloat16"]
    assert update["model.layers.0.self_attn.q_proj.lora_A.default"][0]["input"] == "float32"


def test_the_7b_plan_holds_each_measured_phase_under_the_cap(grpo7b_case):
    """Each phase's measured peak stays under the card's usable memory and under what the plan
    says of that phase (the plan adds its own margins), at the rendered micro-batches."""
    run = GRPO7B["4090-grpo-Qwen_Qwen2-7B-Instruct"]
    plan = grpo7b_case["plan"]["phases"]
    cap = grpo7b_case["cap_bytes"] / GIB
    phase_of = {"generate": "generation", "compute_log_prob": "log_prob", "compute_ref_log_prob": "log_prob"}
    phase_of["update_actor"] = "actor"
    for p in run["phases"]:
        got = p["peak_allocated"] / GIB
        assert got < cap, p
        part = p["phase"].split()[-1]
        if part in phase_of:
            assert got <= plan[phase_of[part]] + 0.05, (p["phase"], got, plan)


def test_without_the_wrap_patch_the_bf16_base_cannot_be_wrapped():
    """The control: the same render less verl-hf-rollout-lora-wrap fails where verl 0.4.1 puts
    the bf16 base and the fp32 adapters into one flat parameter."""
    run = GRPO7B["4090-grpo-Qwen_Qwen2-7B-Instruct-control-no-wrap"]
    assert run["control"] and run["error"]["phase"] == "init_model actor"
    assert "Must flatten tensors with uniform dtype" in run["error"]["message"]
    assert run["unwrapped_params"]["wrapped_units"] == 0
    assert run["unwrapped_params"]["dtypes"] == ["bfloat16", "float32"]


def test_a_critic_that_does_not_fit_points_at_grpo_and_grpo_renders():
    from envbuilder.model.resolve import Overrides, ResolveError, resolve

    with pytest.raises(ResolveError) as e:
        resolve(shipped(), "4090", Overrides(model=MODEL7B))
    assert "--algo grpo" in str(e.value)
    env = resolve(shipped(), "4090", Overrides(model=MODEL7B, algo="grpo"))
    assert env.train.actor_model_dtype == "bf16"
    assert "verl-hf-rollout-lora-wrap" in [p.name for p in env.patches]
    # the profile's own 0.5B keeps the configuration the whole PPO step ran with
    small = resolve(shipped(), "4090")
    assert small.train.actor_model_dtype is None
    assert "verl-hf-rollout-lora-wrap" not in [p.name for p in small.patches]


def test_the_harness_writes_each_case_and_its_controls(tmp_path):
    """`bench/gpu_step.py cases` for the 4090 and its 7B GRPO variant: the cases, and controls
    that each undo one fix (the flat-LoRA control has neither use_orig_params nor the wrap
    patch; the 7B control lacks the wrap patch)."""
    out = tmp_path / "cases.json"
    _bench().write_cases(out, ["4090", f"4090:grpo:{MODEL7B}"])
    cases = {c["name"]: c for c in json.loads(out.read_text())["cases"]}
    assert set(cases) == {
        "4090",
        "4090-grpo-Qwen_Qwen2-7B-Instruct",
        "4090-control-flat-lora",
        "4090-grpo-Qwen_Qwen2-7B-Instruct-control-no-wrap",
    }
    assert "verl-hf-rollout-lora-wrap" in cases["4090-grpo-Qwen_Qwen2-7B-Instruct"]["apply_patches"]
    for name in ("4090-control-flat-lora", "4090-grpo-Qwen_Qwen2-7B-Instruct-control-no-wrap"):
        assert cases[name]["control"] and "verl-hf-rollout-lora-wrap" not in cases[name]["apply_patches"]
    assert not any("use_orig_params" in o for o in cases["4090-control-flat-lora"]["overrides"])
    assert (
        cases["4090-grpo-Qwen_Qwen2-7B-Instruct-control-no-wrap"]["overrides"]
        == (cases["4090-grpo-Qwen_Qwen2-7B-Instruct"]["overrides"])
    )
