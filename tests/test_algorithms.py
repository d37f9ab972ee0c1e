"""--algo: verl's advantage estimators (matrices/algorithms.yaml), what each needs of the run
(no critic outside gae, rollout.n responses per prompt, the KL where its example puts it), the
memory plan without a critic, and the run script composed with each release's own config."""

from __future__ import annotations

import pytest

from conftest import resolved, shipped, violations
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

ALGOS = list(shipped().algorithms)
RUNNABLE = [a for a in ALGOS if not shipped().algorithms[a].get("refused")]


def test_gae_stays_the_default_and_keeps_its_critic():
    env = resolved("h100")
    assert env.algorithm.name == "gae" and env.algorithm.critic and env.algorithm.n == 1
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    assert "algorithm.adv_estimator=gae" in script and "critic.model.path" in script
    assert "rollout.n=" not in script
    assert env.memory["batch"]["critic_ppo_micro_batch_size_per_gpu"] is not None


def test_grpo_drops_the_critic_samples_a_group_and_puts_the_kl_in_the_loss():
    env = resolved("h100", algo="grpo")
    a = env.algorithm
    assert (a.critic, a.group, a.n, a.kl, a.kl_loss_type) == (False, True, 5, "loss", "low_var_kl")
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    for line in (
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "algorithm.use_kl_in_reward=False",
    ):
        assert line in script, line
    assert "critic." not in script.split("args=(", 1)[1]
    mem = env.memory
    assert mem["batch"]["critic_ppo_micro_batch_size_per_gpu"] is None
    assert not [p for p in mem["phases"] if p["key"].startswith("critic")]
    assert not [t for p in mem["phases"] for t in p["terms"] if t["term"].startswith("critic")]
    gae = resolved("h100").memory
    assert mem["rollout_batch_per_gpu"] == 5 * gae["rollout_batch_per_gpu"]


def test_an_estimator_with_the_kl_in_the_reward_and_one_with_extra_keys():
    rloo = render_files(BuildContext.of(resolved("h100", algo="rloo")))["run_ppo_gsm8k.sh"]
    assert "algorithm.use_kl_in_reward=True" in rloo and "use_kl_loss" not in rloo
    otb = render_files(BuildContext.of(resolved("h100", algo="optimal_token_baseline")))["run_ppo_gsm8k.sh"]
    assert "actor_rollout_ref.actor.calculate_sum_pi_squared=True" in otb


def test_an_estimator_newer_than_the_release_is_refused_with_a_release_that_has_it():
    v = violations("h100", verl="0.4.1", algo="gpg")["algorithm-release"]
    assert "verl 0.4.1 has no gpg estimator" in v.what and "0.5.0" in v.why
    assert "--verl" in v.fix


def test_gdpo_needs_several_rewards_and_is_refused_naming_why():
    v = violations("h100", algo="gdpo")["algorithm-reward"]
    assert "several named reward keys" in v.why and "--algo grpo" in v.fix


def test_an_unknown_estimator_is_bad_input_naming_the_known(cli):
    code, _, err = cli("show", "h100", "--algo", "ppo")
    assert code == 2 and "algorithm (--algo) 'ppo' is not in the matrix" in err
    assert "grpo" in err


def test_without_a_critic_a_model_fits_where_the_critic_did_not():
    """The 4090 with the table's 1.5B: GAE's critic does not fit 24 GB; the refusal names
    --algo grpo, and that fix resolves (the fix walk checks every fix the same way)."""
    v = violations("4090", model="Qwen/Qwen2.5-1.5B-Instruct")["memory"]
    assert "use --algo grpo" in v.fix
    env = resolved("4090", model="Qwen/Qwen2.5-1.5B-Instruct", algo="grpo")
    assert not env.memory["problems"]


@pytest.mark.pypi
@pytest.mark.parametrize("algo", RUNNABLE)
def test_every_estimator_composes_with_every_release_that_has_it(verl_trees, algo):
    """The run script of each estimator, on each verl release the matrix has from its `since`,
    composes with that release's own Hydra config (a key a release lacks fails here as it would
    fail in `python -m verl.trainer.main_ppo`), and says what the run reads."""
    from omegaconf import OmegaConf
    from verlconfig import compose_run_config, run_script_overrides

    from envbuilder.model.versions import version_key

    rec = shipped().algorithms[algo]
    checked = 0
    # each release once: a stack on the h100 (stacks.yaml), else a profile that runs it
    runs = {v: ("h100", v) for v in shipped().stacks}
    for name, prof in shipped().profiles.items():
        runs.setdefault(prof["verl"], (name, None))
    for v in shipped().verl:  # (0.5.0: no stack and no profile of its own; the P40 runs it)
        runs.setdefault(v, ("p40", v))
    for verl, (profile, flag) in sorted(runs.items()):
        if version_key(verl) < version_key(rec["since"]):
            continue
        env = resolved(profile, verl=flag, algo=algo)
        cfg = compose_run_config(
            verl_trees[verl], run_script_overrides(render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"])
        )
        assert OmegaConf.select(cfg, "algorithm.adv_estimator") == algo
        assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.n") == rec["n"]
        if rec["kl"] == "loss":
            assert OmegaConf.select(cfg, "actor_rollout_ref.actor.use_kl_loss") is True
        checked += 1
    assert checked
