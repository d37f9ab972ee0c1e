"""flash-attn's building block (envbuilder/model/components/flash_attn.py): where its wheel comes
from (an index, the release, a source build; sdpa below Ampere), the one source-build command,
the builder's shell run with the real pip against a loopback PEP 503 index (pypiserver), and the
cuobjdump check on recorded `cuobjdump --list-elf` samples (tests/fixtures/cuobjdump: no CUDA
toolkit runs here, so a stand-in `cuobjdump` prints a recorded sample). No Docker, no network
beyond 127.0.0.1."""

from __future__ import annotations

import os
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import resolved
from fixture_wheels import flash_attn_sdist, make_wheel
from lockfixtures import PypiServer

from envbuilder.model.components import flash_attn as FA
from envbuilder.images import flash_attn_wheel as W

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "fixtures" / "cuobjdump"
STANDIN_SDIST = ROOT / "tests" / "fixtures" / "flash-attn-standin"
WHEELHOUSE_211 = "https://verl-project.github.io/verl-wheelhouse/cu130/torch2.11/simple/"
PY_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


# ---- which flash-attn, from where ------------------------------------------------------------


@pytest.mark.parametrize(
    "cc,arch",
    [
        ("8.0", "80"),
        ("8.6", "80"),
        ("8.9", "80"),
        ("9.0", "90"),
        ("10.0", "100"),
        ("10.3", "100"),
        ("12.0", "120"),
    ],
)
def test_a_source_build_targets_the_highest_setup_py_arch_the_card_runs(cc, arch):
    """2.8.3's setup.py has a -gencode for 80, 90, 100 and 120 only: FLASH_ATTN_CUDA_ARCHS=89
    would build nothing for a 4090."""
    assert FA.build_arch(cc, ["80", "90", "100", "120"]) == arch


def test_below_every_arch_there_is_none():
    assert FA.build_arch("7.5", ["80", "90", "100", "120"]) is None


def test_h100_on_verl_091_takes_verls_wheelhouse_with_remove_padding_on():
    """The done-when of issue 37 item 2: the 0.9.1 stack (torch 2.11 / cu130) resolves flash-attn
    2.8.3 to verl's wheel index, the run plan to flash_attention_2 with remove-padding, and the
    critic's attention patch is dropped."""
    env = resolved("h100", with_=["flash-attn"])
    fa = env.flash_attn
    assert (fa.version, fa.how, fa.index, fa.arch) == ("2.8.3", "index", WHEELHOUSE_211, "90")
    run = {a.key: a.value for a in env.run}
    assert run["actor_rollout_ref.model.use_remove_padding"] == "True"
    assert run["critic.model.use_remove_padding"] == "True"
    assert run["+critic.model.override_config.attn_implementation"] == "flash_attention_2"
    assert env.patches == ()
    assert any("its wheel from verl-wheelhouse" in n for n in env.notes)
    # without it: sdpa, no remove-padding, the critic's patch
    plain = resolved("h100")
    assert plain.attention == "sdpa" and not plain.features.remove_padding
    assert [p.name for p in plain.patches] == ["verl-valuehead-fa2"]


def test_the_index_the_user_names_comes_first():
    env = resolved("h100", with_=["flash-attn"], flash_attn_index="http://127.0.0.1:9/simple/")
    assert (env.flash_attn.how, env.flash_attn.index) == ("index", "http://127.0.0.1:9/simple/")


def test_the_release_wheel_where_the_release_builds_one():
    env = resolved("3090", verl="0.6.1")  # torch 2.8 / cu128: 2.8.3's publish.yml builds it
    assert (env.flash_attn.how, env.flash_attn.index) == ("release", None)


def test_no_wheel_anywhere_is_a_source_build_announced_with_its_time():
    env = resolved("h100", verl="0.8.0", with_=["flash-attn"])  # torch 2.9: no index, no release wheel
    assert (env.flash_attn.how, env.flash_attn.arch) == ("source", "90")
    (note,) = [n for n in env.notes if n.startswith("flash-attn")]
    assert "no prebuilt flash-attn 2.8.3 wheel for torch 2.9.0" in note
    assert "compiles it from the sdist for sm_90 only" in note
    assert "about 64 core-minutes for sm_90 alone: ~16 min at the builder's MAX_JOBS=4" in note
    assert env.attention == "flash_attention_2" and env.features.remove_padding


