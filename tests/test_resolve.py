"""Resolver rules, one behaviour each: a profile and overrides in, a ResolvedEnv or the rules it
breaks out, each with what, why and a fix that works."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from conftest import frozen, frozen_with, pinned, saved_text
from envbuilder.errors import UserError
from envbuilder.model.runplan import env_from_json
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext
from envbuilder.model.resolve import ResolveError

# Every rule here runs on the frozen fixture matrix (conftest.FROZEN), never the shipped one: a
# matrix update leaves these tests alone (tests/test_shipped_facts.py holds the shipped facts).
PROFILES = list(frozen().profiles)


def resolved(profile, matrix=None, **kw):
    return conftest.resolved(profile, matrix or frozen(), **kw)


def violations(profile, matrix=None, **kw):
    return conftest.violations(profile, matrix or frozen(), **kw)


def record(section, key, **changes):
    return conftest.record(section, key, frozen(), **changes)


RENDERED_WITH_WARNINGS = ("Dockerfile", "requirements.txt", "environment.yml", "run_ppo_gsm8k.sh")


# -- arch: the torch build's arch list decides, not the CUDA version ---------------------------


def test_torch_27_cu128_on_a_p40_fails_with_no_kernel_image():
    v = violations("p40", torch="2.7.0", cuda="12.8")["arch"]
    assert v.hard
    assert "no kernel image is available" in v.why
    assert "sm_61" in v.what


def test_the_arch_fix_names_a_torch_that_runs_on_the_gpu():
    fix = violations("p40", torch="2.7.0", cuda="12.8")["arch"].fix
    torch, cuda = re.search(r"--torch (\S+) --cuda (\S+)", fix).groups()
    env = resolved("p40", torch=torch, cuda=cuda).to_dict()
    assert env["torch"]["version"] == torch and env["warnings"] == []


def test_a_p40_runs_torch_26_cu124_because_cuda_12_does_not_refuse_pascal():
    env = resolved("p40", cuda="12.4").to_dict()
    assert env["torch"]["variant"] == "cu124"
    assert "6.0" in env["torch"]["archs"]  # an sm_60 cubin runs on CC 6.1
    assert env["warnings"] == []


# -- torch/CUDA builds -------------------------------------------------------------------------


def test_a_missing_torch_cuda_build_suggests_the_cuda_versions_it_has():
    v = violations("p40", cuda="12.1")["torch-cuda"]
    assert v.hard
    assert "torch 2.6.0 has no build for CUDA 12.1" in v.what
    for cuda in ("11.8", "12.4", "12.6"):
        assert f"--cuda {cuda}" in v.fix


# -- driver ------------------------------------------------------------------------------------


def test_a_driver_too_old_for_the_cuda_image_is_a_violation():
    v = violations("t4", driver="450.0")["driver"]
    assert "driver 450.0 is too old for CUDA 12.4" in v.what
    assert "550.54.15" in v.fix


def test_a_driver_above_the_compat_floor_runs_in_minor_version_compatibility():
    env = resolved("t4", driver="530.0").to_dict()
    assert env["driver"]["mode"] == "minor-version-compatibility"
    assert env["warnings"] == []


def test_a_driver_above_the_toolkit_minimum_runs_natively():
    assert resolved("t4", driver="560.35.03").to_dict()["driver"]["mode"] == "native"


# -- vLLM --------------------------------------------------------------------------------------


def test_vllm_on_a_p40_is_below_its_compute_capability_floor():
    v = violations("p40", rollout="vllm")["vllm-cc"]
    assert "CC 6.1" in v.what
    assert "--rollout hf" in v.fix


def test_the_seeds_vllm_0_6_3_with_torch_2_6_is_an_abi_mismatch():
    v = violations("p40", rollout="vllm", vllm="0.6.3.post1")["vllm-torch"]
    assert v.hard
    assert "ABI mismatch" in v.what
    assert "torch==2.4.0" in v.why


def test_vllm_with_its_exact_torch_pin_resolves():
    env = resolved("t4").to_dict()
    assert env["vllm"]["version"] == "0.8.5.post1"
    assert env["vllm"]["torch"] == env["torch"]["version"] == "2.6.0"
    assert env["warnings"] == []


def test_the_vllm_floor_is_read_from_the_data(overlay):
    # No GPU name in the rule: lower the floor in a matrix overlay and the P40 passes it.
    folder = overlay(
        {"min_compute_capability": "6.0", "min_compute_capability_source": "https://example.org/a-fork"}
    )
    env = resolved("p40", frozen_with(folder), rollout="vllm", cuda="12.4").to_dict()
    assert env["vllm"]["version"] == "0.8.5"
    assert env["warnings"] == []


# -- verl rollouts -----------------------------------------------------------------------------


def test_verl_061_has_no_hf_rollout_and_the_fix_names_the_last_verl_with_it():
    v = violations("t4", rollout="hf")["rollout"]
    assert v.hard
    assert "verl 0.6.1 has no 'hf' rollout" in v.what
    assert "--verl 0.5.0" in v.fix


# -- flash-attn, bf16, attention ---------------------------------------------------------------


def test_flash_attn_on_a_t4_is_below_its_floor():
    v = violations("t4", with_=["flash-attn"])["flash-attn-cc"]
    assert "Ampere" in v.why
    assert "--without flash-attn" in v.fix


def test_a_4090_without_flash_attn_gets_bf16_and_sdpa():
    env = resolved("4090").to_dict()
    assert (env["dtype"], env["attention"], env["flash_attn"]) == ("bf16", "sdpa", None)
    assert env["features"]["remove_padding"] is False


def test_a_4090_with_flash_attn_gets_flash_attention_2():
    env = resolved("4090", with_=["flash-attn"]).to_dict()
    assert env["flash_attn"]["version"] == "2.6.3"  # 2.5.8 stops below torch 2.4
    assert env["attention"] == "flash_attention_2"


def test_flash_attn_carries_where_its_release_wheel_is():
    """The release folder of the resolved version and the CUDA tags of that release (2.6.3's
    setup.py: cu118 / cu123; 2.8.3 publishes CUDA 12 only, tagged with the major), from extensions.yaml."""
    fa = resolved("4090", with_=["flash-attn"]).to_dict()["flash_attn"]
    assert fa["release"] == "https://github.com/Dao-AILab/flash-attention/releases/download/v2.6.3"
    assert fa["cuda_tags"] == {"11": "118", "12": "123"}
    fa = resolved("3090").to_dict()["flash_attn"]
    assert (fa["version"], fa["cuda_tags"]) == ("2.8.3", {"12": "12"})
    assert fa["release"].endswith("/releases/download/v2.8.3")


def test_a_3090_gets_flash_attention_2_and_remove_padding():
    env = resolved("3090").to_dict()
    assert (env["dtype"], env["attention"]) == ("bf16", "flash_attention_2")
    assert env["features"]["remove_padding"] is True


def test_a_p40_gets_fp32_eager_and_no_torch_compile():
    env = resolved("p40").to_dict()
    assert (env["dtype"], env["attention"]) == ("fp32", "eager")
    assert env["features"]["torch_compile"] is False
    assert env["features"]["bf16"] is False


def test_a_t4_gets_fp16():
    env = resolved("t4").to_dict()
    assert (env["dtype"], env["attention"]) == ("fp16", "sdpa")
    assert env["features"]["torch_compile"] is True


def test_bf16_asked_of_a_gpu_without_it_is_a_violation(overlay):
    folder = overlay(
        {"profiles": {"t4": record("profiles", "t4", dtype="bf16", source="https://example.org")}}
    )
    v = violations("t4", frozen_with(folder))["bf16"]
    assert "CC >= 8.0" in v.why


# -- apex: nvcc must equal torch.version.cuda --------------------------------------------------


def test_apex_needs_a_torch_built_for_the_images_nvcc():
    # torch 2.6.0 has no cu128: a cu126 wheel would run, but apex refuses nvcc 12.8 vs 12.6.
    v = violations("v100", cuda="12.8")["apex-nvcc"]
    assert v.hard
    assert "nvcc is 12.8" in v.what and "12.6" in v.what
    assert "--without apex" in v.fix


def test_without_apex_an_older_minor_torch_build_is_used():
    env = resolved("v100", cuda="12.8", without=["apex"]).to_dict()
    assert env["torch"]["variant"] == "cu126"
    assert env["apex"] is None


def test_apex_is_built_for_the_gpus_arch():
    env = resolved("p40").to_dict()
    assert env["apex"]["arch_list"] == "6.1"
    assert env["torch"]["cuda"] == env["cuda"]["version"]


# -- python ------------------------------------------------------------------------------------


def test_a_python_the_cuda_image_does_not_ship_is_a_violation():
    v = violations("p40", python="3.12")["image-python"]
    assert v.hard
    assert "ships Python 3.10, not 3.12" in v.what
    assert "--python 3.10" in v.fix


# -- --allow-unsupported -----------------------------------------------------------------------


def test_allow_unsupported_writes_soft_violations_into_every_rendered_file():
    env = resolved("p40", rollout="vllm", cuda="12.4", allow_unsupported=True)
    [warning] = env.to_dict()["warnings"]
    assert "vLLM cannot run on the Tesla P40 (CC 6.1)" in warning
    files = render_files(BuildContext.of(env))
    for name in RENDERED_WITH_WARNINGS:
        assert warning in files[name], name
    assert warning in files["envbuild.json"]


def test_without_allow_unsupported_a_soft_violation_is_an_error_that_mentions_the_flag():
    with pytest.raises(ResolveError) as e:
        resolved("p40", rollout="vllm", cuda="12.4")
    assert "--allow-unsupported" in str(e.value)
    assert e.value.exit_code == 2


def test_allow_unsupported_keeps_hard_violations_as_errors():
    with pytest.raises(ResolveError) as e:
        resolved("p40", torch="2.7.0", cuda="12.8", allow_unsupported=True)
    assert [v.rule for v in e.value.violations] == ["arch"]


# -- unknown names -----------------------------------------------------------------------------


def test_an_unknown_torch_version_gets_a_suggestion():
    with pytest.raises(UserError, match=r"torch '2\.6' is not in the matrix; did you mean '2\.6\.0'"):
        resolved("p40", torch="2.6")


def test_an_unknown_profile_gets_did_you_mean():
    with pytest.raises(UserError, match="Unknown profile 'p4'; did you mean 'p40'"):
        resolved("p4")


def test_an_unknown_component_to_leave_out_gets_a_suggestion():
    with pytest.raises(UserError, match="did you mean 'apex'"):
        resolved("p40", without=["apx"])


# -- recorded verl patches ---------------------------------------------------------------------


def patch_names(profile: str) -> list[str]:
    return [p["name"] for p in resolved(profile).to_dict()["patches"]]


def test_a_p40_gets_the_attention_import_and_autocast_patches():
    assert patch_names("p40") == [
        "verl-hardcoded-fa2",
        "verl-optional-flash-attn-import",
        "verl-hf-rollout-autocast",
        "verl-actor-autocast",
        "verl-critic-autocast",
        "verl-hf-sharding-manager-timing",
    ]


def test_the_p40_patches_carry_its_attention_and_dtype():
    patches = {p["name"]: p for p in resolved("p40").to_dict()["patches"]}
    assert patches["verl-hardcoded-fa2"]["replace"][0]["with"] == 'attn_implementation="eager"'
    for name in ("verl-hf-rollout-autocast", "verl-actor-autocast", "verl-critic-autocast"):
        assert "dtype=torch.float32, enabled=False" in patches[name]["replace"][0]["with"], name


def test_a_3090_with_flash_attention_and_bf16_needs_no_patch():
    assert patch_names("3090") == []


def test_a_t4_on_verl_061_gets_the_fa2_and_the_critic_autocast_patches():
    assert patch_names("t4") == ["verl-hardcoded-fa2", "verl-critic-autocast"]
    patches = {p["name"]: p for p in resolved("t4").to_dict()["patches"]}
    assert patches["verl-hardcoded-fa2"]["replace"][0]["with"] == 'attn_implementation="sdpa"'
    # the critic trains in fp32 (no loss scaler), though the T4 computes its inference in fp16
    assert patches["verl-critic-autocast"]["replace"][0]["with"].endswith(
        "dtype=torch.float32, enabled=False)"
    )


# -- the dtype of each part of the run ---------------------------------------------------------


@pytest.mark.parametrize(
    "profile, want",
    [
        ("p40", dict(actor="fp32", critic="fp32", ref="fp32", rollout="fp32")),
        ("t4", dict(actor="fp32", critic="fp32", ref="fp16", rollout="fp16")),
        ("v100", dict(actor="fp32", critic="fp32", ref="fp16", rollout="fp16")),
        ("4090", dict(actor="bf16", critic="bf16", ref="bf16", rollout="bf16")),
        ("h200", dict(actor="bf16", critic="bf16", ref="bf16", rollout="bf16")),
    ],
)
def test_each_part_computes_in_what_the_gpu_and_verl_support(profile, want):
    assert resolved(profile).to_dict()["precision"] == want


def test_the_parts_follow_the_matrix_not_the_gpu_name(overlay):
    """A verl release recorded with an fp16 loss scaler for its actor trains the actor in fp16."""
    rec = record("verl", "0.6.1", source="https://example.org")
    rec["precision"] = dict(rec["precision"], actor=["bf16", "fp16", "fp32"])
    folder = overlay({"verl": {"0.6.1": rec}})
    d = resolved("t4", frozen_with(folder)).to_dict()
    assert d["precision"]["actor"] == "fp16" and d["precision"]["critic"] == "fp32"


def test_a_fp16_verl_041_run_patches_the_actor_with_its_training_dtype_and_the_rollout_with_fp16():
    d = resolved("t4", verl="0.4.1", rollout="hf", vllm=None).to_dict()
    patches = {p["name"]: p["replace"][0]["with"] for p in d["patches"]}
    assert "dtype=torch.float32, enabled=False" in patches["verl-actor-autocast"]
    assert "dtype=torch.float16, enabled=True" in patches["verl-hf-rollout-autocast"]


def test_the_audit_checks_what_the_gpu_lacks_with_the_releases_reviewed_lines():
    p40, t4, h200 = (resolved(p).to_dict()["audit"] for p in ("p40", "t4", "h200"))
    assert p40["checks"] == ["autocast_bf16", "flash_attention_2"]
    assert [r["name"] for r in p40["reviewed"]] == ["verl-reward-model-autocast"]
    assert h200 == {"checks": [], "reviewed": []}
    holds = {r["name"]: r["holds"] for r in t4["reviewed"]}
    assert holds["verl-actor-attention-default"] == {
        "actor_rollout_ref.model.override_config.attn_implementation": "sdpa"
    }
    assert holds["verl-reward-model-autocast"] == {"reward_model.enable": False}
    # a bf16 card without flash-attn checks the attention only
    assert resolved("4090").to_dict()["audit"]["checks"] == ["flash_attention_2"]


def test_the_allocator_setting_goes_to_small_cards_but_not_with_vllms_sleep_mode():
    assert resolved("p40").to_dict()["cuda_alloc_conf"]["value"] == "expandable_segments:True"
    t4 = resolved("t4").to_dict()["cuda_alloc_conf"]
    assert t4["value"] is None and "sleep mode" in t4["why"]
    assert resolved("h200").to_dict()["cuda_alloc_conf"] is None
    assert resolved("v100").to_dict()["cuda_alloc_conf"] is None  # 32 GB


def test_a_patch_naming_an_unknown_value_is_refused_when_the_matrix_loads(overlay):
    rec = record("patches", "verl-critic-autocast", source="https://example.org")
    rec["replace"] = [{"find": "x", "with": "dtype=torch.{critic_dtpe}"}]
    folder = overlay({"patches": {"verl-critic-autocast": rec}})
    with pytest.raises(UserError, match=r"\{critic_dtpe\} is not a value envbuild fills in"):
        frozen_with(folder)


def test_a_release_naming_an_unknown_reviewed_exception_is_refused(overlay):
    folder = overlay(
        {"verl": {"0.6.1": record("verl", "0.6.1", reviewed=["nope"], source="https://example.org")}}
    )
    with pytest.raises(UserError, match="verl.0.6.1.reviewed names 'nope'"):
        frozen_with(folder)


# -- the whole ---------------------------------------------------------------------------------


PROBE = Path(__file__).resolve().parent / "purity_probe.py"


def probe(tmp_path: Path, run: str, profiles: list[str], cache: Path | None, plant: str = "") -> dict:
    """tests/purity_probe.py in a fresh process, in a folder of its own, HOME and the cache
    where the test says (`cache` None: ENVBUILD_NO_CACHE=1, every cache bypassed), no bytecode
    written: each environment, and what the resolution did outside its memory."""
    cwd = tmp_path / run
    cwd.mkdir()
    env = conftest.clean_env(
        HOME=str(cwd), XDG_CACHE_HOME=str(cache or cwd / "no-cache"), PYTHONDONTWRITEBYTECODE="1"
    )
    env.pop("PURITY_PLANT", None)
    if cache is None:
        env["ENVBUILD_NO_CACHE"] = "1"
    if plant:
        env["PURITY_PLANT"] = plant
    r = subprocess.run(
        [sys.executable, str(PROBE), *profiles], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    out["left"] = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    return out


def impurity(tmp_path: Path, profiles: list[str], plant: str = "") -> list[str]:
    """What makes resolving `profiles` impure, behind the caches as in front of them: two
    resolutions with every cache bypassed (each in a fresh process, so no memo of a first run
    serves the second) differ, or either touches a file, a socket or a subprocess; or one
    through a cold sealed cache, then through the warm one, differs from them; or the warm one
    writes."""
    found = []
    bare = [probe(tmp_path, f"bare{i}", profiles, None, plant) for i in (1, 2)]
    cache = tmp_path / "cache"
    cold = probe(tmp_path, "cold", profiles, cache, plant)
    warm = probe(tmp_path, "warm", profiles, cache, plant)
    for name, run in (("bypassed", bare[0]), ("bypassed again", bare[1]), ("warm", warm)):
        found += [f"{name}: {e}" for e in run["events"]]
        found += [f"{name}: left {f} in its folder" for f in run["left"]]
    for p in profiles:
        runs = {"bypassed": bare[0], "bypassed again": bare[1], "cold": cold, "warm": warm}
        if len({run["envs"][p] for run in runs.values()}) > 1:
            found.append(f"{p}: the environment differs between runs ({', '.join(runs)})")
    return found


def test_resolving_is_pure(tmp_path):
    """Every profile resolves to the same environment with every cache bypassed (twice, in
    fresh processes), through a cold sealed cache and through the warm one, and the same as in
    this process (memo and all); and with the caches bypassed, or warm, resolving writes no
    file, opens no socket and starts no process. (Before: one resolution compared with its own
    memo, which a plan that read the clock or wrote a file would have passed.)"""
    profiles = conftest.PROFILES
    assert impurity(tmp_path, profiles) == []
    bare = probe(tmp_path, "here", profiles, None)
    assert {p: conftest.resolved(p).to_json() for p in profiles} == bare["envs"]


@pytest.mark.parametrize("plant", ["state", "write", "net"])
def test_an_impurity_behind_the_caches_is_seen(tmp_path, plant):
    """tests/purity_probe.py's planted impurities, each in the memory plan, which the sealed
    cache and the memo serve a second resolution from: one that depends on the process, one
    that writes a file, one that opens a connection. The old check (one resolution against its
    memo) passed all three."""
    found = impurity(tmp_path, ["p40"], plant)
    want = {
        "state": "p40: the environment differs between runs",
        "write": "bypassed: open for writing: ",
        "net": "bypassed: socket.connect: ",
    }[plant]
    assert any(f.startswith(want) for f in found), found


def test_a_rollout_envbuild_cannot_install_is_refused(monkeypatch):
    from envbuilder.model.components import verl as V

    monkeypatch.setattr(V, "INSTALLABLE_ROLLOUTS", ("hf", "vllm"))
    v = violations("t4", rollout="sglang")["rollout"]
    assert v.hard and "--rollout vllm" in v.fix


def test_flash_attn_brings_what_it_imports_at_run_time():
    env = resolved("4090", with_=["flash-attn"]).to_dict()
    assert env["verl"]["pins"]["einops"] == "0.8.1"


# -- verl's torch floor (its own imports, not in its METADATA) -----------------------------------


def test_verl_041_with_torch_231_is_refused_because_fsdp_workers_need_devicemesh():
    v = violations("4090", torch="2.3.1")["verl-torch"]
    assert v.hard
    assert "verl 0.4.1 needs torch>=2.4, not 2.3.1" in v.what
    assert "DeviceMesh" in v.why and "verl.workers.fsdp_workers" in v.why


def test_the_verl_torch_fix_resolves():
    fix = violations("4090", torch="2.3.1")["verl-torch"].fix
    torch = re.search(r"--torch (\S+)", fix).group(1)
    env = resolved("4090", torch=torch).to_dict()
    assert env["torch"]["version"] == torch and env["cuda"]["version"] == "12.1"


# -- shared dependencies: what two installed packages require of a third ------------------------


def test_t4_gets_the_ray_that_vllm_085_can_live_with():
    pins = resolved("t4").to_dict()["verl"]["pins"]
    assert pins["ray[default]"] == "2.47.1"  # vllm.yaml's pairing over verl 0.6.1's 2.49.2


def test_ray_249_with_vllm_085_is_refused_naming_opentelemetry(overlay):
    prof = record("profiles", "t4", pins={"ray[default]": "2.49.2"}, source="https://example.org")
    v = violations("t4", frozen_with(overlay({"profiles": {"t4": prof}})))["shared-dependency"]
    assert v.hard
    assert "vllm==0.8.5.post1" in v.what and "ray[default]==2.49.2" in v.what
    assert "opentelemetry-sdk>=1.26.0,<1.27.0" in v.why and "opentelemetry-sdk>=1.30.0" in v.why


def test_a_pin_outside_a_packages_requirement_is_refused(overlay):
    prof = record("profiles", "t4", pins={"opentelemetry-sdk": "1.30.0"}, source="https://example.org")
    v = violations("t4", frozen_with(overlay({"profiles": {"t4": prof}})))["shared-dependency"]
    assert "opentelemetry-sdk==1.30.0 is pinned but vllm==0.8.5.post1 needs" in v.what


def test_overlapping_requirements_pass():
    from envbuilder.model.versions import ranges_overlap

    assert ranges_overlap(">=1.26.0,<1.27.0", ">=1.26.5")
    assert not ranges_overlap(">=1.26.0,<1.27.0", ">=1.30.0")
    assert not ranges_overlap("<1.27", ">=1.27") and ranges_overlap("<=1.27", ">=1.27")
    assert ranges_overlap("==2.0", ">=1.0,<3") and not ranges_overlap("==2.0", ">2.0")


# -- what render --from checks a file against is what the resolver writes -----------------------


def saved_variants(matrix=None):
    """The envbuild.json of every profile (of the frozen matrix, or `matrix`) as render writes
    it: plain, pinned by its lock, through a mirror set; and one with each optional part
    (--driver, overrides, warnings, no dataset)."""
    from envbuilder.context.prepare import prepare
    from envbuilder.model import mirrors

    m = matrix or frozen()
    cn = mirrors.choice("cn", mirrors.get_set(m, "cn"))
    for name in m.profiles:
        env = resolved(name, m)
        yield name, env.to_json()
        yield f"{name} locked", saved_text(pinned(env))
        yield f"{name} --mirror cn", saved_text(prepare(env, mirror=cn))
    yield "driver", resolved("t4", driver="535.104.05").to_json()
    yield "overrides", resolved("4090", with_=["flash-attn"], python="3.10", torch="2.4.0").to_json()
    yield "warnings", resolved("p40", rollout="vllm", cuda="12.4", allow_unsupported=True).to_json()


def test_every_resolved_environment_is_of_the_kinds_render_from_checks():
    """resolved.field_spec(), checked whole (no key missing, none unknown): a key the resolver
    starts to write must get its kind there, or every `render --from` of it is refused."""
    from envbuilder.model import schema as S
    from envbuilder.model.resolved import field_spec

    for label, text in saved_variants():
        S.check(json.loads(text), field_spec(), f"{label}: ")


@pytest.mark.parametrize(
    "path, value, named",
    [
        (("profile",), "../../escaped", "profile"),
        (("train", "model"), "Qwen/$(touch x)", "train.model"),
        (("gpu", "name"), 'P40"""', "gpu.name"),
        (("memory", "batch", "val_batch_size"), "8\nrm -rf ~", "memory.batch.val_batch_size"),
        (("verl", "pins"), {"numpy; touch x": "1.0"}, "verl.pins"),
        (("huggingface",), "https://hf.example/{x}", "huggingface"),
        (("surprise",), {"a": ["x\nRUN y"]}, "surprise.a[0]"),
    ],
)
def test_a_spec_file_value_of_the_wrong_kind_is_refused_naming_its_key(path, value, named):

    data = json.loads(resolved("p40").to_json())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(UserError) as e:
        env_from_json(json.dumps(data), "edited.json")
    assert f"edited.json: {named}" in str(e.value)


