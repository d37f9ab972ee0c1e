"""The batch arithmetic verl's workers assert (envbuilder/model/batches.py), the memory plan that
picks only sizes satisfying it, and every default render on verl >= 0.8 composed with the
release's own config and checked against it (pypi tier: the real wheels)."""

from __future__ import annotations

import pytest

from conftest import resolved, shipped
from envbuilder.model.batches import violations
from envbuilder.model.versions import version_key
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

SCRIPT_ENV = {"MODEL": "/models/m", "DATA_DIR": "/data/gsm8k"}


def config(**over):
    """A composed run config as plain data: one GPU, PPO with a critic, everything dividing."""
    cfg = {
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "algorithm": {"adv_estimator": "gae", "use_kl_in_reward": False},
        "data": {"train_batch_size": 256},
        "actor_rollout_ref": {
            "actor": {
                "ppo_mini_batch_size": 64,
                "ppo_micro_batch_size_per_gpu": 16,
                "use_dynamic_bsz": False,
                "use_kl_loss": False,
            },
            "rollout": {"n": 1, "log_prob_micro_batch_size_per_gpu": 32},
            "ref": {"log_prob_micro_batch_size_per_gpu": 32},
        },
        "critic": {
            "ppo_mini_batch_size": 64,
            "ppo_micro_batch_size_per_gpu": 16,
            "fsdp": {
                "use_dynamic_bsz": False,
                "micro_batch_size_per_gpu": 16,
                "infer_micro_batch_size_per_gpu": 16,
            },
        },
    }
    for dotted, value in over.items():
        node = cfg
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def test_a_config_that_divides_everywhere_passes():
    assert violations(config(), engine=True) == []


def test_the_h200_first_step_failure_is_caught():
    """The H200 run: log-prob micro-batch 22 against 256 samples on one GPU (verl 0.9.1's
    `data size must be divisible by force_group_size * micro_batch_size_per_gpu`)."""
    cfg = config(actor_rollout_ref__rollout__log_prob_micro_batch_size_per_gpu=22)
    found = violations(cfg, engine=True)
    assert len(found) == 1 and "log_prob_micro_batch_size_per_gpu=22" in found[0] and "256" in found[0]
    # the legacy workers split with a remainder: no complaint there
    assert violations(cfg, engine=False) == []


def test_each_rule_names_what_breaks():
    cases = {
        "over 3 GPUs": config(trainer__n_gpus_per_node=3),
        "larger than data.train_batch_size": config(actor_rollout_ref__actor__ppo_mini_batch_size=512),
        "not a whole number": config(actor_rollout_ref__actor__ppo_mini_batch_size=96),
        "does not divide the actor's mini-batch": config(
            actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=24
        ),
        "critic.fsdp.micro_batch_size_per_gpu=24": config(critic__fsdp__micro_batch_size_per_gpu=24),
        "left on dynamic batches": config(critic__fsdp={}),
        "critic.fsdp.infer_micro_batch_size_per_gpu=48": config(
            critic__fsdp__infer_micro_batch_size_per_gpu=48
        ),
    }
    for words, cfg in cases.items():
        found = violations(cfg, engine=True)
        assert any(words in v for v in found), (words, found)


def test_rollout_n_and_the_world_scale_the_share_of_each_gpu():
    # GRPO, 5 responses, 8 GPUs: 256 × 5 / 8 = 160 each; 32 divides it, 64 does not
    grpo = config(
        algorithm__adv_estimator="grpo",
        actor_rollout_ref__rollout__n=5,
        trainer__n_gpus_per_node=8,
        actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=8,
    )
    assert violations(grpo, engine=True) == []
    bad = dict(grpo)
    bad["actor_rollout_ref"] = dict(
        grpo["actor_rollout_ref"], rollout={"n": 5, "log_prob_micro_batch_size_per_gpu": 64}
    )
    assert any("160 samples" in v for v in violations(bad, engine=True))
    # no critic, no KL: neither the critic's nor the reference's micro-batches are judged
    assert not any("critic" in v or ".ref." in v for v in violations(bad, engine=True))