def test_an_aarch64_host_takes_the_wheelhouses_aarch64_wheel():
    env = resolved("gh200", with_=["flash-attn"])
    assert (env.flash_attn.how, env.flash_attn.index) == ("index", WHEELHOUSE_211)


def test_below_ampere_it_stays_sdpa_with_the_reason(cli):
    code, out, err = cli(*["render", "t4", "--with", "flash-attn", "-o", "out"])
    assert code == 2
    assert "FlashAttention-2 only supports Ampere GPUs or newer (CC >= 8.0)" in err
    assert "attention falls back to sdpa" in err
    env = resolved("t4")
    assert env.attention == "sdpa" and env.flash_attn is None and not env.features.remove_padding


@pytest.mark.parametrize(
    "url,says",
    [
        ("ftp://127.0.0.1/simple", "an http(s) URL"),
        ("http://127.0.0.1/simple;id", "an http(s) URL"),
        ("http://127.0.0.1/$(id)/simple", "an http(s) URL"),
        ("http://127.0.0.1/simple\nRUN id", "an http(s) URL"),
        ("http://u:pw@127.0.0.1/simple", "user:password@"),
    ],
)
def test_a_bad_flash_attn_index_is_refused_with_exit_2(cli, url, says, tmp_path):
    code, out, err = cli(
        *["render", "h100", "--with", "flash-attn", "--flash-attn-index", url, "-o", str(tmp_path)]
    )
    assert code == 2, err
    assert says in err and "--flash-attn-index" in err
    assert "pw" not in err
    assert not any(tmp_path.iterdir())  # nothing written


# ---- the one source-build command ------------------------------------------------------------

SPELLING = re.compile(r"FLASH_ATTENTION_FORCE_BUILD=|FLASH_ATTN_CUDA_ARCHS=")


def test_the_source_build_command_is_spelled_in_one_place():
    templates = sorted(p.name for p in (ROOT / "templates").glob("*.j2") if SPELLING.search(p.read_text()))
    assert templates == [], templates
    code = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "envbuilder").rglob("*.py")
        if SPELLING.search(p.read_text()) and p != Path(FA.__file__)
    )
    assert code == [], code


def test_every_file_prints_the_same_command(tmp_path, cli):
    assert cli(*["render", "h100", "--with", "flash-attn", "-o", str(tmp_path)])[0] == 0
    out = tmp_path / "h100"
    want = FA.source_build_command(resolved("h100", with_=["flash-attn"]))
    assert want == (
        "TORCH_CUDA_ARCH_LIST=9.0 FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 "
        "pip install --no-build-isolation flash-attn==2.8.3"
    )
    for name in ("requirements.txt", "environment.yml", "pixi.toml"):
        assert f"#   {want}" in (out / name).read_text(), name
    # preflight's record of what was built (its sidecar) says the same
    sidecar = json.loads((out / "envbuild-scripts.json").read_text())
    assert sidecar["preflight"]["built"]["flash_attn"] == want


# ---- the builder's shell, run with the real pip against a loopback index ---------------------


def _cuobjdump(tmp: Path, sample: str) -> Path:
    """A stand-in for NVIDIA's cuobjdump (none runs here) that prints a recorded sample."""
    exe = tmp / "bin" / "cuobjdump"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\ncat {SAMPLES / sample}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def _fixture_wheel(dest: Path) -> Path:
    """flash_attn-2.8.3+cu130torch2.11 for this interpreter, with a shared library in it."""
    return make_wheel(
        dest,
        "flash_attn",
        "2.8.3+cu130torch2.11",
        tag=f"{PY_TAG}-{PY_TAG}-linux_x86_64",
        files={
            f"flash_attn_2_cuda.{PY_TAG}-x86_64-linux-gnu.so": b"\x7fELF stand-in",
            "flash_attn/bert_padding.py": "",
        },
    )


