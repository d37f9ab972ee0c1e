"""The SGLang rollout (`--rollout sglang`): the release verl's `sglang` extra pins (verl.yaml
`sglang`, sglang.yaml), its install layer, the training path, the run script, and the refusals
(a card below its kernels' floor, a verl release whose pin cannot be installed, a torch other
than the one it pins), each with a fix that resolves. The real-PyPI tier below resolves the
pinned sets with uv (metadata only) and composes the run script with each release's own Hydra
config."""

from __future__ import annotations

import subprocess

import pytest

from conftest import frozen, resolved, shipped, violations
from envbuilder.model.components.sglang import kernel_runs
from envbuilder.model.resolve import training_path
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext
from envbuilder.render.plan import install_plan, requirements_in

# (profile, overrides) that resolve with the SGLang rollout: verl 0.6.1 (sync rollout, sglang
# 0.5.5, torch 2.8.0), 0.8.0 (async only, sglang 0.5.8, torch 2.9.1) and 0.4.1 (sglang
# 0.4.6.post5, torch 2.6.0, a T4's sm_75)
WORKING = [
    ("h100", dict(rollout="sglang", verl="0.6.1")),
    ("h100", dict(rollout="sglang", verl="0.8.0", torch="2.9.1")),
    ("t4", dict(rollout="sglang", verl="0.4.1", torch="2.6.0", cuda="12.6")),
]


@pytest.mark.parametrize("profile, ov", WORKING)
def test_the_sglang_release_is_the_one_verls_extra_pins_with_its_torch(profile, ov):
    env = resolved(profile, **ov)
    m = shipped()
    want = m.verl[ov["verl"]]["sglang"]["version"]
    assert env.rollout == "sglang" and env.vllm is None
    assert env.sglang.version == want and env.sglang.torch == env.torch.version
    sr = m.sglang[want]
    assert env.sglang.kernel == f"{sr['kernel']['package']}=={sr['kernel']['version']}"
    # SGLang pins transformers exactly: its pin replaces verl's own
    assert env.verl.pins["transformers"] == sr["pins"]["transformers"]


def test_the_install_plan_has_an_sglang_step_between_torch_and_verls_dependencies():
    env = resolved("h100", rollout="sglang", verl="0.8.0", torch="2.9.1")
    plan = install_plan(env, None)
    assert [s.name for s in plan.layers] == ["torch", "sglang", "verl-deps", "verl"]
    step = plan.layers[1]
    assert step.requirements == ("sglang==0.5.8", "sgl-kernel==0.3.21")
    assert "sglang==0.5.8\nsgl-kernel==0.3.21\n" in requirements_in(env)
    deps = dict(r.split("==") for r in plan.layers[2].requirements)
    assert deps["transformers"] == "4.57.1"
    files = render_files(BuildContext.of(env))
    assert "-c constraints/sglang.txt" in files["requirements.txt"]
    assert "sglang==0.5.8" in files["requirements.txt"] and "sgl-kernel==0.3.21" in files["environment.yml"]
    assert "# SGLang 0.5.8 and its kernels: pins torch==2.9.1" in files["Dockerfile"]
    assert "sglang==0.5.8 sgl-kernel==0.3.21" in files["Dockerfile"]
    assert "constraints/sglang.txt" in files


def test_verls_own_extra_packages_and_extras_are_asked_for_on_0_4():
    env = resolved("t4", rollout="sglang", verl="0.4.1", torch="2.6.0", cuda="12.6")
    assert env.sglang.requirement == "sglang[openai,srt]==0.4.6.post5"
    assert env.verl.pins["torch-memory-saver"] == "0.0.10"
    assert env.verl.pins["transformers"] == "4.51.1"


def test_a_vllm_profile_is_unchanged_by_the_sglang_step():
    env = resolved("h100")
    assert env.sglang is None and "sglang" not in env.to_dict()
    assert [s.name for s in install_plan(env, None).layers] == ["torch", "vllm", "verl-deps", "verl"]


@pytest.mark.parametrize("profile, ov", WORKING)
def test_the_training_path_loads_sglangs_compiled_ops_first_then_verls_rollout(profile, ov):
    env = resolved(profile, **ov)
    path = list(env.training_path)
    assert path[:3] == ["sgl_kernel", "sglang", "sglang.srt.entrypoints.engine"]
    verl_part = shipped().verl[ov["verl"]]["training_path"]["rollouts"]["sglang"]
    assert path[-len(verl_part) :] == verl_part
    assert not any(x.startswith("vllm") for x in path)
    comps = tuple(c for c, rec in (("flash-attn", env.flash_attn), ("apex", env.apex)) if rec)
    assert path == training_path(shipped(), ov["verl"], "sglang", comps)


