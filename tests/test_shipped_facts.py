"""The shipped matrix's own facts: every profile resolves as shipped, without warnings, within its
verl's torch floor, into an environment of the kinds `render --from` checks. The resolver's rules
are tested on the frozen fixture matrix (tests/test_resolve.py, tests/fixtures/matrix); a matrix
update changes these tests and the goldens only."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, PROFILES, resolved, shipped
from envbuilder.model import matrix as M
from test_resolve import saved_variants

MATRICES = FIXTURES.parent.parent / "matrices"


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

    for label, text in saved_variants(shipped()):
        S.check(json.loads(text), field_spec(), f"{label}: ")


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
    from envbuilder.model.components.flash_attn import wheel_gap as flash_attn_wheel_gap

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


# -- issue 37: the facts a second review found wrong or missing, each with its source -----------


def test_torch_release_md_prs_are_labelled_by_the_release_they_add():
    """pytorch#187075 adds 2.13's row to RELEASE.md, #194367 2.14's; 2.15's build set rests on the
    open RFC #190385 (and PyPI's wheels); 2.12's PR is not identified, its records cite the wheels."""
    m = shipped()
    text = (MATRICES / "torch.yaml").read_text()
    assert "rel213: https://github.com/pytorch/pytorch/pull/187075 (RELEASE.md, the 2.13 row)" in text
    assert "rel214: https://github.com/pytorch/pytorch/pull/194367 (RELEASE.md, the 2.14 row)" in text
    assert "rfc215: https://github.com/pytorch/pytorch/issues/190385" in text
    assert "rel212:" not in text and "rel215:" not in text
    assert "rel213" in m.torch["2.13.0"]["source"] and "rel214" in m.torch["2.14.1"]["source"]
    assert m.torch["2.15.0"]["source"].startswith("rfc215") and "rel2" not in m.torch["2.15.0"]["source"]
    assert "rel2" not in m.torch["2.12.1"]["source"]


@pytest.mark.parametrize(
    "cuda, version, driver",
    [("13.0", "13.0.1", "580.82.07"), ("13.1", "13.1.1", "590.48.01"), ("13.2", "13.2.1", "595.58.03")],
)
def test_cuda_13_minors_carry_the_drivers_of_table_3(cuda, version, driver):
    """CUDA toolkit release notes, Table 3 (Linux x86_64): 13.0 Update 1 580.82.07, 13.1 Update 1
    590.48.01, 13.2 Update 1 595.58.03 (13.2 GA, PyPI's torch 2.15 cu132: 595.45.04; 13.0
    Update 2: 580.95.05). nvcc_archs of 13.1/13.2 are 13.0's, carried over unsourced (the record
    cites nvcc13x_unsourced)."""
    rec = shipped().cuda[cuda]
    assert (rec["version"], rec["min_driver"], rec["compat_driver"]) == (version, driver, "580.65.06")
    text = (MATRICES / "cuda.yaml").read_text()
    for fact in ("13.2 GA >= 595.45.04", "13.0 Update 2 >= 580.95.05", "13.1 GA >= 590.44.01"):
        assert fact in text
    if cuda != "13.0":
        assert "nvcc13x_unsourced" in rec["source"]
        assert rec["nvcc_archs"] == shipped().cuda["13.0"]["nvcc_archs"]


def test_torch_2_15_cu132_runs_on_cuda_13_2s_record():
    rec = shipped().torch["2.15.0"]
    assert rec["builds"]["cu132"]["cuda"] in shipped().cuda


def test_a_lock_names_the_build_tagged_torch_2_10_wheel_pip_and_uv_install():
    """PyPI holds torch-2.10.0-cp312-...x86_64.whl and torch-2.10.0-3-cp312-...x86_64.whl (build tag
    3, 2026-03-11); pip (`pip install --dry-run --no-deps torch==2.10.0` for cp312 x86_64) takes the
    `-3` file, so conda-lock.yml's one artifact is that one, whatever order pylock.toml lists them."""
    from envbuilder.lock.pip import pip_artifact

    base = "https://files.pythonhosted.org/packages/aa/bb/"
    plain = {
        "url": base + "torch-2.10.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "hashes": {"sha256": "a" * 64},
    }
    tagged = {
        "url": base + "torch-2.10.0-3-cp312-cp312-manylinux_2_28_x86_64.whl",
        "hashes": {"sha256": "b" * 64},
    }
    for wheels in ([plain, tagged], [tagged, plain]):
        assert pip_artifact({"name": "torch", "wheels": wheels}) == (tagged["url"], "b" * 64)
    assert "build_tag210" in shipped().torch["2.10.0"]["source"]


