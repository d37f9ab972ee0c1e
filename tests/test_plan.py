"""The install plan, step by step (in the manner of hpccm's per-building-block tests): what each
pip step asks for, what it installs within, and the Dockerfile line each step becomes."""

from __future__ import annotations

import re

import pytest

from conftest import resolved
from envbuilder.render.plan import BUILD_TOOLS, normalize
from envbuilder.context.prepare import prepare
from envbuilder.render.files import render_files


def plan_of(profile: str, **kw):
    return prepare(resolved(profile, **kw)).plan


def step_line(dockerfile: str, requirement: str) -> str:
    joined = dockerfile.replace("\\\n", " ")
    [line] = [ln for ln in joined.splitlines() if ln.startswith("RUN ") and requirement in ln]
    return line


def test_a_4090_plan_has_three_steps_and_no_builder():
    plan = plan_of("4090")
    assert [s.name for s in plan.layers] == ["torch", "verl-deps", "verl"]
    assert plan.builder is None and plan.torch_index is None
    assert plan.conda_specs == ("python=3.10", "pip")


def test_each_step_asks_for_its_own_pins_and_fixes_them_without_extras():
    plan = plan_of("4090")
    d = resolved("4090").to_dict()
    deps = plan.layers[1]
    assert deps.requirements == tuple(f"{n}=={v}" for n, v in d["verl"]["pins"].items())
    pinned = {p.split("==")[0]: p.split("==")[1] for p in deps.pins}
    for req in deps.requirements:
        name, version = re.match(r"([^=\[]+)(?:\[[^\]]*\])?==(.+)", req).groups()
        assert pinned[normalize(name)] == version  # ray[default]==x pins ray==x
    assert all("[" not in p for p in deps.pins)
    assert plan.upto("verl-deps") == plan.layers[:2]


def test_the_verl_step_keeps_its_build_arg():
    plan = plan_of("4090")
    assert plan.layers[-1].arg == "VERL_VERSION"
    line = step_line(render_files(prepare(resolved("4090")))["Dockerfile"], '"verl==${VERL_VERSION}"')
    assert "torch==" not in line.split("constraints/verl.txt")[-1]  # not repeated: constrained


def test_a_later_step_installs_within_the_earlier_steps_pins_and_asks_only_its_own():
    dockerfile = render_files(prepare(resolved("4090")))["Dockerfile"]
    line = step_line(dockerfile, "accelerate==")
    assert "-c /tmp/envbuild/constraints/torch.txt -c /tmp/envbuild/constraints/verl-deps.txt" in line
    assert "source=constraints/torch.txt" in line and "source=constraints/verl-deps.txt" in line
    assert "torch==" not in line.split("constraints/verl-deps.txt ")[-1]


def test_a_vllm_profile_has_the_vllm_step_after_torch():
    plan = plan_of("t4")
    assert [s.name for s in plan.layers] == ["torch", "vllm", "verl-deps", "verl"]
    assert plan.layers[1].requirements == (f"vllm=={resolved('t4').to_dict()['vllm']['version']}",)


@pytest.mark.parametrize("profile", ["p40", "a100"])  # apex compiles in both
def test_a_compiling_profile_has_a_builder_with_torch_and_the_tools_and_nvcc_for_conda(profile):
    plan = plan_of(profile)
    d = resolved(profile).to_dict()
    assert plan.builder.requirements == (d["torch"]["packages"][0], *BUILD_TOOLS)
    assert d["torch"]["packages"][0] in plan.builder.pins
    assert d["cuda"]["conda_nvcc"] in plan.conda_specs
    dockerfile = render_files(prepare(resolved(profile)))["Dockerfile"]
    line = step_line(dockerfile, " ".join(BUILD_TOOLS))
    assert "constraints/torch.txt" in line and "constraints/build.txt" in line


def test_without_a_lock_the_steps_carry_their_top_level_pins_only():
    plan = plan_of("4090", torch="2.5.1")
    assert plan.pinned_from is None
    assert plan.layers[0].pins == tuple(
        sorted(f"{normalize(r.split('==')[0])}=={r.split('==')[1]}" for r in plan.layers[0].requirements)
    )


def runtime_and_builder_steps(dockerfile: str) -> tuple[list[str], list[str]]:
    """(the runtime stage's RUN lines that install, the builder stage's), continuations joined."""
    joined = dockerfile.replace("\\\n", " ")
    builder, _, runtime = joined.partition(" AS runtime\n")
    if not runtime:
        builder, runtime = "", builder
    pick = lambda text: [
        ln
        for ln in text.splitlines()  # noqa: E731
        if ln.startswith("RUN ") and re.search(r"\bpip install\b", ln)
    ]
    return pick(runtime), pick(builder)


