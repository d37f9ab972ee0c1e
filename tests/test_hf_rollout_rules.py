"""What verl 0.4.1/0.5.0's HF rollout cannot do, planned around (verl.yaml hf_rollout), and the
run overrides preflight refuses: an offloaded actor (generate runs from CPU weights), LoRA in
one flat parameter (FSDP refuses mixed requires_grad), a `+`/`++` key verl never reads.

The resolver's side needs nothing; the facts' cited lines, the patches and preflight's check
run on the real verl wheels (pypi tier). tests/test_gpu_step.py holds what the GPU showed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import place_script, resolved, shipped
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload"
ORIG = "actor_rollout_ref.actor.fsdp_config.use_orig_params"


def refused(env) -> dict:
    return {r.key: r for r in env.verl.refused_overrides}


def test_the_p40_keeps_its_actor_on_the_gpu_and_offloads_the_rest():
    env = resolved("p40")
    assert env.train.param_offload is True and env.train.actor_param_offload is False
    assert any(n.startswith(f"{OFFLOAD}=False") for n in env.notes)
    assert refused(env)[OFFLOAD].value == "true"
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    assert f"{OFFLOAD}=False" in script and "critic.model.fsdp_config.param_offload=True" in script


def test_the_memory_plan_counts_the_resident_actor_in_the_critics_phases():
    phases = {p["key"]: p for p in resolved("p40").memory["phases"]}
    for key in ("critic", "critic_step"):
        assert "actor weights (resident)" in {t["term"] for t in phases[key]["terms"]}
    # the critic's own weights still offload outside its phases
    assert "critic weights (resident)" not in {t["term"] for t in phases["actor"]["terms"]}


def test_a_vllm_profile_keeps_its_offload_and_has_nothing_refused():
    env = resolved("t4")
    assert env.train.actor_param_offload == env.train.param_offload is True
    assert not env.notes and not env.verl.refused_overrides and env.verl.lora_orig_params_key is None


def test_lora_on_the_hf_rollout_gets_use_orig_params_patched_into_041_and_set():
    env = resolved("4090")
    assert env.verl.lora_orig_params_key == ORIG
    assert "verl-actor-use-orig-params" in [p.name for p in env.patches]
    assert f"++{ORIG}=True" in render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    assert refused(env)[ORIG].value == "false"
    # verl 0.5.0 reads the key itself: set, no patch
    env50 = resolved("4090", verl="0.5.0")
    assert env50.verl.lora_orig_params_key == ORIG
    assert "verl-actor-use-orig-params" not in [p.name for p in env50.patches]
    assert f"++{ORIG}=True" in render_files(BuildContext.of(env50))["run_ppo_gsm8k.sh"]


def test_lora_grads_span_the_flat_parameter_in_the_plan():
    """use_orig_params=True with one FSDP unit keeps a gradient for the whole flat parameter."""
    phases = {p["key"]: p for p in resolved("4090").memory["phases"]}
    grads = next(t for t in phases["actor"]["terms"] if t["term"] == "actor gradients")
    arch = resolved("4090").memory["arch"]
    assert grads["bytes"] == 4 * (arch["parameters"] + arch["lora_parameters"])


def test_the_hf_rollouts_generation_patch_is_recorded_for_041_only():
    assert "verl-hf-sharding-manager-timing" in [p.name for p in resolved("p40").patches]
    assert "verl-hf-sharding-manager-timing" not in [p.name for p in resolved("p40", verl="0.5.0").patches]
    assert "verl-hf-sharding-manager-timing" not in [p.name for p in resolved("t4").patches]


# -- the real wheels (pypi tier) -----------------------------------------------------------------

# the lines verl.yaml's hf_rollout cites, and what each holds in the release's fsdp_workers.py
CITED = {
    "0.4.1": {
        543: "offload_fsdp_model_to_cpu(self.actor_module_fsdp)",
        414: "rollout_sharding_manager = BaseShardingManager()",
        308: "auto_wrap_policy = None",
        326: "use_orig_params=False,",
        671: "timing_generate.update(self.rollout_sharding_manager.timing)",
    },
    "0.5.0": {
        609: "offload_fsdp_model_to_cpu(self.actor_module_fsdp)",
        477: "rollout_sharding_manager = BaseShardingManager()",
        357: "auto_wrap_policy = None",
        381: 'use_orig_params=self.config.actor.fsdp_config.get("use_orig_params", False),',
    },
}


@pytest.mark.pypi
@pytest.mark.parametrize("version", list(CITED))
def test_the_cited_lines_hold_what_the_facts_say(verl_trees, version):
    lines = (verl_trees[version] / "verl" / "workers" / "fsdp_workers.py").read_text().splitlines()
    for number, text in CITED[version].items():
        assert lines[number - 1].strip() == text, (version, number, lines[number - 1])
    rec = shipped().verl[version]["hf_rollout"]
    assert rec["offload"]["works"] is False and rec["lora"]["key"] == ORIG


@pytest.mark.pypi
def test_only_041s_sharding_manager_lacks_timing(verl_trees):
    base = "verl/workers/sharding_manager/base.py"
    assert "timing" not in (verl_trees["0.4.1"] / base).read_text()
    assert "self.timing = {}" in (verl_trees["0.5.0"] / base).read_text()


@pytest.mark.pypi
@pytest.mark.parametrize("version", ["0.4.1", "0.5.0", "0.6.1", "0.8.0", "0.9.0", "0.9.1"])
def test_every_config_read_is_read_by_the_release_and_absent_from_its_config(verl_trees, version):
    from omegaconf import OmegaConf

    from verlconfig import compose_run_config

    root = verl_trees[version]
    source = "\n".join(p.read_text() for p in (root / "verl" / "workers").rglob("*.py"))
    # and what the release's recorded patches make it read (0.4.1: use_orig_params)
    m = shipped()
    source += "\n".join(r["with"] for name in m.verl[version]["patches"] for r in m.patches[name]["replace"])
    cfg = compose_run_config(root, [])
    reads = shipped().verl[version].get("config_reads") or []
    assert reads
    for key in reads:
        assert OmegaConf.select(cfg, key, default="absent") == "absent", key
        # the code reads the key's leaf, or the map holding it (mixed_precision)
        parts = key.split(".")
        assert any(f'"{p}"' in source for p in parts[-2:]), key


@pytest.mark.pypi
@pytest.mark.parametrize("profile, kw", [("p40", {}), ("4090", {}), ("4090", {"verl": "0.5.0"})])
def test_the_patches_apply_to_the_real_wheel(verl_trees, tmp_path, profile, kw):
    env = resolved(profile, **kw)
    site = tmp_path / "site"
    shutil.copytree(verl_trees[env.verl.version], site)
    script = place_script(render_files(BuildContext.of(env)), "apply_patches.py", tmp_path)
    r = subprocess.run(
        [sys.executable, "-S", str(script), "--site", str(site)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    workers = (site / "verl" / "workers" / "fsdp_workers.py").read_text()
    if env.train.lora_rank:
        assert 'use_orig_params=self.config.actor.fsdp_config.get("use_orig_params", False)' in workers
    if env.verl.version == "0.4.1":
        assert "timing = {}" in (site / "verl/workers/sharding_manager/base.py").read_text()


def preflight(env, verl_tree, tmp_path, *overrides) -> subprocess.CompletedProcess:
    script = place_script(render_files(BuildContext.of(env)), "preflight.py", tmp_path)
    return subprocess.run(
        [sys.executable, str(script), "--quiet", "--overrides", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": str(verl_tree), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.pypi
@pytest.mark.parametrize("profile", ["p40", "4090", "t4"])
def test_preflight_lets_the_run_scripts_own_overrides_through(verl_trees, tmp_path, profile):
    from verlconfig import run_script_overrides

    env = resolved(profile)
    own = run_script_overrides(render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"])
    r = preflight(env, verl_trees[env.verl.version], tmp_path, *own, "trainer.total_epochs=2")
    assert r.returncode != 2 and "run override" not in r.stderr, r.stderr


@pytest.mark.pypi
def test_preflight_refuses_a_plus_key_verl_does_not_have(verl_trees, tmp_path):
    """The P40 field report's `++actor_rollout_ref.fsdp_config.offload_params=true`: Hydra adds
    it, verl never reads it, and the run goes on without offload."""
    env = resolved("p40")
    r = preflight(env, verl_trees["0.4.1"], tmp_path, "++actor_rollout_ref.fsdp_config.offload_params=true")
    assert r.returncode == 2
    assert "verl 0.4.1's config has no key actor_rollout_ref.fsdp_config.offload_params" in r.stderr
    assert "fix:" in r.stderr and "NOT STARTED" in r.stderr
    # a key under an open map (override_config: {}) and a recorded read are fine
    ok = preflight(
        env,
        verl_trees["0.4.1"],
        tmp_path,
        "+actor_rollout_ref.model.override_config.rope_theta=1",
        "++critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
    )
    assert ok.returncode != 2, ok.stderr


@pytest.mark.pypi
@pytest.mark.parametrize(
    "profile, override, reason",
    [
        ("p40", f"{OFFLOAD}=True", "cannot generate from an offloaded actor"),
        ("4090", f"++{ORIG}=False", "cannot wrap LoRA"),
    ],
)
def test_preflight_refuses_what_the_release_cannot_run(verl_trees, tmp_path, profile, override, reason):
    env = resolved(profile)
    r = preflight(env, verl_trees[env.verl.version], tmp_path, override)
    assert r.returncode == 2 and reason in r.stderr, r.stderr
    assert re.search(r"fix: leave", r.stderr)


@pytest.mark.pypi
def test_a_vllm_profile_may_offload_its_actor(verl_trees, tmp_path):
    env = resolved("t4")
    r = preflight(env, verl_trees["0.6.1"], tmp_path, f"{OFFLOAD}=True")
    assert r.returncode != 2 and "run override" not in r.stderr