def dynamic(**over):
    """config() with the actor's token budgets on (verl.yaml speed): 1024 + 1024 tokens."""
    base = {
        "data__max_prompt_length": 1024,
        "data__max_response_length": 1024,
        "actor_rollout_ref__actor__use_dynamic_bsz": True,
        "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 65536,
        "actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 7,  # (not a divisor: unused)
        "actor_rollout_ref__rollout__log_prob_use_dynamic_bsz": True,
        "actor_rollout_ref__rollout__log_prob_max_token_len_per_gpu": 2048,
        "actor_rollout_ref__rollout__log_prob_micro_batch_size_per_gpu": 7,
        "actor_rollout_ref__ref__log_prob_max_token_len_per_gpu": 4096,
    }
    return config(**dict(base, **over))


def test_dynamic_batches_are_judged_by_their_token_budgets_not_by_counts():
    assert violations(dynamic(), engine=True) == []
    short = violations(dynamic(actor_rollout_ref__ref__log_prob_max_token_len_per_gpu=2047), engine=True)
    assert [v for v in short if "ref.log_prob_max_token_len_per_gpu=2047" in v and "2048" in v] == short != []
    unset = dynamic()
    del unset["actor_rollout_ref"]["actor"]["ppo_max_token_len_per_gpu"]
    assert any("ppo_max_token_len_per_gpu is not set" in v for v in violations(unset, engine=True))
    apart = violations(dynamic(actor_rollout_ref__rollout__log_prob_use_dynamic_bsz=False), engine=True)
    assert any("asserts they are equal" in v for v in apart)
    # what verl asserts whatever the micro-batches still holds: the rollout divides over the world
    assert any(
        "does not divide over 3 GPUs" in v
        for v in violations(dynamic(trainer__n_gpus_per_node=3), engine=True)
    )
    # and the critic, whose engine keeps its own count-based micro-batches, is still judged
    odd_critic = dynamic(critic__fsdp__micro_batch_size_per_gpu=7)
    assert any("critic" in v for v in violations(odd_critic, engine=True))


def test_the_memory_plan_picks_log_prob_micro_batches_that_divide_on_engine_releases():
    for profile in ("h200", "h100", "a100", "b200", "3090", "5090"):
        env = resolved(profile)
        if not env.verl.engine_batches:
            continue
        mem = env.memory
        per_gpu = mem["rollout_batch_per_gpu"]
        assert per_gpu % mem["batch"]["log_prob_micro_batch_size_per_gpu"] == 0, profile


def test_remax_and_the_otb_estimators_run_the_legacy_trainer_on_verl_09():
    for algo in ("remax", "optimal_token_baseline"):
        env = resolved("h200", algo=algo)
        assert "trainer.use_v1=False" in env.algorithm.extra
        assert any(n.startswith("trainer.use_v1=False") for n in env.notes)
    assert "trainer.use_v1=False" not in resolved("h200", algo="grpo").algorithm.extra
    # verl 0.8.0 has no v1 trainer: nothing to switch
    assert not any("use_v1" in x for x in resolved("h100", verl="0.8.0", algo="remax").algorithm.extra)


def test_async_releases_leave_validation_to_the_rollout_server():
    script = render_files(BuildContext.of(resolved("h200")))["run_ppo_gsm8k.sh"]
    assert "data.val_batch_size=" not in script and "deprecates data.val_batch_size" in script
    assert "data.val_batch_size=" in render_files(BuildContext.of(resolved("p40")))["run_ppo_gsm8k.sh"]


def _runs():
    """Every default profile on verl >= 0.8 and the 0.8/0.9 stacks, GAE and GRPO, one node and
    two of eight GPUs."""
    out = []
    for name, prof in sorted(shipped().profiles.items()):
        if version_key(prof["verl"]) >= version_key("0.8.0"):
            out.append((name, None))
    for v in shipped().stacks:
        if version_key(v) >= version_key("0.8.0"):
            out.append(("h100", v))
    return out


