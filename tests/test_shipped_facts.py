"""The shipped matrix's own facts: every profile resolves as shipped, without warnings, within its
verl's torch floor, into an environment of the kinds `render --from` checks. The resolver's rules
are tested on the frozen fixture matrix (tests/test_resolve.py, tests/fixtures/matrix); a matrix
update changes these tests and the goldens only."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, PROFILES, resolved, shipped
from envbuilder.model import matrix as M
from test_resolve import resolved_variants


@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_resolves_without_warnings(profile):
    assert resolved(profile).to_dict()["warnings"] == []


@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_meets_its_verls_torch_floor(profile):
    d = resolved(profile).to_dict()
    assert M.in_range(d["torch"]["version"], shipped().verl[d["verl"]["version"]]["torch"])


def test_every_shipped_environment_is_of_the_kinds_render_from_checks():
    from envbuilder.model import schema as S
    from envbuilder.model.resolved import field_spec

    for label, env in resolved_variants(shipped()):
        S.check(json.loads(env.to_json()), field_spec(), f"{label}: ")


def test_the_frozen_matrix_is_a_real_matrix_of_its_own():
    """The fixture loads and validates like the shipped one and names the profiles the rule
    tests use; it is a copy of a day's matrix, not a link to it."""
    from conftest import FROZEN, frozen

    assert not FROZEN.is_symlink() and (FROZEN / "profiles.yaml").is_file()
    assert {"p40", "4090", "t4", "v100", "3090", "h200"} <= set(frozen().profiles)


# flash-attn's published wheels, as each tag's .github/workflows/publish.yml builds them
# (torch-version, python-version and cuda-version of its matrix; read 2026-12-03)
PUBLISHED = {
    "2.5.8": (["2.1.2", "2.2.2", "2.3.0"], ["3.8", "3.9", "3.10", "3.11"], ["11", "12"]),
    "2.6.3": (["2.2.2", "2.3.1", "2.4.0"], ["3.8", "3.9", "3.10", "3.11", "3.12"], ["11", "12"]),
    "2.7.4.post1": (
        ["2.2.2", "2.3.1", "2.4.0", "2.5.1", "2.6.0"],
        ["3.9", "3.10", "3.11", "3.12", "3.13"],
        ["12"],
    ),
    "2.8.3": (["2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0"], ["3.9", "3.10", "3.11", "3.12", "3.13"], ["12"]),
}
NOT_PUBLISHED = {"2.5.8": "2.4.0", "2.6.3": "2.5.1", "2.7.4.post1": "2.7.1", "2.8.3": "2.9.1"}


@pytest.mark.parametrize("version", list(PUBLISHED))
def test_flash_attn_wheel_facts_match_what_each_release_published(version):
    from envbuilder.model.resolve import flash_attn_wheel_gap

    rec = shipped().flash_attn["versions"][version]
    torches, pythons, cudas = PUBLISHED[version]
    assert sorted(rec["wheel_cuda"]) == cudas and rec["wheel_python"] == pythons
    for torch in torches:
        assert flash_attn_wheel_gap(rec, torch, f"{cudas[-1]}.4", pythons[0]) is None, torch
    assert "torch" in flash_attn_wheel_gap(rec, NOT_PUBLISHED[version], f"{cudas[-1]}.4", pythons[0])


def test_every_shipped_flash_attn_profile_has_a_prebuilt_wheel():
    for name in PROFILES:
        env = resolved(name)
        if env.flash_attn:
            assert not any("flash-attn" in n for n in env.notes), name


# -- today's stack (issue 19): verl 0.9.1, vLLM 0.24.0, torch 2.11.0 on CUDA 13, Blackwell ------

NEW_STACK = ("t4", "3090", "a100", "h100", "h200", "b200", "b300", "5090", "rtx-pro-6000")


@pytest.mark.parametrize("profile", NEW_STACK)
def test_current_gpus_default_to_the_newest_co_resolving_stack(profile):
    d = resolved(profile).to_dict()
    assert (
        d["verl"]["version"],
        d["vllm"]["version"],
        d["torch"]["version"],
        d["cuda"]["version"],
        d["python"],
    ) == ("0.9.1", "0.24.0", "2.11.0", "13.0", "3.12")
    assert d["torch"]["index_url"] is None  # PyPI's own CUDA 13.0 build: no PyTorch index
    assert d["verl"]["rollout_mode"] == "async" and d["verl"]["critic_fsdp"] == "critic.fsdp"
    assert "vllm._C_stable_libtorch" in d["training_path"] and "vllm._C" not in d["training_path"]
    assert "transfer_queue" in d["training_path"]


