"""verl's Megatron engine (issue 48): `--engine megatron` renders megatron-core, mbridge and
TransformerEngine as building blocks of the install, a Megatron layout (tensor, pipeline,
expert parallel) chosen by the memory plan, and a run script on verl's megatron config; the
record of verl 0.9.1's own validate_config on those run scripts (tests/fixtures/gpu/validate/
megatron-verl-0.9.1.json: `bench/verl_validate.py cases --megatron SHAPES`, then `device` in a
venv with verl 0.9.1, torch 2.11.0, megatron-core 0.18.0 and TransformerEngine 2.12.0 from PyPI,
on this machine's CPU) counts only while today's renders give the same overrides."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import bench_module, resolved, violations
from envbuilder.model import runplan
from envbuilder.model.batches import violations as batch_violations
from envbuilder.model.megatron import Layout, fits_model, layouts, shard_params
from envbuilder.model.arch import Arch
from envbuilder.model.matrix import load
from envbuilder.render.plan import install_plan, layer_roots
from envbuilder.render.steps import TRANSFORMER_ENGINE, Compile, install_steps

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "megatron-verl-0.9.1.json"
MOE = "Qwen/Qwen3-30B-A3B"


def args(env) -> dict[str, str]:
    return dict(o.split("=", 1) for o in runplan.overrides(env.run, runplan.world(env)))


@pytest.fixture(scope="module")
def moe() -> Arch:
    return Arch(MOE, load().models[MOE])


# ---- the layout ---------------------------------------------------------------------------------


def test_a_gpu_holds_its_shard_of_the_dense_part_and_of_the_experts(moe):
    whole = shard_params(moe, Layout(), moe.params())
    assert whole[0] + whole[1] == pytest.approx(moe.params())  # one GPU holds it all
    experts = moe.L * moe.E * 3 * moe.H * moe.Ie
    assert whole[1] == experts and experts > 0.9 * moe.params()  # (30B-A3B: mostly experts)
    dense, ex = shard_params(moe, Layout(tp=2, ep=8), moe.params())
    assert ex == pytest.approx(experts / 8) and dense == pytest.approx(whole[0] / 2)
    dense4, _ = shard_params(moe, Layout(tp=2, pp=4, ep=8), moe.params())
    assert dense4 < dense  # (a stage holds a quarter of the layers and one of embedding or head)


def test_megatron_core_refuses_what_does_not_divide(moe):
    assert fits_model(moe, Layout(tp=8), 8, 8) is not None  # 4 KV heads (query groups)
    assert "layers" in (fits_model(moe, Layout(pp=5), 8, 40) or "")
    assert "experts" in (fits_model(moe, Layout(ep=3), 8, 24) or "")
    assert fits_model(moe, Layout(tp=4, pp=2, ep=2, etp=4), 8, 8) is not None  # verl's example's 16 > 8
    assert fits_model(moe, Layout(tp=2, ep=8), 8, 8) is None
    order = layouts(moe, 8, 8)
    assert order[0] == Layout(tp=1, pp=1, ep=8)  # fewest GPUs a replica spans, experts widest
    assert all(fits_model(moe, lay, 8, 8) is None for lay in order)


# ---- renders: the plans and verl's example layouts -----------------------------------------------


def test_qwen3_moe_on_two_h100_nodes_takes_verl_example_layout():
    # verl's Qwen3-30B-A3B Megatron example for 96 GB cards (v0.7.1 run_qwen3moe-30b_megatron_96gb.sh,
    # "tested in NNODES=1~4"): TP 1, PP 1, EP 8, ETP 1; here without offload on 16 H100s
    env = resolved("h100", model=MOE, algo="grpo", engine="megatron", nodes=2)
    lay = env.train.megatron
    assert (lay.tp, lay.pp, lay.ep, lay.etp, lay.cp) == (1, 1, 8, 1, 1)
    assert not env.train.param_offload and not env.train.optimizer_offload
    a = args(env)
    assert a["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] == "8"
    assert a["actor_rollout_ref.actor.megatron.expert_tensor_parallel_size"] == "1"
    assert a["trainer.nnodes"] == "2" and not env.memory["problems"]


def test_qwen3_moe_on_one_h100_node_offloads_and_splits_wider():
    env = resolved("h100", model=MOE, algo="grpo", engine="megatron")
    lay = env.train.megatron
    assert (lay.pp, lay.ep, lay.etp) == (1, 8, 1) and lay.tp == 4
    assert env.train.param_offload and env.train.optimizer_offload
    # with the host memory of a DGX H100 for offload, verl's own 8-GPU layout (gspo and dppo
    # examples, v0.9.0: actor_tp=2 actor_pp=1 actor_ep=8 actor_etp=1, every offload on)
    big = resolved("h100", model=MOE, algo="grpo", engine="megatron", host_memory=1024)
    assert (big.train.megatron.tp, big.train.megatron.ep) == (2, 8) and big.train.param_offload
    why = env.memory["choices"]["megatron"]["why"]
    assert "EP 8: 16 a GPU" in why


def test_the_run_script_selects_megatron_and_moves_every_fsdp_setting():
    env = resolved("h100", model=MOE, algo="gae", engine="megatron", nodes=2)
    over = runplan.overrides(env.run, runplan.world(env))
    assert over[0] == "model_engine=megatron"
    assert not [o for o in over if "fsdp" in o.split("=")[0]]
    a = args(env)
    for section in ("actor_rollout_ref.actor.megatron", "critic.megatron"):
        assert a[f"{section}.tensor_model_parallel_size"] == str(env.train.megatron.tp)
        assert a[f"{section}.pipeline_model_parallel_size"] == str(env.train.megatron.pp)
    assert a["actor_rollout_ref.actor.megatron.vanilla_mbridge"] == "True"
    assert a["++critic.megatron.micro_batch_size_per_gpu"] == a["critic.ppo_micro_batch_size_per_gpu"]
    assert (
        a["actor_rollout_ref.rollout.expert_parallel_size"]
        == a["actor_rollout_ref.rollout.tensor_model_parallel_size"]
    )
    assert batch_violations(runplan.as_config(env.run, runplan.world(env)), True) == []


def test_the_batch_check_divides_by_megatron_data_parallel_ranks():
    env = resolved("h100", model=MOE, algo="gae", engine="megatron", nodes=2)
    cfg = runplan.as_config(env.run, runplan.world(env))
    cfg["critic"]["megatron"]["tensor_model_parallel_size"] = 3  # (16 GPUs: no whole DP)
    assert any("data-parallel group" in v for v in batch_violations(cfg, True))


def test_the_fsdp_plan_counts_every_expert_sharded_and_megatron_only_its_own():
    fsdp = resolved("h100", model=MOE, algo="grpo", nodes=2).memory
    mega = resolved("h100", model=MOE, algo="grpo", engine="megatron", nodes=2).memory

    def term(mem, name):
        update = next(p for p in mem["phases"] if p["key"] == "actor")
        return next(t for t in update["terms"] if t["term"] == name)

    assert "/ 16 GPUs" in term(fsdp, "actor weights")["formula"]  # FSDP: every expert / world
    assert "EP 8" in term(mega, "actor weights")["formula"]  # Megatron: 16 experts a GPU
    assert "data-parallel" in term(mega, "actor optimizer state")["formula"]


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "kw", "words"),
    [
        ("t4", {}, "compute capability 7.5"),  # below TransformerEngine's Ampere floor
        ("gh200", {}, "aarch64"),  # no TransformerEngine core wheel for it
        ("h100", {"verl": "0.8.0"}, "no Megatron stack for verl 0.8.0"),
        ("h100", {"rollout": "sglang"}, "vLLM's rollout only"),
        ("h100", {"megatron": ("tp=3",)}, "does not divide"),
        ("h100", {"megatron": ("zz=2",)}, "tp=N,pp=N,ep=N,cp=N"),
        ("h100", {"sp": "2"}, "--megatron cp=2"),  # (Ulysses is FSDP's)
    ],
)
def test_what_cannot_run_the_megatron_engine_is_refused_with_a_fix(cli, profile, kw, words):
    flags = ["--engine", "megatron"]
    for k, v in kw.items():
        flags += [f"--{k}", ",".join(v) if isinstance(v, tuple) else v]
    code, _, err = cli("render", profile, *flags, "-o", "out")
    assert code == 2 and words in err, err
    assert not Path("out").exists()  # (nothing half-written)


def test_a_layout_without_the_engine_is_refused(cli):
    code, _, err = cli("render", "h100", "--megatron", "tp=2", "-o", "out")
    assert code == 2 and "--engine megatron" in err


def test_a_gae_moe_that_fits_no_node_names_grpo_and_a_second_node():
    v = violations("h100", model=MOE, algo="gae", engine="megatron")["memory"]
    assert "--algo grpo" in v.fix and "--nodes 2" in v.fix


# ---- the install: building blocks in every route ---------------------------------------------


def test_the_install_adds_the_megatron_layer_and_compiles_transformer_engine():
    env = resolved("h100", model=MOE, algo="grpo", engine="megatron", nodes=2)
    roots = layer_roots(env)
    assert list(roots)[-1] == "megatron"
    assert "megatron-core==0.18.0" in roots["megatron"] and "mbridge==0.15.1" in roots["megatron"]
    assert "transformer-engine-cu13==2.12.0" in roots["megatron"]
    steps = install_steps(env, install_plan(env, None))
    te = [s for s in steps if isinstance(s, Compile)]
    assert te == [Compile(TRANSFORMER_ENGINE, "2.12.0", "90")] and env.needs_builder
    plain = resolved("h100")
    assert "megatron" not in layer_roots(plain) and not plain.needs_builder


def test_each_route_compiles_transformer_engine_for_the_card_alone():
    golden = ROOT / "tests" / "golden" / "h100-megatron"
    docker = (golden / "Dockerfile").read_text()
    for text in (docker, (golden / "apptainer.def").read_text(), (golden / "requirements.txt").read_text()):
        assert "NVTE_CUDA_ARCHS=90 NVTE_PYTORCH_FORCE_BUILD=TRUE" in text
        assert "--no-build-isolation --no-deps transformer_engine_torch==2.12.0" in text
        assert "nvidia.__path__" in text  # (cuDNN's and NCCL's headers from torch's wheels)
    assert "AS builder" in docker and "megatron-core==0.18.0" in docker


# ---- verl's own validate_config ---------------------------------------------------------------


def test_verl_091_validate_config_accepted_every_megatron_render_of_today():
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    assert (rec["verl"], rec["torch"]) == ("0.9.1", "2.11.0")
    today = {c["case"]: c for c in bench_module("verl_validate").megatron_grid()}
    runs = {r["case"]: r for r in rec["runs"]}
    assert sorted(runs) == sorted(today)
    for name, case in today.items():
        r = runs[name]
        assert r["validated"] and r["strategy"] == ("fsdp" if "+enginefsdp" in name else "megatron"), name
        assert r["fingerprint"] == case["fingerprint"], (
            f"{name}: re-run bench/verl_validate.py (the render changed)"
        )
        assert r["layout"] == case["layout"]
    # Qwen3-30B-A3B on 8 GPUs and on 2 x 8, as the issue asks; a DeepSeek-style MoE on both engines
    assert {"h100/Qwen_Qwen3-30B-A3B/grpo/1x8", "h100/Qwen_Qwen3-30B-A3B/grpo/2x8"} <= set(runs)
    assert {
        "h100/moonshotai_Moonlight-16B-A3B/grpo/1x8",
        "h100/moonshotai_Moonlight-16B-A3B/grpo/1x8+enginefsdp",
    } <= set(runs)


# ---- a DeepSeek-style mixture: MLA, shared experts, a dense first layer ------------------------

MOONLIGHT = "moonshotai/Moonlight-16B-A3B"
# Moonlight-16B-A3B's config.json (matrices/models.yaml `moonlight`); DeepSeek-V2-Lite's differs in
# its dense MLP, vocabulary and model type (a Lite-Chat weight dump counts 15,706,484,224)
MOONLIGHT_CONFIG = {
    "model_type": "deepseek_v3",
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
}


def test_a_deepseek_config_counts_mla_shared_experts_and_its_dense_layer():
    from envbuilder.model.architectures import arch_from_config

    rec = arch_from_config(MOONLIGHT_CONFIG, "config.json", MOONLIGHT)
    assert rec["parameters"] == 15_960_110_208 == load().models[MOONLIGHT]["parameters"]
    lite = dict(MOONLIGHT_CONFIG, model_type="deepseek_v2", intermediate_size=10944, vocab_size=102400)
    assert arch_from_config(lite, "config.json", "lite")["parameters"] == 15_706_484_224
    a = Arch(MOONLIGHT, rec)
    # 26 sparse layers of 64 routed experts: what EP splits
    assert a.moe_layers == 26 and a.expert_params() == 26 * 64 * 3 * 2048 * 1408
    with pytest.raises(Exception, match="moe_layer_freq"):
        arch_from_config(dict(MOONLIGHT_CONFIG, moe_layer_freq=2), "config.json", MOONLIGHT)


def test_vllm_caches_mla_latent_whole_on_each_rank():
    env = resolved("h100", model=MOONLIGHT, algo="grpo", engine="megatron")
    gen = next(p for p in env.memory["phases"] if p["key"] == "generation")
    kv = next(t for t in gen["terms"] if t["term"].startswith("KV cache"))
    assert "(512+64) MLA latent" in kv["formula"]
    tp, b = env.memory["rollout_tp"], gen["batch"]
    tokens = 1024 if kv["term"] == "KV cache (prompt)" else 2048  # (prefill or the last step)
    assert kv["bytes"] == b * tokens * tp * 27 * 576 * 2  # (576 values a token and layer, bf16)


def test_a_deepseek_style_moe_plans_on_both_engines():
    fsdp = resolved("h100", model=MOONLIGHT, algo="grpo")
    mega = resolved("h100", model=MOONLIGHT, algo="grpo", engine="megatron")
    assert not fsdp.memory["problems"] and not mega.memory["problems"]
    assert mega.train.megatron.ep == 8 and 64 % mega.train.megatron.ep == 0
    assert args(mega)["model_engine"] == "megatron" and "model_engine" not in args(fsdp)


# ---- the offline route: the wheelhouse carries PyPI's CUDA compiler ----------------------------

NVCC_SH = '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88 (wheelhouse stand-in)"\n'
# the extension's stand-in sdist: fixture_wheels' in-tree backend, whose build runs only with the
# nvcc of CUDA_HOME (the first on PATH) and records in the module which one it ran and what it said
TE_BUILD_HOOK = """\
import shutil, subprocess

