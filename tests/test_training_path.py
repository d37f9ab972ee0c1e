"""The training path: the modules a PPO run imports, as the resolver assembles them from the
matrix for the chosen verl, rollout and components, and where preflight and the smoke test take
them from. No network."""

from __future__ import annotations

import pytest

from conftest import PROFILES, frozen, record, resolved, script_data, shipped, violations
from envbuilder.model import matrix as M
from envbuilder.render.files import smoke_command
from envbuilder.errors import UserError
from envbuilder.render.files import preflight_expectations, render_files
from envbuilder.render.context import BuildContext

VERL_041_HF = [
    "verl",
    "verl.trainer.main_ppo",
    "verl.workers.fsdp_workers",
    "verl.workers.actor.dp_actor",
    "verl.workers.critic.dp_critic",
    "verl.utils.dataset.rl_dataset",
    "verl.workers.reward_manager.naive",
    "verl.utils.reward_score.gsm8k",
    "verl.workers.rollout.hf_rollout",
    "verl.workers.sharding_manager.base",
]
VERL_061_VLLM = [
    "verl",
    "verl.trainer.main_ppo",
    "verl.workers.fsdp_workers",
    "verl.workers.actor.dp_actor",
    "verl.workers.critic.dp_critic",
    "verl.utils.dataset.rl_dataset",
    "verl.workers.reward_manager.naive",
    "verl.utils.reward_score.gsm8k",
    "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd",
]
VLLM = ["vllm", "vllm._C"]
VERL_091_VLLM = [
    "verl",
    "verl.trainer.main_ppo",
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.trainer_sync",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "transfer_queue",
    "verl.workers.engine_workers",
    "verl.workers.engine.fsdp.transformer_impl",
    "verl.workers.config.model",
    "verl.workers.utils.losses",
    "verl.utils.dataset.rl_dataset",
    "verl.experimental.reward_loop",
    "verl.experimental.reward_loop.reward_manager.naive",
    "verl.utils.reward_score.gsm8k",
    "verl.experimental.agent_loop",
    "verl.experimental.agent_loop.single_turn_agent_loop",
    "verl.checkpoint_engine",
    "verl.workers.rollout.replica",
    "verl.workers.rollout.llm_server",
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
]
VLLM_024 = ["vllm", "vllm._C_stable_libtorch"]  # (its compiled ops moved: vllm.yaml)
FLASH_ATTN = ["flash_attn_2_cuda", "flash_attn.bert_padding"]
APEX = ["apex", "apex_C", "amp_C", "fused_layer_norm_cuda"]


def verl_record(version: str) -> dict:
    """A shipped verl record for an overlay (whose `sources:` keys the shipped file's are not)."""
    return record("verl", version, source=f"https://pypi.org/project/verl/{version}/")


def path(profile: str, **kw) -> list[str]:
    """The logic tests' training path: the frozen fixture matrix's (conftest)."""
    return resolved(profile, frozen(), **kw).to_dict()["training_path"]


SHIPPED = {  # the shipped matrix's facts (a matrix update changes these, not the logic below)
    "p40": APEX + VERL_041_HF,
    "4090": VERL_041_HF,
    "t4": VLLM_024 + VERL_091_VLLM,
    "v100": VLLM + APEX + VERL_061_VLLM,
    "3090": VLLM_024 + VERL_091_VLLM,
    "a100": VLLM_024 + APEX + VERL_091_VLLM,
    **{
        p: VLLM_024 + VERL_091_VLLM
        for p in ("h100", "h200", "b200", "b300", "5090", "rtx-pro-6000", "gh200", "gb200")
    },
}


@pytest.mark.parametrize("profile", list(SHIPPED))
def test_each_shipped_profile_imports_its_whole_training_path(profile):
    assert resolved(profile).to_dict()["training_path"] == SHIPPED[profile]


def test_every_shipped_profile_is_covered_above():
    assert set(PROFILES) == set(SHIPPED), "a new profile needs its training path checked here"


def test_the_rollout_decides_the_rollout_modules():
    hf = path("p40")
    assert "verl.workers.rollout.hf_rollout" in hf
    assert not any("vllm" in m for m in hf)
    vllm = path("t4")
    assert "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd" in vllm and "vllm._C" in vllm
    assert "verl.workers.rollout.hf_rollout" not in vllm


def test_verl_050_with_the_vllm_rollout_takes_its_fsdp_vllm_sharding_manager():
    p = path(
        "p40",
        verl="0.5.0",
        rollout="vllm",
        allow_unsupported=True,
        torch="2.6.0",
        cuda="12.4",
        without=["apex"],
    )
    assert p[:2] == VLLM
    assert p[-2:] == [
        "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd",
        "verl.workers.sharding_manager.fsdp_vllm",
    ]


