"""The Dockerfile's steps as data (render/dockerfile.py): every decision is made there and the
template only prints. These tests read the steps, not the text; the goldens hold the text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import PROFILES, resolved
from envbuilder.render import image as I
from envbuilder.render.dockerfile import (
    SECRETS,
    Instruction,
    _tojson,
    dockerfile_plan,
)
from envbuilder.render.files import render_files
from envbuilder.render.plan import install_plan
from envbuilder.context.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"


def steps_of(profile: str, locked=None, **kw):
    ctx = prepare(resolved(profile, **kw))
    env = ctx.env
    return env, dockerfile_plan(env, ctx.plan, locked, (), "f" * 64)


def fake_locked(env, *, wheelhouse=False, uv_wheel=None, build=True, empty=()):
    """A `locked` context as lock.lockfile.for_render makes it (its files made up): every
    install mode is a few keys of it."""
    layers = {
        name: None if name in empty else f"locked-{name}.txt"
        for name in ("torch", "vllm", "verl-deps", "verl")
    }
    if env.needs_builder:
        layers["build"] = "locked-build.txt" if build else None
    from envbuilder.render.locked import LockedContext

    return LockedContext(
        sbom="",
        sbom_sha256="e" * 64,
        images={k: f"{v}@sha256:{'a' * 64}" for k, v in env.cuda.images.items()},
        images_pinned=True,
        layers=layers,
        files={},
        input_sha256="b" * 64,
        wheelhouse=wheelhouse,
        links={},
        uv_wheel=uv_wheel,
        apex_source={"sha256": "c" * 64, "filename": "apex.tar.gz"} if env.apex else None,
        flash_attn_wheels={"flash_attn-2.whl": "d" * 64} if env.flash_attn else None,
    )


def runs(block) -> list[Instruction]:
    return [i for i in block if i.keyword == "RUN"]


def shell(i: Instruction) -> str:
    return " ".join(i.lines)


# -- the template only prints


def test_the_dockerfile_template_decides_nothing():
    """Dockerfile.j2 holds no condition, no pin parsing, no look at the previous layer and no
    path, label or install option of its own: only loops that print the plan's steps."""
    text = (TEMPLATES / "Dockerfile.j2").read_text()
    code = re.sub(r"\{#.*?#\}", "", text, flags=re.S)  # (its comments may name what it no longer does)
    statements = re.findall(r"\{%-?\s*(\w+)", code)
    assert set(statements) <= {"set", "for", "endfor"}, statements
    assert statements.count("for") <= 5
    for decided in (
        "split(",
        "previtem",
        "/opt/",
        "io.envbuild",
        "--mount",
        "pip install",
        "locked",
        "plan.",
    ):
        assert decided not in code, decided
    assert not (TEMPLATES / "_macros.j2").exists()


def test_image_facts_are_spelled_once_in_python():
    """The venv, envbuild's folder in the image and the label prefix are written in
    render/image.py alone; the templates print them from there."""
    facts = ("/opt/venv", "/opt/envbuild", "io.envbuild.")
    for path in [*(ROOT / "envbuilder").rglob("*.py"), *TEMPLATES.rglob("*.j2")]:
        if path == ROOT / "envbuilder" / "render" / "image.py":
            continue
        text = path.read_text(encoding="utf-8")
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("#", '"""')))
        for fact in facts:
            assert f'"{fact}' not in code and f"'{fact}" not in code, (path, fact)
            if path.suffix == ".j2":
                assert fact not in text, (path, fact)


# -- the steps


