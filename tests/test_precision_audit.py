"""The precision of each part of a run: the recorded patches, the rendered audit_precision.py and
the run script's dtype/compile settings.

Two tiers. Without network: the audit runs for real against the recorded real verl files
(tests/fixtures/verl-*) and against what the image build installs (the stand-in wheels). The
real-package tier (marker pypi): every verl release in the matrix, from its PyPI wheel, gets the
patches of each kind of profile (no bf16 and fp32 everywhere, fp16-capable, bf16) applied by the
rendered apply_patches.py, then the rendered audit runs against the patched tree; and each
rendered run script's overrides are composed with that release's own Hydra config.
"""

from __future__ import annotations

import atexit
import functools
import json
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, PROFILES, frozen, place_script, record, resolved, script_data, shipped
from envbuilder import images
from envbuilder.model import matrix as M
from envbuilder.render.files import RUN_SCRIPT, render_files
from envbuilder.render.context import BuildContext
from envbuilder.model.resolve import TORCH_DTYPE
from fixture_wheels import module_files, wheels_for_env

BF16 = {"bf16", "bfloat16"}


def run_script(path: Path, site: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """A rendered script as the Dockerfile's RUN runs it, against the verl under `site`."""
    site_arg = ["--site", str(site)] if path.name == "apply_patches.py" else []  # (the audit: PYTHONPATH)
    return subprocess.run(
        [sys.executable, "-S", str(path), *site_arg],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )


def write_scripts(files: dict, tmp_path: Path) -> dict[str, Path]:
    """The rendered patch and audit scripts, with the sidecar they read beside them."""
    return {
        name: place_script(files, name, tmp_path)
        for name in ("apply_patches.py", "audit_precision.py")
        if name in files
    }


def patched_lines(d: dict, site: Path) -> set[str]:
    """`file:line` of every line a patch of `d` would change in the unpatched tree at `site`."""
    out = set()
    for patch in d["patches"]:
        for rel in patch["files"]:
            text = (site / rel).read_text(encoding="utf-8")
            for r in patch["replace"]:
                start = 0
                while (i := text.find(r["find"], start)) >= 0:
                    out.add(f"{rel}:{text.count(chr(10), 0, i) + 1}")
                    start = i + 1
    return out


def fixture_site(version: str, d: dict, tmp_path: Path) -> Path:
    """The recorded real files of verl `version` (tests/fixtures), with an empty module for every
    other verl module of the training path (the audit reads each one)."""
    site = tmp_path / f"site-{version}"
    shutil.copytree(FIXTURES / f"verl-{version}", site)
    for rel, text in module_files([m for m in d["training_path"] if m.startswith("verl.")]).items():
        path = site / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return site


# -- without network: the recorded real files ----------------------------------------------------


def test_the_p40_audit_fails_on_unpatched_verl_naming_file_and_line(tmp_path):
    d = resolved("p40").to_dict()
    site = fixture_site("0.4.1", d, tmp_path)
    scripts = write_scripts(render_files(BuildContext.of(resolved("p40"))), tmp_path)
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 1, r.stdout
    for where in (
        "verl/workers/actor/dp_actor.py:100",
        "verl/workers/critic/dp_critic.py:65",
        "verl/workers/rollout/hf_rollout.py:109",
        "verl/workers/fsdp_workers.py:221",
        "verl/utils/model.py:511",
    ):
        assert f"audit_precision: {where}: " in r.stderr, where
    assert "torch.autocast(..., dtype=torch.bfloat16) left on the run's path" in r.stderr
    assert "the Tesla P40 has no native bfloat16" in r.stderr
    assert "FAILED for p40 (verl 0.4.1)" in r.stderr
    # the reward model's autocast is a reviewed exception, said as such, not a finding
    assert "fsdp_workers.py:1300: reviewed (verl-reward-model-autocast)" in r.stdout
    assert ":1300:" not in r.stderr


@pytest.mark.parametrize("profile, version", [("p40", "0.4.1"), ("t4", "0.6.1")])
def test_the_audit_passes_once_the_recorded_patches_are_applied(profile, version, tmp_path):
    d = resolved(profile, verl=version).to_dict()
    site = fixture_site(version, d, tmp_path)
    scripts = write_scripts(render_files(BuildContext.of(resolved(profile, verl=version))), tmp_path)
    assert run_script(scripts["apply_patches.py"], site, tmp_path).returncode == 0
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "audit_precision: ok: " in r.stdout and r.stderr == ""


def test_the_audit_passes_on_what_the_image_build_installs(tmp_path):
    """The Dockerfile's order on the stand-in wheels the build tests install: pip install,
    apply_patches.py, audit_precision.py."""
    env = resolved("p40", without=["apex"])
    d = env.to_dict()
    wheels = wheels_for_env(tmp_path / "pkgs", d, FIXTURES / "verl-0.4.1")
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(next(w for w in wheels if w.name.startswith("verl-"))) as z:
        z.extractall(site)
    scripts = write_scripts(render_files(BuildContext.of(env)), tmp_path)
    assert run_script(scripts["apply_patches.py"], site, tmp_path).returncode == 0
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_multiline_autocast_is_found_and_a_commented_one_is_not(tmp_path):
    d = resolved("p40").to_dict()
    site = fixture_site("0.4.1", d, tmp_path)
    scripts = write_scripts(render_files(BuildContext.of(resolved("p40"))), tmp_path)
    assert run_script(scripts["apply_patches.py"], site, tmp_path).returncode == 0
    dataset = site / "verl/utils/dataset/rl_dataset.py"
    dataset.write_text(
        "import torch\n"
        "# with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
        "x = 1  # torch.autocast('cuda', dtype=torch.bfloat16)\n"
        "with torch.amp.autocast(\n"
        "        device_type='cuda',\n"
        "        dtype=torch.bfloat16):\n"
        "    pass\n"
        "ATTN = {'impl': 'flash_attention_2'}  # a literal, not a comment\n"
    )
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 1
    findings = re.findall(r"audit_precision: (verl/\S+:\d+): ", r.stderr)
    assert findings == ["verl/utils/dataset/rl_dataset.py:4", "verl/utils/dataset/rl_dataset.py:8"]


def test_a_reviewed_line_that_is_gone_fails_the_audit(tmp_path):
    d = resolved("p40").to_dict()
    site = fixture_site("0.4.1", d, tmp_path)
    scripts = write_scripts(render_files(BuildContext.of(resolved("p40"))), tmp_path)
    assert run_script(scripts["apply_patches.py"], site, tmp_path).returncode == 0
    workers = site / "verl/workers/fsdp_workers.py"
    workers.write_text(
        workers.read_text().replace(
            "with torch.no_grad(), torch.autocast(device_type=device_name, dtype=torch.bfloat16):",
            "with torch.no_grad():",
        )
    )
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 1
    assert (
        "verl/workers/fsdp_workers.py: the reviewed line (verl-reward-model-autocast) is not there any more"
    ) in r.stderr


def test_a_missing_training_path_module_or_verl_fails_the_audit(tmp_path):
    d = resolved("p40").to_dict()
    site = fixture_site("0.4.1", d, tmp_path)
    (site / "verl/trainer/main_ppo.py").unlink()
    scripts = write_scripts(render_files(BuildContext.of(resolved("p40"))), tmp_path)
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 1
    assert "verl.trainer.main_ppo: no file for this module of the training path" in r.stderr
    r = run_script(scripts["audit_precision.py"], tmp_path / "empty", tmp_path)
    assert r.returncode == 1 and "verl is not installed" in r.stderr


def test_a_bf16_card_with_flash_attn_has_nothing_to_audit(tmp_path):
    scripts = write_scripts(render_files(BuildContext.of(resolved("h200", frozen()))), tmp_path)
    assert "apply_patches.py" not in scripts
    r = run_script(scripts["audit_precision.py"], tmp_path / "empty", tmp_path)
    assert r.returncode == 0
    assert "nothing to audit" in r.stdout


def test_the_audit_holds_its_plan_as_data_not_as_code():
    files = render_files(BuildContext.of(resolved("t4", frozen())))
    assert files["audit_precision.py"] == images.script_text("audit_precision.py")  # (no profile in it)
    plan = script_data(files, "audit_precision.py")
    assert plan["checks"] == ["autocast_bf16", "flash_attention_2"]
    assert "verl.workers.critic.dp_critic" in plan["modules"]
    assert plan["files"] == [
        "verl/utils/model.py",
        "verl/workers/critic/dp_critic.py",
        "verl/workers/fsdp_workers.py",
    ]
    assert {r["name"] for r in plan["reviewed"]} == {
        "verl-reward-model-autocast",
        "verl-actor-attention-default",
        "verl-critic-attention-default",
    }


def test_the_dockerfile_runs_the_audit_right_after_the_patches():
    lines = render_files(BuildContext.of(resolved("p40")))["Dockerfile"].splitlines()
    patches = lines.index("RUN python /opt/envbuild/apply_patches.py")
    assert lines[patches + 2 : patches + 4] == [
        "COPY audit_precision.py envbuild-scripts.json /opt/envbuild/",  # (with the data it reads)
        "RUN python /opt/envbuild/audit_precision.py",
    ]


# -- the run script -------------------------------------------------------------------------------


def test_the_p40_run_script_says_each_parts_dtype_and_turns_compile_off_for_ray_workers():
    script = render_files(BuildContext.of(resolved("p40")))[RUN_SCRIPT]
    assert (
        "# Precision, part by part: rollout fp32 · reference log-probs fp32 · actor (log-probs, "
        "PPO update) fp32 · critic fp32."
    ) in script
    assert "  actor_rollout_ref.actor.use_torch_compile=False\n" in script
    assert "export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}\n" in script


def test_the_t4_run_script_trains_in_fp32_and_infers_in_fp16():
    script = render_files(BuildContext.of(resolved("t4", frozen())))[RUN_SCRIPT]
    assert (
        "rollout fp16 · reference log-probs fp16 · actor (log-probs, PPO update) fp32 · critic fp32 (training stays in fp32"
        in script
    )
    for line in (
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.ref.fsdp_config.dtype=float16",
        "critic.model.fsdp_config.dtype=float32",
        "actor_rollout_ref.rollout.dtype=float16",
    ):
        assert f"\n  {line}\n" in script, line
    assert "use_torch_compile" not in script  # CC 7.5 runs Triton
    assert "export PYTORCH_CUDA_ALLOC_CONF" not in script
    assert "# PYTORCH_CUDA_ALLOC_CONF stays as it is: vLLM's sleep mode" in script


def test_the_allocator_setting_runs_in_bash_and_an_exported_value_wins(tmp_path):
    script = render_files(BuildContext.of(resolved("p40")))[RUN_SCRIPT]
    line = next(l for l in script.splitlines() if l.startswith("export PYTORCH_CUDA_ALLOC_CONF="))
    probe = f'{line}\nprintf "%s" "$PYTORCH_CUDA_ALLOC_CONF"'
    env = {"PATH": "/usr/bin:/bin"}
    run = lambda extra: (
        subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=dict(env, **extra)).stdout
    )
    assert run({}) == "expandable_segments:True"
    assert run({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == "max_split_size_mb:128"
    assert run({"PYTORCH_CUDA_ALLOC_CONF": ""}) == ""


# -- the real-package tier: every verl release from its PyPI wheel --------------------------------


@functools.lru_cache(maxsize=None)
def t4_in_fp32():
    """An fp32 profile on verl 0.6.1 (none is shipped): a T4 profile whose dtype is fp32, from a
    --matrix-dir overlay as a user writes one."""
    folder = Path(tempfile.mkdtemp(prefix="envbuild-t4-fp32-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "t4fp32.yaml").write_text(
        json.dumps(
            {"profiles": {"t4-fp32": record("profiles", "t4", dtype="fp32", source="https://example.org")}}
        )
    )
    return folder


# (id, how to resolve it): every shipped profile, plus combinations that give every verl release
# each kind of precision (no bf16 and fp32 everywhere; fp16-capable; bf16)
_COMBOS = {p: (p, {}) for p in PROFILES}
_COMBOS |= {
    "p40-verl0.5.0": ("p40", {"verl": "0.5.0"}),
    "t4-verl0.5.0": ("t4", {"verl": "0.5.0", "vllm": "0.8.5", "torch": "2.6.0", "cuda": "12.4"}),
    "4090-verl0.5.0": ("4090", {"verl": "0.5.0"}),
    # a 7B with LoRA on one 4090: the bf16 base and the LoRA wrap patch
    "4090-7b-grpo": ("4090", {"algo": "grpo", "model": "Qwen/Qwen2-7B-Instruct"}),
    "4090-7b-grpo-verl0.5.0": ("4090", {"algo": "grpo", "model": "Qwen/Qwen2-7B-Instruct", "verl": "0.5.0"}),
    "t4-verl0.4.1-hf": ("t4", {"verl": "0.4.1", "rollout": "hf"}),
    "t4-verl0.6.1": ("t4", {"verl": "0.6.1"}),
    "h100-verl0.6.1": ("h100", {"verl": "0.6.1"}),
    "t4-fp32-verl0.6.1": None,
    "t4-fp32-verl0.9.1": None,
}
for _v in ("0.7.1", "0.8.0", "0.9.0"):
    _COMBOS |= {
        f"t4-verl{_v}": ("t4", {"verl": _v}),
        f"h100-verl{_v}": ("h100", {"verl": _v}),
        f"t4-fp32-verl{_v}": None,
    }
COMBOS = list(_COMBOS)


@functools.lru_cache(maxsize=None)
def combo(name: str):
    if _COMBOS[name] is None:
        return resolved("t4-fp32", M.load((t4_in_fp32(),)), verl=name.rsplit("verl", 1)[1])
    profile, kw = _COMBOS[name]
    return resolved(profile, **kw)


def kind(d: dict) -> str:
    return {"bf16": "bf16", "fp16": "fp16"}.get(d["precision"]["rollout"], "fp32")


def test_the_combinations_cover_every_kind_of_precision_and_every_patch_of_every_release():
    envs = [combo(c).to_dict() for c in COMBOS]
    seen = {(d["verl"]["version"], kind(d)) for d in envs}
    patched = {(d["verl"]["version"], p["name"]) for d in envs for p in d["patches"]}
    for version, rec in shipped().verl.items():
        assert {k for v, k in seen if v == version} == {"fp32", "fp16", "bf16"}, version
        assert {n for v, n in patched if v == version} == set(rec["patches"]), version


@pytest.mark.pypi
@pytest.mark.parametrize("name", COMBOS)
def test_the_recorded_patches_apply_to_the_real_wheel_and_the_audit_passes(verl_trees, name, tmp_path):
    env = combo(name)
    d = env.to_dict()
    site = tmp_path / "site"
    shutil.copytree(verl_trees[d["verl"]["version"]], site)
    scripts = write_scripts(render_files(BuildContext.of(env)), tmp_path)
    if d["patches"]:
        r = run_script(scripts["apply_patches.py"], site, tmp_path)
        assert r.returncode == 0, r.stderr
        for patch in d["patches"]:
            for rel in patch["files"]:
                text = (site / rel).read_text(encoding="utf-8")
                for rep in patch["replace"]:
                    assert rep["find"] not in text and rep["with"] in text, (patch["name"], rel)
                py_compile.compile(str(site / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for rev in d["audit"]["reviewed"]:
        assert f"reviewed ({rev['name']})" in r.stdout, rev["name"]


@pytest.mark.pypi
@pytest.mark.parametrize(
    "name",
    [
        "p40",
        "p40-verl0.5.0",
        "t4",
        "t4-verl0.5.0",
        "t4-verl0.4.1-hf",
        "t4-fp32-verl0.6.1",
        "4090",
        "4090-verl0.5.0",
    ],
)
def test_the_audit_fails_on_the_unpatched_real_wheel_naming_every_line_a_patch_fixes(
    verl_trees, name, tmp_path
):
    env = combo(name)
    d = env.to_dict()
    site = verl_trees[d["verl"]["version"]]  # read only: the audit does not write
    scripts = write_scripts(render_files(BuildContext.of(env)), tmp_path)
    r = run_script(scripts["audit_precision.py"], site, tmp_path)
    assert r.returncode == 1, r.stdout
    named = set(re.findall(r"^audit_precision: (verl/\S+?:\d+): ", r.stderr, re.M))
    # every line the precision patches change is named (the fa2 import patch changes no audited
    # literal; the HF rollout's sharding-manager and LoRA patches are not about precision)
    other = (
        "verl-optional-flash-attn-import",
        "verl-hf-sharding-manager-timing",
        "verl-actor-use-orig-params",
    )
    want = patched_lines(dict(d, patches=[p for p in d["patches"] if p["name"] not in other]), site)
    assert want and want <= named, sorted(want - named)


@pytest.mark.pypi
@pytest.mark.parametrize("name", COMBOS)
def test_the_run_scripts_overrides_compose_with_the_releases_own_config(verl_trees, name):
    from omegaconf import OmegaConf

    from verlconfig import compose_run_config, keys_ending, run_script_overrides

    env = combo(name)
    d = env.to_dict()
    cfg = compose_run_config(
        verl_trees[d["verl"]["version"]], run_script_overrides(render_files(BuildContext.of(env))[RUN_SCRIPT])
    )
    parts = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic")
    dtypes = keys_ending(cfg, parts, "dtype")
    assert dtypes, "no dtype keys found: the walk is broken"
    if d["dtype"] != "bf16":
        # (0.9.1's fsdp_config.turbo_config is read only by the fsdp_turbo engine,
        # verl/workers/engine/fsdp/fsdp_turbo_impl.py, another strategy, off this run's path)
        left = {k: v for k, v in dtypes.items() if str(v) in BF16 and ".turbo_config." not in k}
        assert not left, f"bf16 left in the composed config of {name}: {left}"
    pr = d["precision"]
    assert cfg.actor_rollout_ref.rollout.dtype == TORCH_DTYPE[pr["rollout"]]
    for part, key in d["verl"]["autocast_keys"].items():
        # (0.8+: mixed_precision.param_dtype, which verl's PrecisionType reads as bf16 or bfloat16)
        assert OmegaConf.select(cfg, key) in (TORCH_DTYPE[pr[part]], pr[part]), key
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == pr["actor"]
    if d["algorithm"]["critic"]:  # (GRPO trains no critic: the run script sets nothing of it)
        assert (
            OmegaConf.select(cfg, d["verl"]["critic_fsdp"] + ".mixed_precision.param_dtype") == pr["critic"]
        )
    # LoRA's frozen base in bf16 where the fp32 base does not fit (sizing.lora_memory)
    if d["train"].get("actor_model_dtype"):
        want = d["train"]["actor_model_dtype"]
        assert OmegaConf.select(cfg, "actor_rollout_ref.actor.fsdp_config.model_dtype") == want
    assert cfg.actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype == pr["ref"]
    compile_on = d["features"]["torch_compile"]
    assert cfg.actor_rollout_ref.actor.use_torch_compile is compile_on
    assert cfg.actor_rollout_ref.ref.use_torch_compile is compile_on
    # what keeps each reviewed line of the audit off the run's path
    for rev in d["audit"]["reviewed"]:
        for key, value in rev["holds"].items():
            assert OmegaConf.select(cfg, key, throw_on_missing=True) == value, (rev["name"], key)


def test_an_envbuild_json_from_before_the_audit_is_refused_with_the_fix(cli, tmp_path):
    """`render --from` an older spec (no per-part precision, no audit): exit 2, re-resolve it."""
    data = json.loads(resolved("p40").to_json())
    del data["precision"], data["audit"]
    (tmp_path / "envbuild.json").write_text(json.dumps(data))
    code, _, err = cli("render", "--from", "envbuild.json", "-o", "out")
    assert code == 2
    assert "audit is missing" in err and "precision is missing" in err
    assert "envbuild render p40" in err
    assert not (tmp_path / "out").exists()