def test_the_run_script_names_the_sglang_rollout_and_async_mode_where_the_release_has_only_it():
    sync = render_files(BuildContext.of(resolved("h100", rollout="sglang", verl="0.6.1")))["run_ppo_gsm8k.sh"]
    assert "actor_rollout_ref.rollout.name=sglang" in sync and "rollout.mode=async" not in sync
    asy = render_files(BuildContext.of(resolved("h100", rollout="sglang", verl="0.8.0", torch="2.9.1")))[
        "run_ppo_gsm8k.sh"
    ]
    assert "actor_rollout_ref.rollout.name=sglang" in asy and "actor_rollout_ref.rollout.mode=async" in asy


def test_envbuild_json_round_trips_the_sglang_record():
    from envbuilder.model.runplan import env_from_json

    env = resolved("h100", rollout="sglang", verl="0.6.1")
    back = env_from_json(env.to_json())
    assert back.sglang == env.sglang and back.to_dict() == env.to_dict()


# -- refusals: what, why, and a fix that resolves (fixes.checked keeps only those) --------------


def test_a_p40_is_below_sglangs_kernels_and_is_told_to_use_the_hf_rollout():
    v = violations("p40", rollout="sglang")["sglang-cc"]
    assert v.hard
    assert "Tesla P40 (CC 6.1)" in v.what and "SGLang 0.4.6.post5" in v.what
    assert "sgl-kernel 0.1.4" in v.why and "sm_75" in v.why and "no PTX" in v.why
    assert v.fix == "use --rollout hf"
    resolved("p40", rollout="hf")


def test_a_v100_runs_no_sglang_kernel_and_is_told_to_use_vllm():
    v = violations("v100", rollout="sglang")
    assert set(v) == {"sglang-cc"}  # (nothing else is said of an install that cannot run)
    assert "CC 7.0" in v["sglang-cc"].what and "--rollout vllm" in v["sglang-cc"].fix


def test_a_b300_has_no_arch_specific_kernel_of_its_own():
    # sm_100a runs on CC 10.0 only; sglang-kernel 0.4.2.post2 (sglang 0.5.12) adds sm_103a
    assert kernel_runs("10.0", ["8.0", "10.0a"]) and not kernel_runs("10.3", ["8.0", "10.0a"])
    assert kernel_runs("8.6", ["8.0"]) and not kernel_runs("7.5", ["8.0", "9.0a"])
    v = violations("b300", rollout="sglang", verl="0.8.0", torch="2.9.1")
    assert "sglang-cc" in v and "CC 10.3" in v["sglang-cc"].what


@pytest.mark.parametrize("verl", ["0.9.0", "0.9.1"])
def test_verl_0_9_is_refused_because_sglangs_transformers_pin_contradicts_verls(verl):
    v = violations("h100", rollout="sglang", verl=verl)["sglang-verl"]
    assert v.hard and f"verl {verl}'s SGLang rollout cannot be installed" in v.what
    assert "transformers==" in v.why and f"https://pypi.org/project/verl/{verl}/#files" in v.why
    assert "--verl 0.8.0 --torch 2.9.1" in v.fix and "--rollout vllm" in v.fix
    resolved("h100", rollout="sglang", verl="0.8.0", torch="2.9.1")


def test_the_profiles_own_verl_0_9_1_is_refused_with_the_newest_release_that_installs():
    v = violations("h100", rollout="sglang")["sglang-verl"]
    assert "sglang==0.5.12" in v.why and "override" in v.why
    assert v.fix.startswith("use --verl 0.8.0 --torch 2.9.1")


def test_a_torch_other_than_sglangs_pin_is_an_abi_mismatch_with_the_torch_that_works():
    v = violations("h100", rollout="sglang", verl="0.8.0")["sglang-torch"]
    assert "sglang 0.5.8 with torch 2.9.0" in v.what and "torch==2.9.1" in v.why
    assert v.fix == "use --torch 2.9.1"


def test_a_matrix_without_the_releases_sglang_facts_refuses_rather_than_guess():
    # the frozen fixture matrix (verl 0.4.1-0.6.1) lists the rollout but holds no sglang.yaml
    v = violations("h100", frozen(), rollout="sglang")
    assert any(x.hard for x in v.values())
    assert "sglang" in v and "no SGLang release" in v["sglang"].what


def test_the_cli_refuses_with_exit_2_and_the_whole_message(run_envbuild):
    r = run_envbuild("render", "p40", "--rollout", "sglang")
    assert r.returncode == 2, r.stderr
    assert "[sglang-cc]" in r.stderr and "Fix: use --rollout hf." in r.stderr
    r = run_envbuild("show", "h100", "--rollout", "sglang", "--verl", "0.9.0")
    assert r.returncode == 2 and "[sglang-verl]" in r.stderr and "transformers" in r.stderr


# -- the real-PyPI tier ---------------------------------------------------------------------------