def test_verl_0_9_goes_no_further_than_vllm_0_31():
    """vLLM 0.32.0's METADATA: transformers>=5.16.1,<5.20.0; verl 0.9.x: transformers<5.11 (uv finds
    no solution for vllm==0.32.0 with transformers<5.11; 0.31.0 resolves, 2026-12-04)."""
    from conftest import violations

    for v in ("0.9.0", "0.9.1"):
        cap = shipped().verl[v]["vllm_max"]
        assert cap["version"] == "0.31.0" and "transformers>=5.16.1" in cap["why"]
    found = violations("h100", verl="0.9.0", vllm="0.32.0", torch="2.13.0")
    v = found["verl-vllm"]
    assert v.hard and "cannot go past vllm 0.31.0" in v.text() and "transformers>=5.16.1" in v.why


def test_the_newest_sglang_is_pinned_by_no_verl_release():
    """PyPI's sglang is at 0.5.23 (2026-12-04); verl 0.9.1's sglang extra pins 0.5.12."""
    text = (MATRICES / "sglang.yaml").read_text()
    assert "info.version 0.5.23" in text
    pinned = {rec["sglang"]["version"] for rec in shipped().verl.values() if rec.get("sglang")}
    assert "0.5.23" not in pinned and "0.5.23" not in shipped().sglang