def _builder_step(tmp: Path, index: str, sample: str) -> subprocess.CompletedProcess:
    """The builder's flash-attn RUN step of `render h100 --with flash-attn --flash-attn-index`,
    as the Dockerfile spells it, run by bash with this venv's pip; /wheels is a folder here."""
    env = resolved("h100", with_=["flash-attn"], flash_attn_index=index)
    wheels = tmp / "wheels"
    lines = FA.index_shell(env, str(wheels), f"{sys.executable} {W.__file__}")
    script = " \\\n".join(lines).replace("/tmp/flash-attn", str(tmp / "dl"))
    bindir = _cuobjdump(tmp, sample).parent
    venv_bin = Path(sys.executable).parent
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "PATH": f"{bindir}:{venv_bin}:/usr/bin:/bin",
            "FLASH_ATTN_INDEX": index,
            "PIP_INDEX_URL": index,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CACHE_DIR": str(tmp / "pipcache"),
            "MAX_JOBS": "4",
            "HOME": str(tmp),
        },
    )


@pytest.fixture
def index_with_wheel(tmp_path):
    pkgs = tmp_path / "pkgs"
    _fixture_wheel(pkgs)
    with PypiServer(pkgs) as server:
        yield server


def test_render_with_a_loopback_index_installs_from_it_in_the_builder_stage(index_with_wheel, cli, tmp_path):
    url = index_with_wheel.url
    code, out, err = cli(
        *["render", "h100", "--with", "flash-attn", "--flash-attn-index", url, "-o", str(tmp_path)]
    )
    assert code == 0, err
    text = (tmp_path / "h100" / "Dockerfile").read_text()
    builder, runtime = text.split("FROM ${BASE_RUNTIME} AS runtime")
    assert f"ARG FLASH_ATTN_INDEX={url}" in builder
    assert '--index-url "${FLASH_ATTN_INDEX}" -d /tmp/flash-attn flash-attn==2.8.3' in builder
    assert "check-archs --cc 9.0 /tmp/flash-attn/*.whl" in builder
    assert "--mount=type=cache,target=/root/.ccache" in builder
    assert "FLASH_ATTN_INDEX" not in runtime
    assert "uv pip install --no-deps /wheels/*.whl" in runtime
    run = (tmp_path / "h100" / "run_ppo_gsm8k.sh").read_text()
    assert "use_remove_padding=True" in run and "attn_implementation=flash_attention_2" in run