def test_a_spec_file_from_an_older_envbuild_may_hold_keys_this_one_no_longer_writes():
    from envbuilder.model.runplan import saved_from_json

    ctx = pinned(resolved("4090"))
    data = json.loads(saved_text(ctx))
    data["constraints"]["order"] = ["torch", "verl-deps", "verl"]  # (dropped in 80dbd6c)
    env, pins = saved_from_json(json.dumps(data))
    assert pins == ctx.constraints and env == ctx.env
    assert "order" not in pins.to_dict()  # (read, not carried on)


def test_a_spec_file_that_lacks_keys_is_refused_naming_them_all():

    with pytest.raises(UserError) as e:
        env_from_json('{"schema_version": 1, "profile": "p40", "gpu": {"sm": "61"}}')
    msg = str(e.value)
    assert (
        "envbuild_version is missing; description is missing; overrides is missing; gpu.key is missing" in msg
    )
    assert "more)" in msg and "envbuild render p40" in msg


def test_vllm_0_7_3_is_refused_beside_verls_ray_pins():
    """vLLM 0.7.3 pins ray[adag]==2.40.0; verl 0.4.1/0.5.0 pin ray 2.46.0/2.47.1 (found by
    `envbuild refresh` on PyPI's metadata; uv refuses the pair). The resolver used to accept it."""
    v = violations("t4", verl="0.5.0", torch="2.5.1", vllm="0.7.3")
    assert "shared-dependency" in v
    assert "vllm==0.7.3 needs ray[default]==2.40.0" in v["shared-dependency"].text()