def _built():
    nvcc = shutil.which("nvcc")
    assert nvcc == os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"), (nvcc, os.environ["CUDA_HOME"])
    said = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    seen = {"nvcc": nvcc, "version": said, "CUDA_HOME": os.environ["CUDA_HOME"],
            "NVTE_CUDA_ARCHS": os.environ.get("NVTE_CUDA_ARCHS"), "CPATH": os.environ.get("CPATH")}
    return ("SEEN = " + repr(seen) + "\\n").encode()
"""


def _te_sdist(dest: Path) -> Path:
    from fixture_wheels import make_sdist

    return make_sdist(dest, "transformer_engine_torch", "2.12.0", build_hook=TE_BUILD_HOOK)


def toolchain_wheels(dest: Path) -> dict[str, Path]:
    """Stand-ins of PyPI's CUDA 13.0 compiler wheels (nvcc an executable under nvidia/cu13/bin,
    as the real wheel unpacks it) and of the build requirements (a dist-info, no module: the
    stand-in build needs none), {project: wheel}."""
    import zipfile

    from fixture_wheels import make_wheel

    from envbuilder.model.components import transformer_engine as TE

    out = {}
    plat = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
    for name in TE.TOOLCHAIN:
        files = {"nvidia/cu13/bin/nvcc": NVCC_SH} if name == "nvidia-cuda-nvcc" else {}
        out[name] = make_wheel(dest, name, "13.0.88", tag=plat, files=files)
    for name in TE.BUILD_REQUIRES:
        out[name] = make_wheel(dest, name, "1.0", tag=plat if name == "ninja" else "py3-none-any")
    nvcc = out["nvidia-cuda-nvcc"]  # (rewritten with nvcc's mode: pip keeps an executable bit)
    with zipfile.ZipFile(nvcc) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(nvcc, "w") as z:
        for info, data in entries:
            if info.filename.endswith("/bin/nvcc"):
                info.external_attr = 0o100755 << 16  # (a regular file, executable)
            z.writestr(info, data)
    return out


def megatron_wheelhouse(root: Path, python: str, toolchain: bool = True) -> Path:
    """A wheelhouse of h100 on the Megatron engine as `envbuild install` reads it: its manifest,
    its copy of the lock's sources part (the extension's sdist and, unless not `toolchain`, the
    compiler's wheels, each in sources/), and an install.sh that makes a bare venv of `python`."""
    import hashlib

    from envbuilder.lock.sources import TE_KEY, TOOLCHAIN_KEY

    wh = root / "wh"
    sources = wh / "sources"
    files = {"sdist": _te_sdist(sources)}
    if toolchain:
        files |= toolchain_wheels(sources)
    pins, listed = {}, {}
    for name, path in files.items():
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        key = TE_KEY if name == "sdist" else TOOLCHAIN_KEY + name
        version = "2.12.0" if name == "sdist" else path.name.split("-")[1]
        pins[key] = {
            "url": f"https://pypi.invalid/{path.name}",
            "filename": path.name,
            "sha256": sha,
            "size": len(data),
            "ref": version,
        }
        listed[f"sources/{path.name}"] = {
            "kind": "source",
            "name": key,
            "version": version,
            "size": len(data),
            "sha256": sha,
        }
    (wh / "locks" / "h100").mkdir(parents=True)
    (wh / "locks" / "h100" / "sources.lock").write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    manifest = {
        "format": 1,
        "files": listed,
        "profiles": {"h100": {"python": "3.12", "files": sorted(listed)}},
    }
    (wh / "manifest.json").write_text(json.dumps(manifest))
    (wh / "install.sh").write_text(
        '#!/usr/bin/env bash\nset -eu\n[ -x "$3/bin/python" ] || "${PYTHON:-%s}" -m venv "$3"\n' % python
    )
    return wh