def test_the_4090s_p2p_rule_follows_accelerates_driver_check():
    """Accelerate v1.14.0 environment.py:197-219 turns P2P off for "RTX 40" only below driver
    550.40.07; NCCL#1127 (the 3090) is no longer cited; the 5090 cites NCCL#1637 and sets no rule."""
    gpus = shipped().gpus
    assert gpus["4090"]["p2p_driver"] == "550.40.07" and "p2p" not in gpus["4090"]
    assert gpus["4090"]["p2p_source"] == "accelerate_p2p" and gpus["5090"]["p2p_source"] == "nccl1637"
    assert "NCCL_P2P_DISABLE" in resolved("4090", gpus_per_node=2).cluster.env
    assert resolved("4090", gpus_per_node=2, driver="545.29.06").cluster.env["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in resolved("4090", gpus_per_node=2, driver="550.54.15").cluster.env


@pytest.mark.parametrize("verl", ["0.8.0", "0.9.0", "0.9.1"])
def test_the_engines_autocast_follows_mixed_precision_param_dtype(verl):
    """verl/workers/engine/fsdp/transformer_impl.py sets _autocast_dtype from
    mixed_precision.param_dtype (0.8.0:358, 0.9.0:384, 0.9.1:403, read in the wheels)."""
    keys = shipped().verl[verl]["autocast_keys"]
    assert all(k.endswith(".mixed_precision.param_dtype") for k in keys.values())


def test_nccl_settings_not_covered_before_are_noted_with_sources():
    ics = shipped().sections["interconnects"]
    assert "NCCL_IB_TC" in ics["roce"]["note"] and "nccl_ib_sl" in ics["roce"]["source"]
    assert "NCCL_NET_GDR_LEVEL" in ics["ib"]["note"] and "nccl_gdr" in ics["ib"]["source"]
    assert "NCCL_NVLS_ENABLE" in ics["nvlink"]["note"] and "vllm_cumem" in ics["nvlink"]["source"]


def test_a_pin_of_pypis_apex_is_refused_with_what_it_is():
    """PyPI's apex 0.9.10dev is a Pyramid toolkit; verl 0.9.1's megatron extra names plain apex."""
    from conftest import violations

    m = shipped()
    prof = dict(m.profiles["h100"], pins={"apex": "0.9.10dev"})
    m2 = M.Matrix(dict(m.sections, profiles={"h100-apex": prof}), m.origin)
    v = violations("h100-apex", m2)["pypi-name"]
    assert v.hard and "Pyramid" in v.why and "remove apex from the profile's pins" in v.fix


# -- issue 37 item 1: GH200 and GB200 on the verl 0.9.1 stack (aarch64) -------------------------


@pytest.mark.parametrize("profile, mib", [("gh200", 97871), ("gb200", 189471)])
def test_grace_profiles_run_the_verl_0_9_1_stack_on_aarch64(profile, mib):
    """torch 2.11.0's aarch64 wheel on PyPI is cu130 (uv pulls cuda-toolkit 13.0.2 for it); vLLM
    0.24.0 has an aarch64 wheel; nvidia-smi prints 97871 MiB (GH200 96 GB) and 189471 MiB (GB200)."""
    d = resolved(profile).to_dict()
    assert (d["verl"]["version"], d["vllm"]["version"], d["torch"]["version"], d["cuda"]["version"]) == (
        "0.9.1",
        "0.24.0",
        "2.11.0",
        "13.0",
    )
    assert d["gpu"]["machine"] == "aarch64" and d["torch"]["index_url"] is None
    assert shipped().memory["total_mib"][profile]["mib"] == mib
    assert any(n.startswith("aarch64: PyPI serves this stack's aarch64 CUDA wheels") for n in d["notes"])


@pytest.mark.parametrize(
    "verl, words",
    [
        ("0.9.0", "PyPI's aarch64 torch 2.10.0 is a CPU build (no CUDA)"),
        ("0.6.1", "PyPI's aarch64 torch 2.8.0 is a CPU build (no CUDA)"),
        ("0.4.1", "vLLM 0.8.5 publishes no aarch64 wheel on PyPI"),
    ],
)
def test_older_stacks_are_refused_on_grace_with_the_true_reason(verl, words):
    """PyPI's aarch64 torch is a CPU build up to 2.10.0 (torch.yaml aarch64); vLLM's first aarch64
    wheel is 0.10.2 (vllm.yaml aarch64: none up to 0.10.1.1)."""
    from conftest import violations

    v = violations("gh200", verl=verl)["machine"]
    assert v.hard and words in v.why
    assert (
        shipped().torch["2.10.0"]["pypi_aarch64"] == "cpu"
        and shipped().torch["2.11.0"]["pypi_aarch64"] == "cu130"
    )
    assert not shipped().vllm["0.10.1.1"].get("aarch64") and shipped().vllm["0.10.2"]["aarch64"]


def test_pypis_aarch64_torch_is_cpu_up_to_2_10_and_cuda_from_2_11():
    """uv pip compile torch==X for aarch64-manylinux_2_39 (2026-12-04): no CUDA library up to
    2.10.0 (wheels of 91-139 MiB), cuda-toolkit 13.0.x from 2.11.0, 13.2.2 for 2.15.0."""
    t = shipped().torch
    assert {v: t[v]["pypi_aarch64"] for v in ("2.6.0", "2.8.0", "2.9.1", "2.10.0")} == dict.fromkeys(
        ("2.6.0", "2.8.0", "2.9.1", "2.10.0"), "cpu"
    )
    assert [t[v]["pypi_aarch64"] for v in ("2.11.0", "2.12.1", "2.14.1", "2.15.0")] == ["cu130"] * 3 + [
        "cu132"
    ]
    assert "pypi_aarch64" not in t["2.3.1"]  # not read: the record says so (torch.yaml aarch64)


@pytest.mark.parametrize("profile", ["gh200", "gb200"])
def test_a_grace_profiles_shipped_lock_pins_aarch64_files(profile):
    """lockfiles/gh200 and gb200 (uv for aarch64-manylinux_2_39 against PyPI): every platform
    wheel pylock.toml pins is an aarch64 one, torch's and vLLM's included."""
    import tomllib

    lock = MATRICES.parent / "lockfiles" / profile
    meta = json.loads((lock / "lock.json").read_text())
    assert meta["target"]["platform"] == "linux-aarch64"
    assert meta["target"]["python_platform"] == "aarch64-manylinux_2_39"
    packages = {p["name"]: p for p in tomllib.loads((lock / "pylock.toml").read_text())["packages"]}
    names = [w["url"].rsplit("/", 1)[1] for p in packages.values() for w in p.get("wheels", ())]
    platform = [n for n in names if not n.endswith("-none-any.whl")]
    assert platform and all("aarch64" in n for n in platform), [n for n in platform if "aarch64" not in n]
    assert any(n.startswith("torch-2.11.0-cp312-") for n in platform)
    assert any(n.startswith("vllm-0.24.0-") for n in platform)


def test_a_grace_image_installs_uvs_aarch64_wheel():
    """uv 0.13.9's manylinux_2_28 aarch64 wheel on PyPI (sha256 ecb6028d..., 16864124 bytes): the one
    pip picks on Ubuntu 24.04's glibc 2.39 over the manylinux_2_17 file; x86_64 keeps its own."""
    gh, h100 = resolved("gh200"), resolved("h100")
    assert gh.uv.filename == "uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl"
    assert gh.uv.sha256.startswith("ecb6028d") and gh.uv.size == 16864124
    assert h100.uv.filename.endswith("manylinux2014_x86_64.whl") and h100.uv.version == gh.uv.version


def test_gb200_carries_verl_0_9_1s_nccl_settings_and_gh200_does_not():
    """verl 0.9.1's _gb200_nccl_env applies from compute capability 10 (Blackwell) and is for
    GB200 nodes without IMEX: the GB200's cluster holds it for the launchers; the GH200 (9.0)
    and an HGX B200 (no multi-node NVLink, NVLS through its own NVSwitches) do not."""
    nccl = shipped().verl["0.9.1"]["nccl_env"]
    assert dict(nccl["env"]) == {"NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0"}
    assert dict(resolved("gb200", nodes=2).cluster.without_imex) == dict(nccl["env"])
    assert resolved("gh200", nodes=2).cluster.without_imex is None
    assert resolved("b200", nodes=2).cluster.without_imex is None
    assert "without_imex" not in resolved("b200").to_dict()["cluster"]


@pytest.mark.pypi
def test_verl_0_9_1s_gb200_nccl_settings_are_what_its_wheel_sets(verl_trees):
    """The recorded settings, floor and opt-in variable, read from the real wheel's
    verl/trainer/constants_ppo.py (not imported: it imports torch and ray)."""
    import ast

    nccl = shipped().verl["0.9.1"]["nccl_env"]
    source = (verl_trees["0.9.1"] / "verl" / "trainer" / "constants_ppo.py").read_text()
    tree = ast.parse(source)
    guard = next(
        n for n in ast.walk(tree) if isinstance(n, ast.If) and "_gb200_nccl_env" in ast.unparse(n.body[0])
    )
    assert ast.literal_eval(guard.body[0].value) == dict(nccl["env"])
    condition = ast.unparse(guard.test)
    major = nccl["min_compute_capability"].split(".")[0]
    assert f">= {major}" in condition and repr(nccl["opt_in"]) in condition and "== '1'" in condition
    # spread into the Ray runtime environment every PPO worker gets
    assert "**_gb200_nccl_env" in source.split("PPO_RAY_RUNTIME_ENV = {", 1)[1].split("\n}\n", 1)[0]


# ---- flash-attn on today's stack (issue 37, item 2): the corrected facts and their sources --------


def _extension_sources() -> dict:
    import yaml

    return yaml.safe_load((MATRICES / "extensions.yaml").read_text())["sources"]


def test_flash_attn_283_builds_for_torch_211_as_verl_091_installs_it():
    """extensions.yaml said 2.8.3 "builds from source for torch < 2.10"; verl 0.9.1 installs
    2.8.3 built for torch 2.11 / cu130 (its pyproject's flash-attn-cu130torch211 extra), and
    verl's wheelhouse builds it for torch 2.13 (tests/test_real_packages.py reads the sdist)."""
    fa = shipped().flash_attn
    rec = fa["versions"]["2.8.3"]
    assert M.in_range("2.11.0", rec["torch"]) and M.in_range("2.13.0", rec["torch"])
    assert {"verl091_pyproject", "wheelhouse_versions"} <= set(rec["source"].replace(" ", "").split(","))
    assert "flash-attn-cu130torch211 = flash-attn==2.8.3" in _extension_sources()["verl091_pyproject"]


def test_verls_wheel_index_is_recorded_with_its_worlds_and_source():
    fa = shipped().flash_attn
    idx = fa["wheel_indexes"]["verl-wheelhouse"]
    sources = _extension_sources()
    # verl 0.9.1's [[tool.uv.index]] names the /simple/ root; the wheelhouse serves one tree per
    # world (cu130/torch2.11/simple/), since one wheel file name serves several torch builds
    assert "https://verl-project.github.io/verl-wheelhouse/simple/" in sources["verl091_pyproject"]
    assert idx["url"].format(cuda="130", torch="2.11") == (
        "https://verl-project.github.io/verl-wheelhouse/cu130/torch2.11/simple/"
    )
    assert {"torch": "2.11", "cuda": "130", "python": ["3.12"], "versions": ["2.8.3"]} in idx["worlds"]
    assert idx["archs"] == {"x86_64": ["8.0", "9.0", "10.0", "12.0"], "aarch64": ["9.0", "10.0"]}
    for key in ("verl091_pyproject", "wheelhouse_versions", "wheelhouse_index", "wheelhouse_build"):
        assert key in idx["source"] and sources[key]


def test_flash_attn_283_and_its_post_releases_are_sdists_on_pypi():
    fa = shipped().flash_attn
    assert fa["pypi_sdist_only"] == ["2.8.3", "2.8.3.post1", "2.8.3.post2"]
    assert "sdists only" in _extension_sources()[fa["pypi_sdist_only_source"]]


def test_flash_attn_cuda_archs_are_setup_pys_gencodes():
    build = shipped().flash_attn["sdist_build"]
    assert build["archs"] == ["80", "90", "100", "120"]
    assert "fa_setup_283_archs" in build["source"]