# -- flash-attn: a prebuilt wheel, or a source build said before it starts ---------------------


def test_flash_attn_with_a_published_wheel_makes_no_note():
    env = resolved("4090", with_=["flash-attn"])
    assert env.flash_attn.version == "2.6.3" and not any("flash-attn" in n for n in env.notes)


def test_flash_attn_without_a_published_wheel_says_it_compiles_and_how_long():
    """2.6.3's release builds torch 2.0-2.4: a torch 2.5 compiles it from the sdist."""
    notes = [n for n in resolved("4090", with_=["flash-attn"], torch="2.5.1").notes if "flash-attn" in n]
    assert len(notes) == 1
    assert "no prebuilt flash-attn 2.6.3 wheel for torch 2.5.1 (its wheels: torch>=2.2,<2.5)" in notes[0]
    assert "compiles it from the sdist" in notes[0] and "64-core" in notes[0]


def test_the_wheel_gap_names_torch_cuda_and_python():
    from envbuilder.model.components.flash_attn import wheel_gap as flash_attn_wheel_gap

    rec = frozen().flash_attn["versions"]["2.8.3"]
    assert flash_attn_wheel_gap(rec, "2.8.0", "12.8", "3.10") is None
    assert "torch 2.9.1" in flash_attn_wheel_gap(rec, "2.9.1", "12.8", "3.10")
    assert "CUDA 11.8 (its wheels: CUDA 12)" in flash_attn_wheel_gap(rec, "2.6.0", "11.8", "3.10")
    assert "CUDA 13.0" in flash_attn_wheel_gap(rec, "2.8.0", "13.0", "3.10")
    assert "Python 3.8" in flash_attn_wheel_gap(rec, "2.8.0", "12.8", "3.8")