def _python312() -> str:
    import os
    import shutil
    import subprocess

    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for exe in [shutil.which("python3.12"), *sorted(root.glob("versions/3.12*/bin/python3.12"))]:
        if exe and subprocess.run([str(exe), "-c", "pass"], capture_output=True).returncode == 0:
            return str(exe)
    pytest.skip("no python3.12 here (h100's lock is for Python 3.12)")


def test_an_offline_megatron_install_compiles_the_extension_with_the_wheelhouses_nvcc(tmp_path):
    """`envbuild install h100 --engine megatron --from-wheelhouse WH` with no network (unshare
    -n): past the former refusal, PyPI's CUDA compiler installed from WH/sources/ by hash with no
    index, then the extension's sdist built with it: the build saw CUDA_HOME under the venv, that
    nvcc first on PATH, and `nvcc --version` said CUDA 13.0 (torch's)."""
    import subprocess

    from test_wheelhouse import _install

    py = _python312()
    wh = megatron_wheelhouse(tmp_path, py)
    prefix = tmp_path / "env"
    args = ["h100", "--engine", "megatron", "--prefix", str(prefix), "--from-wheelhouse", str(wh)]
    args += ["--interpreter", py, "--json"]
    r = _install(args, tmp_path)
    assert "Traceback" not in r.stderr and "--from-wheelhouse with --engine megatron" not in r.stderr, (
        r.stderr[-3000:]
    )
    report = json.loads(r.stdout)
    steps = {s["step"]: s for s in report["steps"]}
    assert [s["step"] for s in report["steps"]][:3] == ["install.sh", "toolchain", "build transformer-engine"]
    assert all(steps[s]["ok"] for s in ("install.sh", "toolchain", "build transformer-engine")), r.stderr[
        -3000:
    ]
    assert "--no-index --find-links" in r.stderr and "--require-hashes" in r.stderr
    seen = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import transformer_engine_torch as t; print(repr(t.SEEN))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    import ast

    seen = ast.literal_eval(seen.strip())
    site = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert seen["CUDA_HOME"] == f"{site}/nvidia/cu13" and seen["nvcc"] == f"{site}/nvidia/cu13/bin/nvcc"
    assert "release 13.0" in seen["version"] and seen["NVTE_CUDA_ARCHS"] == "90"
    # run again (an install is resumable): the extension is there, nothing compiles again
    again = _install(args, tmp_path)
    steps = [s["step"] for s in json.loads(again.stdout)["steps"]]
    assert "build transformer-engine" not in steps and "is compiled into" in again.stderr, again.stderr[
        -2000:
    ]


