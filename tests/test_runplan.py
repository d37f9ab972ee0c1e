"""The run plan (envbuilder/model/runplan.py): the run script's overrides as data. The script
prints the plan (bash expands it to the same list, for every profile and option tested here),
envbuild.json and `show --json` carry it, a file whose plan was edited is refused, and the plan
holds the batch arithmetic verl's workers assert."""

from __future__ import annotations

import json

import pytest

from conftest import PROFILES, resolved
from envbuilder.model import resolved as resolved_mod
from envbuilder.model import runplan
from envbuilder.model.batches import violations
from envbuilder.model.runplan import env_from_json
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext
from verlconfig import SCRIPT_ENV, run_script_overrides

CASES = [(p, {}) for p in PROFILES] + [
    ("h200", {"algo": "grpo"}),
    ("h200", {"algo": "remax"}),
    ("h100", {"nodes": 2, "gpus_per_node": 8}),
    ("4090", {"algo": "grpo", "model": "Qwen/Qwen2-7B-Instruct"}),
    ("h100", {"verl": "0.6.1"}),
    ("p40", {"rollout": "hf"}),
]


@pytest.mark.parametrize(
    "profile,flags", CASES, ids=[f"{p}-{'-'.join(map(str, f.values()))}" for p, f in CASES]
)
def test_the_script_passes_exactly_the_plan(profile, flags):
    env = resolved(profile, **flags)
    world = dict(SCRIPT_ENV, NNODES=str(env.cluster.nodes))
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    assert run_script_overrides(script, world) == runplan.overrides(env.run, world)


def test_the_plan_is_in_envbuild_json_and_show_json(cli):
    env = resolved("h200")
    doc = json.loads(render_files(BuildContext.of(env))["envbuild.json"])
    assert doc["run"] == [a.to_dict() for a in env.run]
    code, out, _ = cli("show", "h200", "--json")
    assert code == 0 and json.loads(out)["run"] == doc["run"]


def test_an_edited_plan_in_envbuild_json_is_refused_and_an_absent_one_derived():
    from envbuilder.errors import UserError

    text = render_files(BuildContext.of(resolved("h200")))["envbuild.json"]
    doc = json.loads(text)
    assert env_from_json(text).run == resolved("h200").run
    for arg in doc["run"]:
        if arg["key"] == "actor_rollout_ref.model.path":
            arg["value"] = "$(touch /tmp/pwned)"
    with pytest.raises(UserError, match="was edited"):
        env_from_json(json.dumps(doc))
    del doc["run"]
    assert env_from_json(json.dumps(doc)).run == resolved("h200").run


def test_shell_values_name_only_the_scripts_variables():
    for profile in PROFILES:
        for a in resolved(profile).run:
            if a.shell:
                assert resolved_mod._SHELL_VALUE.fullmatch(a.value), a
            else:
                assert "$" not in a.value and "\n" not in a.value, a


def test_every_plan_passes_the_batch_arithmetic_and_a_broken_one_is_caught():
    for profile, flags in CASES:
        env = resolved(profile, **flags)
        cfg = runplan.as_config(env.run, runplan.world(env))
        assert violations(cfg, env.verl.engine_batches, env.verl.critic_fsdp) == [], (profile, flags)
    # a count the engine cannot split (the p40's legacy workers split with a remainder, so the
    # h100 on verl 0.9.0: engine workers, no token budgets)
    env = resolved("h100", verl="0.9.0")
    broken = tuple(
        a._replace(value="22") if a.key.endswith("log_prob_micro_batch_size_per_gpu") else a for a in env.run
    )
    cfg = runplan.as_config(broken, runplan.world(env))
    assert any("log_prob_micro_batch_size_per_gpu=22" in v for v in violations(cfg, True))
    # and a token budget shorter than one sequence, where the plan takes budgets (verl 0.9.1)
    env = resolved("h200")
    assert env.features.dynamic_bsz
    short = tuple(
        a._replace(value="1000") if a.key.endswith("log_prob_max_token_len_per_gpu") else a for a in env.run
    )
    cfg = runplan.as_config(short, runplan.world(env))
    assert any("log_prob_max_token_len_per_gpu=1000" in v for v in violations(cfg, True))


def test_the_literals_live_in_the_plan_not_the_template():
    from pathlib import Path

    template = (Path(__file__).parent.parent / "templates" / "run_ppo_gsm8k.sh.j2").read_text()
    args = template.split("args=(", 1)[1].split("\n)\n", 1)[0]
    for literal in ("1e-6", "1e-5", "0.001", "tensor_model_parallel_size", "critic.model", "replace("):
        assert literal not in args, literal