def _uv_compile(pypi: str, reqs: list[str], python: str, glibc: str, tmp_path) -> subprocess.CompletedProcess:
    """`uv pip compile` of `reqs` for the target, from metadata only (PEP 658: no torch wheel is
    downloaded), as envbuild lock runs it."""
    from envbuilder.lock.pip import compile_args
    from envbuilder.secret import SecretUrl
    from envbuilder.tools.uv import index_env, uv_bin, uv_env

    (tmp_path / "requirements.in").write_text("".join(f"{r}\n" for r in reqs))
    return subprocess.run(
        [
            uv_bin(),
            "pip",
            "compile",
            *compile_args("sglang-test", python, glibc, False),
            "requirements.in",
        ],
        cwd=tmp_path,
        env={**uv_env(), **index_env(SecretUrl(pypi))},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("profile, ov", WORKING[:2])
def test_the_whole_sglang_plan_resolves_on_pypi(real_pypi, tmp_path, profile, ov):
    env = resolved(profile, **ov)
    assert env.torch.index_url is None  # (PyPI's own torch build: no PyTorch index needed)
    r = _uv_compile(real_pypi, requirements_in(env).split(), env.python, env.cuda.glibc, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    sr = shipped().sglang[env.sglang.version]
    for pin in (
        f"sglang=={env.sglang.version}",
        f"torch=={env.torch.version}",
        f"{sr['kernel']['package']}=={sr['kernel']['version']}",
        f"flashinfer-python=={sr['flashinfer']}",
        f"transformers=={sr['pins']['transformers']}",
    ):
        assert f"\n{pin}\n" in r.stdout, pin


@pytest.mark.parametrize("verl", ["0.9.0", "0.9.1"])
def test_the_refused_verl_0_9_sglang_pins_do_not_resolve_on_pypi(real_pypi, tmp_path, verl):
    """The source of the refusal: uv itself finds no solution for verl's sglang pin beside verl
    (0.9.0) or beside the transformers its extra pins (0.9.1), for the release's own Python."""
    m = shipped()
    rec = m.verl[verl]["sglang"]
    sr = m.sglang[rec["version"]]
    python, glibc = ("3.12", "2.39") if verl == "0.9.1" else ("3.10", "2.35")
    reqs = [
        f"torch=={sr['torch']}",
        f"sglang=={rec['version']}",
        f"transformers=={m.verl[verl]['pins']['transformers']}",
        f"verl=={verl}",
    ]
    r = _uv_compile(real_pypi, reqs, python, glibc, tmp_path)
    assert r.returncode != 0
    assert "No solution found" in r.stderr and "transformers==" in r.stderr, r.stderr[-3000:]
    assert f"sglang=={rec['version']} depends on transformers==" in r.stderr.replace("\n", " ")


@pytest.mark.parametrize("profile, ov", WORKING)
def test_the_sglang_run_script_composes_with_the_releases_own_config(verl_trees, profile, ov):
    from omegaconf import OmegaConf
    from verlconfig import compose_run_config, run_script_overrides

    env = resolved(profile, **ov)
    cfg = compose_run_config(
        verl_trees[env.verl.version],
        run_script_overrides(render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]),
    )
    assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.name") == "sglang"
    mode = OmegaConf.select(cfg, "actor_rollout_ref.rollout.mode")
    assert mode == ("async" if env.verl.rollout_mode == "async" else "sync"), mode
    assert (
        OmegaConf.select(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization")
        == env.train.gpu_memory_utilization
    )


def test_a_lock_of_an_sglang_plan_splits_into_the_sglang_step_by_its_dependency_edges():
    """The lock's pip part pins whatever the plan lists: uv's annotated requirements.lock (the
    `# via` edges) split into the install steps, the sglang step holding what sglang and its
    kernel pull in that torch did not."""
    from envbuilder.lock.pins import constraint_layers

    env = resolved("h100", rollout="sglang", verl="0.8.0", torch="2.9.1")
    lock = "".join(
        f"{name}=={version}\n    # via {via}\n"
        for name, version, via in [
            ("torch", "2.9.1", "-r requirements.in"),
            ("torchvision", "0.24.1", "-r requirements.in"),
            ("torchaudio", "2.9.1", "-r requirements.in"),
            ("filelock", "3.20.0", "torch"),
            ("sglang", "0.5.8", "-r requirements.in"),
            ("sgl-kernel", "0.3.21", "-r requirements.in"),
            ("flashinfer-python", "0.6.1", "sglang"),
            ("transformers", "4.57.1", "-r requirements.in"),
            ("verl", "0.8.0", "-r requirements.in"),
            ("codetiming", "1.4.0", "-r requirements.in"),
        ]
    )
    layers = constraint_layers(env, lock, torch_swapped=False)
    assert layers["sglang"] == ["flashinfer-python==0.6.1", "sgl-kernel==0.3.21", "sglang==0.5.8"]
    assert "filelock==3.20.0" in layers["torch"] and "transformers==4.57.1" in layers["verl-deps"]
    assert layers["vllm"] == []