def test_an_unlocked_plain_profile_installs_each_step_with_uv_within_the_earlier_steps_pins():
    env, df = steps_of("4090")
    assert len(df.blocks) == 2  # base-image ARGs, runtime: no builder
    runtime = df.blocks[-1]
    assert runtime[0].words == ("${BASE_RUNTIME}", "AS", "runtime")
    assert any(i.keyword == "ENV" and "UV_LINK_MODE=copy" in i.words for i in runtime)
    steps = [r for r in runs(runtime) if "uv pip install" in shell(r)]
    assert len(steps) == len(install_plan(env, None).layers) == 3
    torch, deps, verl = steps
    assert "-c /tmp/envbuild/constraints/torch.txt" in shell(deps)
    assert "-c /tmp/envbuild/constraints/verl-deps.txt" not in shell(torch)
    assert shell(verl).endswith('"verl==${VERL_VERSION}"')
    # the version of the verl step's build ARG is the plan's pin, parsed here
    assert Instruction("ARG", (f"VERL_VERSION={env.verl.version}",), (), ()) in [
        i._replace(comments=()) for i in runtime
    ]
    for r in steps:
        assert r.words[0] == "--mount=type=cache,target=/root/.cache/uv" and r.words[-3:] == SECRETS
        assert r.lines[0].startswith(f"    . {I.SECRETS_SCRIPT} && ")


def test_the_builders_wheels_go_in_once_right_before_verls_first_step():
    env, df = steps_of("p40")
    assert [b[0].words[-1] for b in df.blocks[1:]] == ["builder", "runtime"]
    runtime = runs(df.blocks[-1])
    wheels = [k for k, r in enumerate(runtime) if "from=builder" in " ".join(r.words)]
    assert len(wheels) == 1
    nxt = runtime[wheels[0] + 1]
    first_verl = next(ly for ly in install_plan(env, None).layers if ly.name in ("verl-deps", "verl"))
    assert f"constraints/{first_verl.name}.txt" in shell(nxt) or "verl==" in shell(nxt)
    got = runtime[wheels[0]]
    assert not set(SECRETS) & set(got.words)  # (installs local files: no index, no secrets)
    assert got.lines == ("    uv pip install --no-deps /wheels/*.whl",)


def test_locked_steps_install_hashed_files_and_skip_an_empty_one():
    ctx = prepare(resolved("p40"))
    env = ctx.env
    locked = fake_locked(env, empty=("verl-deps",))
    df = dockerfile_plan(env, ctx.plan, locked)
    text = " ".join(shell(r) for r in runs(df.blocks[-1]))
    assert "--require-hashes" in text and "-r /tmp/envbuild/locked-torch.txt" in text
    assert "locked-verl-deps.txt" not in text and "constraints/" not in text
    # the builder: torch and the build tools, each from its own hashed file, one RUN
    [torch] = [r for r in runs(df.blocks[1]) if "locked-torch.txt" in shell(r)]
    assert torch.lines[1].startswith("    && pip install --no-deps --require-hashes ")
    assert torch.lines[1].endswith(" -r /tmp/envbuild/locked-build.txt")
    assert df.blocks[0][0].words[0].endswith("@sha256:" + "a" * 64)
    assert any(n.startswith("Locked: base images by digest") for n in df.notes)


def test_a_wheelhouse_without_a_uv_wheel_installs_the_runtime_with_pip_and_no_index():
    ctx = prepare(resolved("4090"))
    env = ctx.env
    for uv_wheel, installer in ((None, "pip install"), ("uv.whl", "uv pip install")):
        df = dockerfile_plan(env, ctx.plan, fake_locked(env, wheelhouse=True, uv_wheel=uv_wheel))
        steps = [r for r in runs(df.blocks[-1]) if "locked-" in shell(r)]
        assert steps and all(
            f"    . {I.SECRETS_SCRIPT} && {installer} --no-index --find-links /wheelhouse" in r.lines[0]
            and "--mount=type=bind,source=wheelhouse,target=/wheelhouse" in r.words
            for r in steps
        )
        assert any(i.keyword == "ENV" and "UV_LINK_MODE=copy" in i.words for i in df.blocks[-1]) == bool(
            uv_wheel
        )