def test_the_builder_takes_the_indexs_wheel_when_its_fatbin_has_the_cards_arch(index_with_wheel, tmp_path):
    r = _builder_step(tmp_path, index_with_wheel.url, "flash-attn-sm80-sm90-sm100-sm120.txt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "carries sm_100, sm_120, sm_80, sm_90: runs on CC 9.0" in r.stdout
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == [
        f"flash_attn-2.8.3+cu130torch2.11-{PY_TAG}-{PY_TAG}-linux_x86_64.whl"
    ]
    assert "compiling" not in r.stdout


def test_a_wheel_without_the_cards_arch_stops_the_build(index_with_wheel, tmp_path):
    """An index's wheel for 9.0/10.0 (the wheelhouse's aarch64 list) on an RTX 3090 class card
    would fail at its first attention call; here, for an H100 against an sm_80-only list."""
    sample = tmp_path / "sm80.txt"
    sample.write_text("ELF file    1: flash_attn_2_cuda.1.sm_80.cubin\n")
    r = _builder_step(tmp_path, index_with_wheel.url, str(sample))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "carries sm_80, nothing a CC 9.0 card runs" in r.stderr
    assert not (tmp_path / "wheels").exists()


def test_without_a_wheel_on_the_index_the_builder_compiles_for_sm_90(tmp_path):
    """The index has only the (stand-in) sdist: pip download --only-binary finds nothing, the
    step says so and builds it from the sdist with FLASH_ATTN_CUDA_ARCHS=90 and its estimate."""
    pkgs = tmp_path / "pkgs"
    flash_attn_sdist(STANDIN_SDIST, pkgs, "2.8.3")
    ccache = tmp_path / "bin" / "ccache"  # present, so the step never reaches for apt here
    ccache.parent.mkdir(parents=True)
    ccache.write_text('#!/bin/sh\nexec "$@"\n')
    ccache.chmod(0o755)
    with PypiServer(pkgs) as server:
        r = _builder_step(tmp_path, server.url, "flash-attn-sm80-sm90-sm100-sm120.txt")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "the index has no 2.8.3 wheel for this Python and machine" in out
    assert re.search(
        r"compiling 2\.8\.3 from its PyPI sdist for sm_90 only with \d+ jobs .*expect about \d+ min", out
    )
    assert (
        "flash-attn stand-in: source build of 2.8.3 (FLASH_ATTENTION_FORCE_BUILD=TRUE, FLASH_ATTN_CUDA_ARCHS=90)"
        in out
    )
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == ["flash_attn-2.8.3-py3-none-any.whl"]


# ---- the cuobjdump check on recorded output --------------------------------------------------


def test_the_listing_parser_reads_the_recorded_samples():
    assert W.listed_archs((SAMPLES / "flash-attn-sm80-sm90-sm100-sm120.txt").read_text()) == {
        "8.0",
        "9.0",
        "10.0",
        "12.0",
    }
    assert W.listed_archs((SAMPLES / "flash-attn-sm90-sm100.txt").read_text()) == {"9.0", "10.0"}
    assert W.listed_archs((SAMPLES / "no-device-code.txt").read_text()) == set()
    assert W.listed_archs("ELF file    1: x.1.sm_90a.cubin\n") == {"9.0a"}


@pytest.mark.parametrize(
    "cc,archs,runs",
    [
        ("8.6", {"8.0", "9.0"}, True),  # sm_80 SASS runs on 8.6
        ("8.9", {"9.0", "10.0"}, False),  # the wheelhouse's aarch64 list on an Ada card
        ("9.0", {"9.0a"}, True),
        ("10.0", {"9.0a"}, False),  # arch-specific: that card only
        ("12.0", {"8.0", "9.0", "10.0", "12.0"}, True),
    ],
)
def test_sass_runs_where_the_major_matches_and_the_minor_is_at_or_below(cc, archs, runs):
    assert W.sass_runs(cc, archs) is runs


def test_check_archs_reads_each_shared_library_of_the_wheel(tmp_path, capsys):
    wheel = _fixture_wheel(tmp_path / "w")
    exe = _cuobjdump(tmp_path, "flash-attn-sm90-sm100.txt")
    assert W.check_archs([str(wheel)], "9.0", str(exe)) == 0
    assert W.check_archs([str(wheel)], "8.0", str(exe)) == W.BAD_FILE  # an A100: no sm_80
    assert "carries sm_100, sm_90, nothing a CC 8.0 card runs" in capsys.readouterr().err


def test_a_wheel_with_no_shared_library_fails_the_check(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "w", "flash_attn", "2.8.3")
    exe = _cuobjdump(tmp_path, "flash-attn-sm90-sm100.txt")
    assert W.check_archs([str(wheel)], "9.0", str(exe)) == W.BAD_FILE
    assert "has no shared library" in capsys.readouterr().err


def test_without_cuobjdump_the_check_says_it_did_not_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    wheel = _fixture_wheel(tmp_path / "w")
    assert W.check_archs([str(wheel)], "9.0") == 0
    assert "no cuobjdump here" in capsys.readouterr().out


def test_the_check_runs_as_the_builder_runs_it(tmp_path):
    wheel = _fixture_wheel(tmp_path / "w")
    exe = _cuobjdump(tmp_path, "flash-attn-sm80-sm90-sm100-sm120.txt")
    r = subprocess.run(
        [sys.executable, W.__file__, "check-archs", "--cc", "9.0", "--cuobjdump", str(exe), str(wheel)],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stderr
    bad = subprocess.run(
        [sys.executable, W.__file__, "check-archs", "--cc", "nine"], capture_output=True, text=True
    )
    assert bad.returncode == W.BAD_ARGS and "not a compute capability" in bad.stderr


# ---- a known index found through a mirror set ------------------------------------------------


def test_a_mirror_set_serves_the_known_index_under_its_prefix():
    from envbuilder.model import mirrors as M

    env = resolved("h100", with_=["flash-attn"])
    assert (env.flash_attn.index_name, env.flash_attn.index_path) == (
        "verl-wheelhouse",
        "cu130/torch2.11/simple/",
    )
    choice = M.choice(
        "corp", {"description": "d", "wheel_indexes": {"verl-wheelhouse": ["https://u:s3cret@pypi.corp/wh/"]}}
    )
    mirrored = M.apply_to_env(env, choice)
    assert mirrored.flash_attn.index == "https://pypi.corp/wh/cu130/torch2.11/simple/"  # no credentials
    # the credentials reach the build only through the `endpoints` secret
    secret = choice.credentials_env(mirrored)
    assert "export FLASH_ATTN_INDEX=https://u:s3cret@pypi.corp/wh/cu130/torch2.11/simple/" in secret
    # an index the user named is not a known one: no mirror rewrites it
    own = resolved("h100", with_=["flash-attn"], flash_attn_index="http://127.0.0.1:9/simple/")
    assert M.apply_to_env(own, choice).flash_attn.index == "http://127.0.0.1:9/simple/"


def test_a_mirror_sets_wheel_index_reaches_the_rendered_dockerfile(cli, tmp_path, monkeypatch):
    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "mirrors": {
                    "corp": {
                        "description": "our proxy of verl's wheelhouse",
                        "wheel_indexes": {"verl-wheelhouse": ["http://127.0.0.1:9/wh"]},
                    }
                }
            }
        )
    )
    monkeypatch.setenv("ENVBUILD_CONFIG", str(config))
    code, out, err = cli(
        "render", "h100", "--with", "flash-attn", "--mirror", "corp", "-o", str(tmp_path / "o")
    )
    assert code == 0, err
    text = (tmp_path / "o" / "h100" / "Dockerfile").read_text()
    assert "ARG FLASH_ATTN_INDEX=http://127.0.0.1:9/wh/cu130/torch2.11/simple/" in text
    code, out, err = cli("mirrors", "list")
    assert "index:verl-wheelhouse" in out and "http://127.0.0.1:9/wh" in out