def test_components_added_or_removed_change_the_compiled_modules():
    assert path("4090", with_=["flash-attn"]) == FLASH_ATTN + VERL_041_HF
    assert path("a100", without=["apex"]) == VLLM + FLASH_ATTN + VERL_061_VLLM
    assert path("p40", without=["apex"]) == VERL_041_HF


def test_the_compiled_modules_come_before_verl_and_no_module_twice():
    compiled = ("vllm", "flash_attn", "apex", "amp_C", "fused_layer_norm_cuda")
    for profile in PROFILES:
        p = resolved(profile).to_dict()["training_path"]
        assert len(p) == len(set(p)), profile
        first_verl = p.index("verl")
        assert all(not m.startswith("verl") for m in p[:first_verl]), profile
        # after verl only verl's modules and the pure-Python ones its own code imports
        # (0.9.1's transfer_queue), never a compiled one
        assert not any(m.startswith(compiled) for m in p[first_verl:]), profile


def test_the_names_come_from_the_matrix_not_from_code(overlay):
    rec = verl_record("0.4.1")
    rec["training_path"] = dict(
        rec["training_path"], modules=["verl", "verl.lab.trainer"], rollouts={"hf": ["verl.lab.rollout"]}
    )
    m = M.load((overlay({"verl": {"0.4.1": rec}}),))
    assert resolved("4090", m).to_dict()["training_path"] == ["verl", "verl.lab.trainer", "verl.lab.rollout"]


def test_a_rollout_without_a_recorded_training_path_is_a_hard_error(overlay):
    rec = verl_record("0.4.1")
    rec["training_path"] = dict(
        rec["training_path"], rollouts={"vllm": rec["training_path"]["rollouts"]["vllm"]}
    )
    m = M.load((overlay({"verl": {"0.4.1": rec}}),))
    v = violations("4090", m, allow_unsupported=True)
    assert v["training-path"].hard
    assert "verl.0.4.1.training_path.rollouts.hf" in v["training-path"].fix


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"modules": ["verl/trainer/main_ppo"]}, "training_path.modules[0]"),
        ({"modules": ["verl.trainer.main_ppo; import os"]}, "training_path.modules[0]"),
        ({"rollouts": {"hf": ["1verl"]}}, "training_path.rollouts.hf[0]"),
    ],
)
def test_a_module_name_that_is_not_a_dotted_python_name_is_refused(overlay, bad, key):
    rec = verl_record("0.4.1")
    rec["training_path"] = dict(rec["training_path"], **bad)
    folder = overlay({"verl": {"0.4.1": rec}})
    with pytest.raises(UserError) as e:
        M.load((folder,))
    assert f"verl.0.4.1.{key}" in str(e.value) and "lab.yaml" in str(e.value)


def test_a_release_must_record_its_training_path(overlay):
    rec = verl_record("0.4.1")
    del rec["training_path"]
    with pytest.raises(UserError) as e:
        M.load((overlay({"verl": {"0.4.1": rec}}),))
    assert "verl.0.4.1.training_path: required key is missing" in str(e.value)


def test_a_training_path_for_a_rollout_the_release_lacks_is_refused(overlay):
    rec = verl_record("0.6.1")
    rec["training_path"] = dict(
        rec["training_path"], rollouts=dict(rec["training_path"]["rollouts"], hf=["verl.x"])
    )
    with pytest.raises(UserError) as e:
        M.load((overlay({"verl": {"0.6.1": rec}}),))
    assert "verl.0.6.1.training_path.rollouts.hf" in str(e.value) and "no 'hf' rollout" in str(e.value)


def test_every_training_path_fact_names_its_source():
    m = shipped()
    for key, rec in m.verl.items():
        assert rec["training_path"]["source"].startswith(f"https://pypi.org/project/verl/{key}/")
    for section in (
        m.flash_attn["training_path"],
        m.apex["training_path"],
        m.vllm_training_path,
        m.cuda_compat,
    ):
        assert section["source"]


def test_preflight_and_the_smoke_test_take_the_training_path_from_the_resolved_env():
    env = resolved("t4", frozen())
    expected = preflight_expectations(env)
    assert expected["training_path"] == list(env.training_path)
    assert expected["compat_libcuda"] == shipped().cuda_compat["libcuda"]
    data = script_data(render_files(BuildContext.of(resolved("t4", frozen()))), "preflight.py")
    assert "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd" in data["training_path"]
    cmd = smoke_command()
    assert cmd[:2] == ["python", "-c"] and "'--smoke'" in cmd[2]
    dockerfile = render_files(BuildContext.of(resolved("t4")))["Dockerfile"]
    copy = next(ln.split() for ln in dockerfile.splitlines() if ln.startswith("COPY preflight.py"))
    assert cmd[-1] == copy[-1].rstrip("/") + "/preflight.py"  # where the image holds it