def test_the_torch_2_11_arch_list_is_what_the_device_reported():
    """tests/fixtures/gpu/h200/device-run.log: torch.cuda.get_arch_list() of 2.11.0+cu130."""
    log = (FIXTURES / "gpu" / "h200" / "device-run.log").read_text()
    assert "arch_list 2.11.0+cu130 13.0 ['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120']" in log
    assert shipped().torch["2.11.0"]["builds"]["cu130"]["archs"] == [
        "7.5",
        "8.0",
        "8.6",
        "9.0",
        "10.0",
        "12.0",
    ]


@pytest.mark.parametrize(
    "profile, previous",
    [
        ("h100", ("0.6.1", "0.11.0", "2.8.0", "12.8")),
        ("3090", ("0.6.1", "0.11.0", "2.8.0", "12.8")),
        ("h100", ("0.4.1", "0.8.5", "2.6.0", "12.4")),
    ],
)
def test_the_previous_stacks_stay_reachable_with_verl(profile, previous):
    d = resolved(profile, verl=previous[0]).to_dict()
    assert (
        d["verl"]["version"],
        d["vllm"]["version"],
        d["torch"]["version"],
        d["cuda"]["version"],
    ) == previous
    assert d["verl"]["rollout_mode"] == "sync"
    assert d["verl"]["critic_fsdp"] == "critic.model.fsdp_config"
    if previous[0] == "0.6.1":  # its flash-attn 2.8.3 publishes wheels for torch 2.8
        assert d["flash_attn"]["version"] == "2.8.3" and d["attention"] == "flash_attention_2"


@pytest.mark.parametrize(
    "args, rule, words",
    [
        ({"profile": "v100", "verl": "0.9.1"}, "arch", "no kernels for sm_70"),
        ({"profile": "v100", "verl": "0.9.1"}, "vllm-cc", ">= 7.5"),
        (
            {"profile": "h100", "vllm": "0.34.0", "torch": "2.14.0", "python": "3.10"},
            "vllm-python",
            "no wheels for Python 3.10",
        ),
        ({"profile": "4090", "verl": "0.9.1", "rollout": "hf"}, "rollout", "async"),
        ({"profile": "p40", "verl": "0.9.1"}, "arch", "no kernels for sm_61"),
    ],
)
def test_what_cannot_work_on_todays_stack_is_refused_with_why(args, rule, words):
    from conftest import violations

    profile = args.pop("profile")
    found = violations(profile, **args)
    assert found[rule].hard and words in found[rule].text()


@pytest.mark.parametrize(
    "profile, says",
    [("v100", "no kernels for sm_70"), ("p40", "no kernels for sm_61"), ("4090", "also resolves")],
)
def test_show_says_what_holds_an_older_profile_back(profile, says):
    from envbuilder.model.resolve import held_back

    [line] = held_back(shipped(), profile)
    assert line.startswith("verl 0.9.1 (torch 2.11.0, CUDA 13.0, vLLM 0.24.0)") and says in line
    assert held_back(shipped(), "h100") == []


@pytest.mark.parametrize(
    "profile, mib", [("b200", 183359), ("b300", 275040), ("5090", 32607), ("rtx-pro-6000", 97887)]
)
def test_blackwell_memory_is_the_size_nvidia_smi_reports(profile, mib):
    d = resolved(profile).to_dict()
    assert shipped().memory["total_mib"][profile]["mib"] == mib
    assert d["memory"]["usable_gib"] < mib / 1024


def test_torch_2_15_is_pypis_cuda_13_2_build_for_python_3_11_up():
    """torch 2.15.0's PyPI wheels are +cu132 (cuda-toolkit 13.2.2) for cp311-cp315: Requires-Python
    >=3.11. No shipped profile runs it (no vLLM pins it yet); a CUDA 13.0 image takes its cu130
    build from the PyTorch index."""
    rec = shipped().torch["2.15.0"]
    assert rec["pypi_default"] == "cu132" and "3.10" not in rec["python"]
    assert rec["builds"]["cu132"]["cuda"] == "13.2"
    assert rec["builds"]["cu130"]["archs"] == shipped().torch["2.14.1"]["builds"]["cu130"]["archs"]


def test_verl_0_9_1_floors_at_python_3_11_and_says_why():
    """verl 0.9.1's wheel says >=3.10, but its vllm extra's pins (accelerate 1.16.0, numpy 2.3.5,
    pyarrow 26.0.1) each need 3.11: the resolver refuses 3.10 with that reason (issue 34)."""
    from conftest import violations

    assert shipped().verl["0.9.1"]["python"] == ">=3.11,<3.13"
    found = violations("h100", python="3.10")
    v = found["verl-python"]
    assert v.hard and "accelerate 1.16.0, numpy 2.3.5 and pyarrow 26.0.1" in v.why
    assert "--python 3.12" in v.fix
    resolved("h100", python="3.12")