@pytest.mark.parametrize("profile,verl", _runs())
def test_every_default_render_on_the_engine_releases_passes_the_arithmetic(verl_trees, profile, verl):
    from omegaconf import OmegaConf
    from verlconfig import compose_run_config, run_script_overrides

    checked = 0
    for algo in ("gae", "grpo"):
        for topo in ({}, {"nodes": 2, "gpus_per_node": 8}):
            env = resolved(profile, verl=verl, algo=algo, **topo)
            assert env.verl.engine_batches
            script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
            world = {"N_GPUS": str(env.train.n_gpus), "NNODES": str(env.cluster.nodes)}
            cfg = compose_run_config(verl_trees[env.verl.version], run_script_overrides(script, world))
            plain = OmegaConf.to_container(cfg, resolve=True)
            assert violations(plain, engine=True, critic_engine=env.verl.critic_fsdp) == [], (algo, topo)
            if env.features.dynamic_bsz:
                # token budgets: one shorter than a whole sequence is refused
                seq = env.train.max_prompt_length + env.train.max_response_length
                plain["actor_rollout_ref"]["rollout"]["log_prob_max_token_len_per_gpu"] = seq - 1
            else:
                # the same script with the plan's old log-prob size (not a divisor) is refused
                per_gpu = env.memory["rollout_batch_per_gpu"]
                odd = next((b for b in range(per_gpu - 1, 0, -1) if per_gpu % b), per_gpu + 1)
                plain["actor_rollout_ref"]["rollout"]["log_prob_micro_batch_size_per_gpu"] = odd
            assert violations(plain, engine=True, critic_engine=env.verl.critic_fsdp)
            checked += 1
    assert checked == 4


def test_the_recorded_arithmetic_is_what_each_wheel_asserts(verl_trees):
    """verl.yaml `batches.engine` against the wheel: the engine releases' prepare_micro_batches
    asserts the division and their engine config defaults to dynamic batches; the others run
    the legacy workers."""
    for version, rec in shipped().verl.items():
        tree = verl_trees[version]
        utils = tree / "verl" / "workers" / "engine" / "utils.py"
        engine = bool((rec.get("batches") or {}).get("engine"))
        text = utils.read_text(encoding="utf-8") if utils.exists() else ""
        asserted = "total_data_size % (force_group_size * micro_batch_size_per_gpu) == 0" in text
        # 0.7.1 ships the engine too, but its main_ppo takes the legacy fsdp_workers
        # (trainer.use_legacy_worker_impl: auto); from 0.8.0 the legacy workers are gone
        legacy = (tree / "verl" / "workers" / "fsdp_workers.py").exists()
        assert engine == (asserted and not legacy), version
        if engine:
            cfg = (tree / "verl" / "workers" / "config" / "engine.py").read_text(encoding="utf-8")
            assert "use_dynamic_bsz: bool = True" in cfg, version
        v1 = rec.get("trainer_v1")
        yaml_text = (tree / "verl" / "trainer" / "config" / "ppo_trainer.yaml").read_text(encoding="utf-8")
        assert bool(v1) == ("use_v1: true" in yaml_text), version


def test_odd_worlds_round_the_mini_batch_then_the_train_batch():
    """24 GPUs: the mini-batch 256 rounds up to 264 (a multiple of the world) and the train batch
    1024 up to 1056 (a whole number of mini-batches); each is said in the script's PLAN."""
    for nodes, per_node in ((3, 8), (1, 3), (5, 7)):
        env = resolved("h200", algo="grpo", nodes=nodes, gpus_per_node=per_node)
        world, t = nodes * per_node, env.train
        assert t.ppo_mini_batch_size % world == 0 and t.train_batch_size % t.ppo_mini_batch_size == 0
    env = resolved("h200", algo="grpo", nodes=3, gpus_per_node=8)
    assert (env.train.ppo_mini_batch_size, env.train.train_batch_size) == (264, 1056)
    assert any(n.startswith("data.train_batch_size 1056") for n in env.notes)


def test_a_train_batch_larger_than_the_data_set_is_refused_with_the_numbers(cli):
    code, out, err = cli("render", "h100", "--nodes", "1024", "--gpus-per-node", "8", "-o", "out-never")
    assert code == 2 and out == ""
    assert "8192" in err and "7473 training rows" in err and "at most" in err
    assert "Traceback" not in err