def test_a_wheelhouse_without_the_compiler_is_refused_saying_to_export_it_again(tmp_path):
    """A wheelhouse exported before the lock pinned PyPI's CUDA compiler carries the extension's
    sdist alone: refused before anything is written, naming what is missing, why it is needed
    and the commands that make one that has it."""
    from envbuilder.errors import UserError
    from envbuilder.context.prepare import prepare
    from envbuilder.machine.install import install

    wh = megatron_wheelhouse(tmp_path, "python3.12", toolchain=False)
    with pytest.raises(UserError) as e:
        install(prepare(resolved("h100", engine="megatron")), tmp_path / "prefix", wheelhouse=wh)
    msg = str(e.value)
    assert "does not carry nvidia-cuda-nvcc, nvidia-cuda-crt" in msg and "CUDA 13.0 compiler" in msg
    assert (
        "envbuild lock h100 --engine megatron" in msg
        and f"envbuild wheelhouse h100 --engine megatron -o {wh}" in msg
    )
    assert not (tmp_path / "prefix").exists()
    # what is no wheelhouse of h100 is refused as before, for that
    with pytest.raises(UserError, match="is not an envbuild wheelhouse"):
        install(
            prepare(resolved("h100", engine="megatron")),
            tmp_path / "prefix",
            wheelhouse=ROOT / "tests" / "fixtures" / "wheelhouse-4090",
        )