def test_a_lock_refuses_an_index_wheel_it_cannot_pin_yet_and_says_what_to_do():
    from envbuilder.errors import UserError
    from envbuilder.lock.sources import flash_attn_wheels

    with pytest.raises(UserError) as e:
        flash_attn_wheels(resolved("h100", with_=["flash-attn"]), None)
    assert "comes from a wheel index" in str(e.value) and "--without flash-attn" in str(e.value)


def test_with_no_wheel_anywhere_render_writes_the_source_build_and_announces_its_time(cli, tmp_path):
    code, out, err = cli("render", "h100", "--verl", "0.8.0", "--with", "flash-attn", "-o", str(tmp_path))
    assert code == 0, err
    said = out + err
    assert "note: flash-attn 2.8.3: no prebuilt flash-attn 2.8.3 wheel for torch 2.9.0" in said
    assert "about 64 core-minutes for sm_90 alone" in said
    builder = (tmp_path / "h100" / "Dockerfile").read_text().split("FROM ${BASE_RUNTIME} AS runtime")[0]
    assert "FLASH_ATTN_INDEX" not in builder and "FLASH_ATTN_RELEASE" not in builder
    assert "--mount=type=cache,target=/root/.ccache" in builder
    assert "export CCACHE_DIR=/root/.ccache" in builder
    assert (
        "TORCH_CUDA_ARCH_LIST=9.0 FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 pip wheel -v "
        "--no-deps -w /wheels --no-build-isolation flash-attn==2.8.3"
    ) in builder
    assert "expect about $(( (64 + jobs - 1) / jobs )) min" in builder


def test_the_memory_plan_follows_the_attention(cli):
    code, with_fa, err = cli("show", "h100", "--with", "flash-attn", "--memory")
    assert code == 0, err
    assert "flash_attention_2 attention" in with_fa
    code, plain, err = cli("show", "h100", "--memory")
    assert "sdpa attention" in plain


def test_envbuild_install_compiles_with_the_same_variables(tmp_path):
    from envbuilder.machine.install import extension_commands

    env = resolved("3090", verl="0.6.1")  # an 8.6 card: sm_80, which setup.py builds
    python = tmp_path / "bin" / "python"
    ((name, cmd),) = extension_commands(env, python)
    assert name == "flash-attn"
    # literally, not through the function that builds it: a dropped word shows here
    assert cmd == [
        "env",
        "TORCH_CUDA_ARCH_LIST=8.6",
        "FLASH_ATTENTION_FORCE_BUILD=TRUE",
        "FLASH_ATTN_CUDA_ARCHS=80",
        str(python),
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "flash-attn==2.8.3",
    ]