def test_apex_flags_are_spelled_once_for_the_dockerfile_and_the_by_hand_command():
    """The apex block (model/components/apex.py) makes apex's build argv once: the by-hand
    command, the builder stage's step, apptainer.def's %post and `envbuild install` run it."""
    import shlex

    from envbuilder.model.components import apex as A
    from envbuilder.render.sif import post_steps

    for install in ("env", "config_settings"):
        env = resolved("p40")
        apex = env.apex._replace(install=install)
        argv = A.build_argv(apex, ["pip", "install", "-v"], f"apex @ {apex.url}")
        assert shlex.split(A.shell_command(apex)) == argv[1:]  # (`env` runs the assignments)
        assert ("APEX_CPP_EXT=1" in argv) == (install == "env") == ("--build-option=--cpp_ext" not in argv)
        assert f"TORCH_CUDA_ARCH_LIST={env.gpu.compute_capability}" in argv
        env = env._replace(apex=apex)
        df = dockerfile_plan(env, install_plan(env, None), None)
        [step] = [r for r in runs(df.blocks[1]) if "apex @" in shell(r)]
        for w in A.build_env(apex) + A.build_options(apex):
            assert w in shell(step), w
        [(_, post)] = [
            (what, cmd) for what, cmd in post_steps(env, install_plan(env, None)) if what.startswith("apex")
        ]
        assert all(w in post for w in A.build_env(apex) + A.build_options(apex)), post


def test_no_file_but_the_apex_block_spells_apexs_build_flags():
    """A second spelling of apex's extension flags would drift from the block's: none may exist."""
    spelled = []
    for path in [*(ROOT / "envbuilder").rglob("*.py"), *(ROOT / "templates").rglob("*.j2")]:
        if path.name == "apex.py" and path.parent.name == "components":
            continue
        text = path.read_text(encoding="utf-8")
        spelled += [
            f"{path.relative_to(ROOT)}: {w}"
            for w in ("cpp_ext", "cuda_ext", "APEX_CPP_EXT", "APEX_CUDA_EXT")
            if w in text
        ]
    assert spelled == []


@pytest.mark.parametrize("pinned", [False, True])
def test_flash_attn_takes_the_locked_wheel_or_falls_back_to_the_sdist(pinned):
    ctx = prepare(resolved("h200", verl="0.6.1"))
    env = ctx.env
    assert env.flash_attn
    df = dockerfile_plan(env, ctx.plan, fake_locked(env) if pinned else None)
    [fa] = [r for r in runs(df.blocks[1]) if "flash_attn_wheel.py" in shell(r)]
    text = shell(fa)
    assert ("--pins " in text) == pinned
    assert ("pip wheel" in text) == (not pinned)  # (the sdist build only when nothing is pinned)
    assert text.endswith("; }; }" if not pinned else "--dest /wheels; }")


def test_labels_are_the_images_in_the_dockerfile_and_in_the_sif():
    from envbuilder.engines.apptainer import labels as sif_labels

    env, df = steps_of("t4")
    [label] = [i for i in df.blocks[-1] if i.keyword == "LABEL"]
    pairs = [label.words[0], *(ln.strip() for ln in label.lines)]
    for key, value in I.labels(env):
        assert f'{key}="{value}"' in pairs
    assert f'{I.LABEL}spec-sha256="{"f" * 64}"' in pairs
    sif = dict(sif_labels(env, "r/x@sha256:" + "e" * 64, None))
    assert dict(I.labels(env)).items() <= sif.items()


def test_the_runtime_env_is_what_the_dockerfile_sets():
    for profile in ("p40", "h200"):
        env = resolved(profile)
        text = render_files(prepare(env))["Dockerfile"]
        for name, value in I.runtime_env(env):
            assert re.search(rf"^ENV .*{name}=", text, re.M) or f"{name}={value}" in text, name
        assert f"VIRTUAL_ENV={I.VENV} PATH={I.VENV}/bin:$PATH" in text


def test_tojson_writes_what_the_templates_tojson_wrote():
    from envbuilder.render.files import jinja_env

    value = {"b": ["<x>", "a&b", "it's"], "a": 1}
    assert _tojson(value) == str(jinja_env().from_string("{{ v | tojson }}").render(v=value))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_step_prints_as_whole_lines(profile):
    """No word or continuation line carries a line break: each instruction prints as itself."""
    _, df = steps_of(profile)
    for block in df.blocks:
        for i in block:
            assert i.keyword.isupper() and i.words
            assert not any("\n" in w for w in (*i.words, *i.lines, *i.comments))