# what the lock must pick of each toolchain page below: the newest release of torch's CUDA X.Y
# (13.0 for h100) with a wheel for x86_64, never another CUDA's, another machine's or a pre-release
PLAT = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
TOOLCHAIN_PINS = {
    "nvidia-cuda-nvcc": ("13.0.88", f"nvidia_cuda_nvcc-13.0.88-{PLAT}.whl"),
    "nvidia-cuda-crt": ("13.0.88", f"nvidia_cuda_crt-13.0.88-{PLAT}.whl"),
    "nvidia-nvvm": ("13.0.88", f"nvidia_nvvm-13.0.88-{PLAT}.whl"),
    "nvidia-cuda-cccl": ("13.0.85", f"nvidia_cuda_cccl-13.0.85-{PLAT}.whl"),
    "setuptools": ("80.9.0", "setuptools-80.9.0-py3-none-any.whl"),
    "pybind11": ("3.0.1", "pybind11-3.0.1-py3-none-any.whl"),
    "ninja": ("1.13.0", f"ninja-1.13.0-{PLAT}.whl"),
    "wheel": ("0.45.1", "wheel-0.45.1-py3-none-any.whl"),
}


def toolchain_pages() -> dict[str, bytes]:
    """A loopback index's pages and files of the toolchain's projects: the pins above among
    files the lock must pass over."""
    out: dict[str, bytes] = {}
    for project, (version, want) in TOOLCHAIN_PINS.items():
        dist = project.replace("-", "_")
        names = [want, f"{dist}-{version}.tar.gz", f"{dist}-0.1-{PLAT}.whl"]
        if project.startswith("nvidia"):
            names += [
                f"{dist}-13.1.80-{PLAT}.whl",  # (CUDA 13.1's: another CUDA)
                f"{dist}-13.0.99-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                f"{dist}-13.0.98-py3-none-win_amd64.whl",
                f"{dist}-12.9.86-{PLAT}.whl",
            ]
        else:
            names += [f"{dist}-99.0rc1-py3-none-any.whl", f"{dist}-98.0-py3-none-musllinux_1_2_x86_64.whl"]
        links = []
        for n in names:
            data = f"{n} stand-in".encode()
            out[f"files/{n}"] = data
            links.append(f'<a href="../../files/{n}#sha256={hashlib.sha256(data).hexdigest()}">{n}</a>')
        out[f"simple/{project}/"] = "\n".join(links).encode()
    return out