@pytest.mark.parametrize("profile", ["p40", "4090", "t4"])
def test_the_runtime_steps_install_with_uv_pinned_by_sha256_and_the_builder_keeps_pip(profile):
    d = resolved(profile).to_dict()
    dockerfile = render_files(prepare(resolved(profile)))["Dockerfile"]
    runtime, builder = runtime_and_builder_steps(dockerfile)
    first, *steps = runtime
    # uv itself: pip installs the one wheel the matrix pins, by its sha256, before any step
    assert f"-r <(echo 'uv=={d['uv']['version']} --hash=sha256:{d['uv']['sha256']}')" in first
    assert " pip install --no-deps --require-hashes " in first
    assert "ENV UV_LINK_MODE=copy" in dockerfile
    assert steps and all(" uv pip install " in s and "target=/root/.cache/uv" in s for s in steps)
    for step in steps:
        if "/wheels/*.whl" in step:
            continue
        if d["torch"]["index_url"]:  # pip's choice among the two indexes, not uv's first-match
            assert (
                '--index-url "${TORCH_INDEX_URL}" --extra-index-url "${PIP_INDEX_URL}" '
                "--index-strategy unsafe-best-match"
            ) in step
        else:  # uv reads no PIP_INDEX_URL: every step names it
            assert '--index-url "${PIP_INDEX_URL}"' in step and "TORCH_INDEX_URL" not in step
    assert bool(builder) == bool(plan_of(profile).builder)
    assert all(" uv " not in s and "target=/root/.cache/pip" in s for s in builder)


@pytest.mark.parametrize("version", ["3.20;touch", "$(id)", '3.20"', "3.20\\x"])
def test_a_lock_pin_that_is_no_version_is_refused(cli, tmp_path, version):
    """Issue 33 #10: a self-consistent lock (its files' sha256 in lock.json, pylock.toml and
    requirements.lock agreeing) whose pin version is not a plain token reached the hashed
    locked-*.txt files of `render --locked` unchecked (`idna==$(id)`). The version is checked
    where the lock is parsed: exit 2 naming it, nothing written. (On the code before, each
    rendered.)"""
    import hashlib
    import json
    import shutil
    from pathlib import Path

    lock = tmp_path / "lock" / "4090"
    shutil.copytree(Path(__file__).parent / "fixtures" / "locks" / "4090", lock)
    for name, old, new in (
        ("requirements.lock", "idna==3.20", f"idna=={version}"),
        ("pylock.toml", 'name = "idna"\nversion = "3.20"', f'name = "idna"\nversion = {json.dumps(version)}'),
    ):
        text = (lock / name).read_text()
        assert old in text
        (lock / name).write_text(text.replace(old, new, 1))
    meta = json.loads((lock / "lock.json").read_text())
    meta["files"] = {f: hashlib.sha256((lock / f).read_bytes()).hexdigest() for f in meta["files"]}
    (lock / "lock.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    code, out, err = cli("render", "4090", "--locked", lock.parent, "-o", tmp_path / "out")
    assert code == 2, err
    assert "pins idna at" in err and "not a version" in err
    assert not (tmp_path / "out" / "4090").exists()
    code, out, err = cli("sbom", "4090", "--lock-dir", lock.parent)
    assert code == 2 and "not a version" in err


def test_render_locked_takes_every_pin_from_the_lock_it_names(cli, tmp_path):
    """Issue 33 #5: `render --locked DIR` took its Dockerfile layers and SBOM from DIR's lock but
    requirements.txt, environment.yml, pixi.toml and constraints/ from ./lockfiles/<profile>
    (or the shipped lock) whenever that one's plan matched: two locks' pins in one folder
    (accelerate 1.8.1 in the layers, 1.7.0 in the rest). Every file pins the named lock's now.
    (On the code before, constraints/ and requirements.txt pinned the other lock's version.)"""
    import hashlib
    import json
    import shutil
    from pathlib import Path

    named = Path(__file__).parent / "fixtures" / "locks"
    other = tmp_path / "lockfiles" / "4090"  # (the project's own lock: the render's cwd)
    shutil.copytree(named / "4090", other)
    for name, old, new in (
        ("requirements.lock", "anyio==4.16.0", "anyio==4.99.0"),
        ("pylock.toml", 'name = "anyio"\nversion = "4.16.0"', 'name = "anyio"\nversion = "4.99.0"'),
    ):
        text = (other / name).read_text()
        assert old in text
        (other / name).write_text(text.replace(old, new, 1))
    meta = json.loads((other / "lock.json").read_text())
    meta["files"] = {f: hashlib.sha256((other / f).read_bytes()).hexdigest() for f in meta["files"]}
    (other / "lock.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    code, out, err = cli("render", "4090", "-o", tmp_path / "plain")
    assert code in (0, None), err  # (a plain render takes the project's lock: 4.99.0)
    plain = "".join(p.read_text() for p in (tmp_path / "plain" / "4090" / "constraints").iterdir())
    assert "anyio==4.99.0" in plain
    code, out, err = cli("render", "4090", "--locked", named, "-o", tmp_path / "out")
    assert code in (0, None), err
    folder = tmp_path / "out" / "4090"
    texts = {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()}
    assert any("anyio==4.16.0" in t for n, t in texts.items() if n.startswith("locked-"))
    assert any("anyio==4.16.0" in t for n, t in texts.items() if n.startswith("constraints/"))
    assert not [n for n, t in texts.items() if "anyio==4.99.0" in t], [
        n for n, t in texts.items() if "anyio==4.99.0" in t
    ]
    assert "the lock --locked names (input_sha256 " in texts["envbuild.json"]