def test_the_lock_pins_the_extensions_sdist_from_its_index():
    """sources.lock's entry: the sdist's link on the index's PEP 503 page, downloaded and hashed
    (a loopback index with a stand-in sdist)."""
    import hashlib
    import io
    import tarfile

    from httpfixtures import FileServer

    from envbuilder.errors import ActionError
    from envbuilder.lock.sources import TE_KEY, lock_sources
    from envbuilder.offline.wheelhouse import Artifact
    from envbuilder.secret import SecretUrl

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"[metadata]\nname = transformer_engine_torch\n"
        info = tarfile.TarInfo("transformer_engine_torch-2.12.0/setup.cfg")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    sdist = buf.getvalue()
    sha = hashlib.sha256(sdist).hexdigest()
    name = "transformer_engine_torch-2.12.0.tar.gz"
    page = f'<a href="../../files/{name}#sha256={sha}">{name}</a>'.encode()
    env = resolved("h100", engine="megatron")
    tools = toolchain_pages()
    with FileServer({"simple/transformer-engine-torch/": page, f"files/{name}": sdist, **tools}) as srv:
        index = SecretUrl(srv.url("/simple").rstrip("/"))
        got = lock_sources(env, None, pypi=index)
        assert sorted(got) == sorted([TE_KEY, *(f"toolchain-{t}" for t in TOOLCHAIN_PINS)])
        for project, (version, filename) in TOOLCHAIN_PINS.items():
            data = tools[f"files/{filename}"]
            assert got[f"toolchain-{project}"] == {
                "url": srv.url(f"/files/{filename}"),
                "filename": filename,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "ref": version,
            }
        assert got[TE_KEY] == {
            "url": srv.url(f"/files/{name}"),
            "filename": name,
            "sha256": sha,
            "size": len(sdist),
            "ref": "2.12.0",
        }
        assert lock_sources(resolved("h100"), None, pypi=index) == {}  # (FSDP: no sdist to pin)
        # the wheelhouse keeps it under the name the builder's step reads (sources/<filename>)
        e = got[TE_KEY]
        art = Artifact("source", TE_KEY, e["ref"], e["url"], e["sha256"], e["size"], "sources")
        assert art.path == f"sources/{name}"
    bad = page.replace(sha.encode(), b"0" * 64)
    with FileServer({"simple/transformer-engine-torch/": bad, f"files/{name}": sdist, **tools}) as srv:
        with pytest.raises(ActionError, match="its index lists"):
            lock_sources(env, None, pypi=SecretUrl(srv.url("/simple").rstrip("/")))


def test_a_wheelhouse_build_compiles_the_locked_sdist_with_no_index():
    from test_dockerfile_plan import fake_locked, runs, shell

    from envbuilder.context.prepare import prepare
    from envbuilder.render.dockerfile import dockerfile_plan

    ctx = prepare(resolved("h100", model=MOE, algo="grpo", engine="megatron", nodes=2))
    env = ctx.env
    locked = fake_locked(env, wheelhouse=True)
    locked = locked._replace(
        layers=dict(locked.layers, megatron="locked-megatron.txt"),
        te_source={"filename": "transformer_engine_torch-2.12.0.tar.gz", "sha256": "9" * 64},
    )
    df = dockerfile_plan(env, ctx.plan, locked)
    te = next(r for b in df.blocks for r in runs(b) if "transformer_engine_torch" in shell(r))
    text = shell(te)
    path = "/wheelhouse/sources/transformer_engine_torch-2.12.0.tar.gz"
    assert f'echo "{"9" * 64}  {path}" | sha256sum -c -' in text
    assert f"pip wheel -v --no-index -w /wheels --no-build-isolation --no-deps {path}" in text
    assert "--mount=type=bind,source=wheelhouse,target=/wheelhouse" in te.words


def test_the_megatron_dockerfile_passes_hadolint_and_its_scripts_bash_n(tmp_path):
    import os
    import subprocess
    import sys

    golden = ROOT / "tests" / "golden" / "h100-megatron"
    tool = Path(sys.executable).parent / "hadolint"
    r = subprocess.run(
        [str(tool), "--format", "json", str(golden / "Dockerfile")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path)),
    )
    assert [f for f in json.loads(r.stdout) if f["level"] == "error"] == []
    for name in ("run_ppo_gsm8k.sh", "envbuild-secrets.sh"):
        got = subprocess.run(["bash", "-n", str(golden / name)], capture_output=True, text=True)
        assert got.returncode == 0, got.stderr


@pytest.mark.parametrize(
    "flags",
    [
        ["--algo", "grpo"],  # (no critic: its micro-batch is None in the file, which read back failed)
        ["--engine", "megatron", "--model", MOE, "--algo", "grpo", "--nodes", "2"],
    ],
)
def test_render_from_its_own_envbuild_json_writes_the_same_files(cli, flags):
    code, _, err = cli("render", "h100", *flags, "-o", "a")
    assert code == 0, err
    code, _, err = cli("render", "--from", Path("a/h100/envbuild.json").resolve(), "-o", "b")
    assert code == 0, err
    for f in Path("a/h100").iterdir():
        if f.is_file() and f.name != "README.md":  # (the README names the command that wrote it)
            assert (Path("b/h100") / f.name).read_bytes() == f.read_bytes(), f.name


def test_a_given_layout_that_does_not_fit_names_the_plans_own(cli):
    v = violations("h100", model=MOE, algo="grpo", engine="megatron", nodes=2, megatron=("cp=2",))["memory"]
    assert v.fix.startswith("drop --megatron (the plan's own layout, TP 1, PP 1, EP 8, fits)")


def test_pypis_real_cuda_compiler_is_locked_and_runs_from_the_venv_with_no_network(real_pypi, tmp_path):
    """The real thing, short of the 10-minute compile: the lock's pins of PyPI's CUDA 13.0
    compiler for h100 (the newest 13.0.* wheel of each, hashed), those wheels in a wheelhouse's
    sources/, installed by install's own argv (pip --no-index --require-hashes from there) into
    a venv with no network (unshare -n where the sandbox allows it), and the nvcc the build's
    PATH finds first is the venv's, CUDA_HOME/bin/nvcc, saying release 13.0."""
    import os
    import shutil
    import subprocess
    import sys

    import requests

    from envbuilder.lock.sources import TOOLCHAIN_KEY, te_toolchain
    from envbuilder.machine.install import WheelhouseToolchain, offline_te_commands
    from envbuilder.model.components import transformer_engine as TE
    from envbuilder.secret import SecretUrl

    env = resolved("h100", engine="megatron")
    pins = te_toolchain(env, SecretUrl(real_pypi))
    assert sorted(pins) == sorted(TOOLCHAIN_KEY + t for t in (*TE.TOOLCHAIN, *TE.BUILD_REQUIRES))
    for t in TE.TOOLCHAIN:
        assert str(pins[TOOLCHAIN_KEY + t]["ref"]).startswith("13.0."), pins[TOOLCHAIN_KEY + t]
        assert "x86_64" in str(pins[TOOLCHAIN_KEY + t]["filename"])
    wh = tmp_path / "wh"
    sources = wh / "sources"
    sources.mkdir(parents=True)
    for pin in pins.values():
        got = requests.get(str(pin["url"]), timeout=300)
        got.raise_for_status()
        assert hashlib.sha256(got.content).hexdigest() == pin["sha256"]
        (sources / str(pin["filename"])).write_bytes(got.content)
    prefix = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True)
    py = prefix / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tc = WheelhouseToolchain(
        ("transformer_engine_torch-2.12.0.tar.gz", "0" * 64),
        {
            k.removeprefix(TOOLCHAIN_KEY): (str(p["ref"]), str(p["filename"]), str(p["sha256"]))
            for k, p in pins.items()
        },
    )
    tools, req, build, variables = offline_te_commands(env, wh, prefix, tc, site, set())
    (tmp_path / "toolchain.txt").write_text(req)
    cmd = [*tools, str(tmp_path / "toolchain.txt")]
    if (
        shutil.which("unshare")
        and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    ):
        cmd = ["unshare", "-n", *cmd]
    child = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(child, PIP_CONFIG_FILE=os.devnull), timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    home = variables["CUDA_HOME"]
    assert home == f"{site}/nvidia/cu13"
    nvcc = shutil.which("nvcc", path=variables["PATH"])
    assert nvcc == f"{home}/bin/nvcc"
    said = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    assert "release 13.0" in said, said
    # the build: the wheelhouse's sdist, pip with no index and the wheelhouse's files alone
    assert build[-1] == str(sources / "transformer_engine_torch-2.12.0.tar.gz")
    assert ["--no-index", "--find-links", str(sources)] == build[build.index("--no-index") :][:3]
    assert "--no-build-isolation" in build and "NVTE_CUDA_ARCHS=90" in build


def test_the_compiler_is_an_input_of_the_megatron_locks_sources_part_alone():
    """A Megatron lock made before its sources part pinned the compiler is stale (lock --check
    says so, and a re-lock pins it); every other profile's inputs are as they were."""
    from envbuilder.lock.lockfile import solver_inputs

    mega = solver_inputs(resolved("h100", engine="megatron"), ("sources",))["sources"]
    assert mega["toolchain"] == [
        "nvidia-cuda-nvcc==13.0.*",
        "nvidia-cuda-crt==13.0.*",
        "nvidia-nvvm==13.0.*",
        "nvidia-cuda-cccl==13.0.*",
        "setuptools",
        "pybind11",
        "ninja",
        "wheel",
    ]
    for profile in ("p40", "a100", "h100"):
        assert "toolchain" not in solver_inputs(resolved(profile), ("sources",)).get("sources", {})


def test_the_sbom_names_the_extensions_sdist_and_the_compiler_it_is_built_with():
    """sources.lock's sdist and compiler wheels are components of a Megatron lock's SBOM, each a
    PyPI purl with its file and sha256 (the sdist compiled for the card); no other profile's
    SBOM gains anything from keys it never has."""
    from envbuilder.lock.documents import SourcePin
    from envbuilder.lock.sbom import source_components

    nvcc = f"nvidia_cuda_nvcc-13.0.88-{PLAT}.whl"
    sources = {
        "transformer_engine_torch": SourcePin.of(
            {
                "url": "https://files.example/t.tar.gz",
                "sha256": "1" * 64,
                "filename": "t.tar.gz",
                "ref": "2.12.0",
            }
        ),
        "toolchain-nvidia-cuda-nvcc": SourcePin.of(
            {"url": f"https://files.example/{nvcc}", "sha256": "2" * 64, "filename": nvcc, "ref": "13.0.88"}
        ),
    }
    got = {c["name"]: c for c in source_components(resolved("h100", engine="megatron"), sources)}
    assert got["nvidia-cuda-nvcc"]["purl"].startswith("pkg:pypi/nvidia-cuda-nvcc@13.0.88?")
    assert got["nvidia-cuda-nvcc"]["hashes"] == [{"alg": "SHA-256", "content": "2" * 64}]
    te = got["transformer_engine_torch"]
    assert (
        te["version"] == "2.12.0" and {"name": "envbuild:compiled-for", "value": "sm_90"} in te["properties"]
    )
    assert source_components(resolved("h100"), sources) == []


# ---- context parallelism: chosen where one sequence's activations fit no layout at CP 1 ---------

LONG = ROOT / "tests" / "fixtures" / "long-context"  # 3090-long: 4 x RTX 3090, 32K-token responses


@pytest.fixture(scope="module")
def long_matrix():
    return load((LONG,))


def test_long_responses_choose_context_parallelism_where_cp_1_fits_no_layout(long_matrix):
    env = resolved("3090-long", long_matrix, algo="grpo", engine="megatron")
    lay = env.train.megatron
    assert (lay.tp, lay.pp, lay.ep, lay.cp) == (2, 1, 1, 2) and not env.memory["problems"]
    assert "context parallel over 2 GPUs" in env.memory["choices"]["megatron"]["why"]
    # the before: every layout megatron-core takes at CP 1 (TP 1 and 2, PP up to 4), given as
    # --megatron (offload still the plan's), is refused on memory, and the fix names the plan's own
    arch = Arch("Qwen/Qwen2.5-3B-Instruct", long_matrix.models["Qwen/Qwen2.5-3B-Instruct"])
    at_cp_1 = layouts(arch, 4, 4)
    assert at_cp_1 and all(lay.cp == 1 for lay in at_cp_1)
    for lay in at_cp_1:
        v = violations(
            "3090-long",
            long_matrix,
            algo="grpo",
            engine="megatron",
            megatron=(f"tp={lay.tp}", f"pp={lay.pp}"),
        )
        assert "drop --megatron (the plan's own layout, TP 2, PP 1, CP 2, fits)" in v["memory"].fix
    # the activations are split over TP × CP: the update's working set says so
    actor = next(p for p in env.memory["phases"] if p["key"] == "actor")
    assert any("CP 2 context parallel" in t["formula"] for t in actor["terms"])


def test_a_context_parallel_run_carries_its_size_and_divides_the_batches_by_dp(long_matrix):
    env = resolved("3090-long", long_matrix, algo="gae", engine="megatron")
    a = args(env)
    for section in ("actor_rollout_ref.actor.megatron", "critic.megatron"):
        assert a[f"{section}.context_parallel_size"] == "2"
        assert a[f"{section}.tensor_model_parallel_size"] == "2"
    # the token budgets hold one whole sequence: verl's Megatron engine multiplies a GPU's budget
    # by CP (its micro-batcher's sp_size), as it does by Ulysses SP on FSDP
    seq = env.train.max_prompt_length + env.train.max_response_length
    micro = env.memory["batch"]["actor_ppo_micro_batch_size_per_gpu"]
    assert int(a["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) * 2 == micro * seq
    # (verl's ref/megatron_ref.yaml takes the actor's: context_parallel_size:
    # ${oc.select:actor_rollout_ref.actor.megatron.context_parallel_size,1})
    cfg = runplan.as_config(env.run, runplan.world(env))
    assert batch_violations(cfg, True) == []
    # data parallelism is world / (TP × PP × CP) = 4 / 4: each rank holds the whole mini-batch
    assert env.train.megatron.dp(4) == 1
    assert env.memory["mini_batch_per_gpu"] == env.train.ppo_mini_batch_size * env.memory["rollout_n"]
    cfg["actor_rollout_ref"]["actor"]["megatron"]["context_parallel_size"] = (
        1  # (the budget: half a sequence)
    )
    assert any("less than one sequence" in v for v in batch_violations(cfg, True))
    cfg["actor_rollout_ref"]["actor"]["megatron"]["context_parallel_size"] = 3  # (4 GPUs: no whole DP)
    assert any("data-parallel group" in v for v in batch_violations(cfg, True))


def test_the_render_of_a_long_profile_writes_cp_and_a_given_cp_is_honoured(cli):
    code, _, err = cli(
        "render", "3090-long", "--matrix-dir", LONG, "--engine", "megatron", "--algo", "grpo", "-o", "out"
    )
    assert code == 0, err
    script = Path("out/3090-long/run_ppo_gsm8k.sh").read_text()
    assert "actor_rollout_ref.actor.megatron.context_parallel_size=2" in script
    # --megatron cp=N is the user's, even where the plan would take CP 1
    given = resolved("h100", algo="grpo", engine="megatron", megatron=("tp=2", "cp=2"))
    assert (given.train.megatron.tp, given.train.megatron.cp) == (2, 2)
    assert args(given)["actor_rollout_ref.actor.megatron.context_parallel_size"] == "2"
    assert resolved("h100", algo="grpo", engine="megatron").train.megatron.cp == 1  # (the default)


def test_context_parallelism_is_never_chosen_on_fsdp(long_matrix):
    v = violations("3090-long", long_matrix, algo="grpo")["memory"]  # (FSDP: no CP to take)
    assert "megatron" not in v.why and "--gpus-per-node 8" in v.fix
    assert not any("context_parallel" in o for o in args(resolved("h100", algo="grpo")))


def test_where_no_cp_helps_the_refusal_reports_the_cp_1_plan_and_a_fix(long_matrix):
    # a 7B's state does not fit 4 x 24 GiB at any layout: CP, which splits only activations,
    # cannot help, so the refusal is the one at CP 1 (everything else tried)
    v = violations("3090-long", long_matrix, algo="grpo", engine="megatron", model="Qwen/Qwen2.5-7B-Instruct")
    mem = v["memory"]
    assert "'cp': 1" in mem.why and "--nodes 4" in mem.fix
