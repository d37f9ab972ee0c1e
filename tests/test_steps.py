"""The install is one ordered list of steps (render/steps.py) and every route takes it from
there: the Dockerfile, apptainer.def, the by-hand command, install.sh, and the one executor of
`envbuild install` and `envbuild verify`. Each test plants a change in that one place and looks
for it in every route."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import resolved
from envbuilder.context.prepare import prepare
from envbuilder.render import steps as S
from envbuilder.render.dockerfile import dockerfile_plan
from envbuilder.render.plan import install_plan
from envbuilder.render.sif import post_steps


def _dockerfile_scripts(env) -> list[str]:
    """The scripts the Dockerfile's runtime stage runs, in order."""
    df = dockerfile_plan(env, install_plan(env, None), None)
    return [
        i.words[1].rsplit("/", 1)[-1] for i in df.blocks[-1] if i.keyword == "RUN" and i.words[0] == "python"
    ]


def _sif_scripts(env) -> list[str]:
    return [
        cmd.rsplit("/", 1)[-1]
        for _, cmd in post_steps(env, install_plan(env, None))
        if cmd.endswith(S.FINISH)
    ]


def test_the_steps_of_a_profile_in_order():
    """p40: the venv, its pip layers (HF rollout: no vLLM), apex compiled, then verl's patches
    and the audit."""
    ctx = prepare(resolved("p40"))
    env = ctx.env
    steps = S.install_steps(env, ctx.plan)
    kinds = [type(s).__name__ for s in steps]
    assert kinds == ["Venv", "PipLayer", "PipLayer", "PipLayer", "Compile", "RunScript", "RunScript"]
    assert [s.layer.name for s in steps if isinstance(s, S.PipLayer)] == ["torch", "verl-deps", "verl"]
    assert [s.script for s in steps if isinstance(s, S.RunScript)] == list(S.FINISH)
    # each layer installs within the pins of the layers up to it (the Dockerfile's cumulative -c)
    verl = steps[3]
    assert [ly.name for ly in verl.within] == ["torch", "verl-deps", "verl"]
    assert S.finish_command(env) == "python apply_patches.py && python audit_precision.py"


def test_a_step_dropped_in_one_place_leaves_every_route(monkeypatch):
    """The audit taken out of install_steps alone: the Dockerfile, apptainer.def and the by-hand
    command all lose it, and the Compile step gone takes apex out of the builder stage,
    apptainer.def, the rendered notes and `envbuild install`."""
    ctx = prepare(resolved("p40"))
    env = ctx.env
    assert _dockerfile_scripts(env) == _sif_scripts(env) == list(S.FINISH)
    real = S.install_steps

    def planted(e, plan):
        return tuple(s for s in real(e, plan) if s != S.RunScript(S.AUDIT) and not isinstance(s, S.Compile))

    monkeypatch.setattr(S, "install_steps", planted)
    assert _dockerfile_scripts(env) == _sif_scripts(env) == [S.PATCHES]
    assert S.finish_command(env) == "python apply_patches.py"
    df = dockerfile_plan(env, ctx.plan, None)
    assert not any("apex @" in " ".join(i.lines) for block in df.blocks for i in block)
    assert not any(what.startswith("apex") for what, _ in post_steps(env, ctx.plan))
    assert S.by_hand(env) == {}
    from envbuilder.machine.install import extension_commands

    assert extension_commands(env, Path("/env/bin/python")) == []


def test_steps_moved_in_one_place_move_in_every_route(monkeypatch):
    """The finishing scripts' order reversed in steps.FINISH: the Dockerfile, apptainer.def, the
    by-hand command and the wheelhouse's install.sh all run the audit first."""
    from envbuilder.offline.wheelhouse import _install_sh

    ctx = prepare(resolved("p40"))
    env = ctx.env
    before = _install_sh("p40", "[p40]=3.10")
    assert f"for script in {S.PATCHES} {S.AUDIT}; do" in before
    monkeypatch.setattr(S, "FINISH", tuple(reversed(S.FINISH)))
    assert _dockerfile_scripts(env) == _sif_scripts(env) == [S.AUDIT, S.PATCHES]
    assert S.finish_command(env) == "python audit_precision.py && python apply_patches.py"
    assert f"for script in {S.AUDIT} {S.PATCHES}; do" in _install_sh("p40", "[p40]=3.10")


def test_the_executor_runs_the_steps_it_is_given(monkeypatch, tmp_path):
    """install's and verify's one executor walks install_steps: planted as a venv and the audit
    alone, it makes the venv, installs no layer (each is reported empty), compiles nothing and
    runs the audit (which finds no verl in that venv: a failure, reported as the audit's)."""
    from envbuilder.machine.verify import Options, verify
    from envbuilder.secret import SecretUrl
    from envbuilder.tools.python import Interpreter

    env = resolved("p40")
    monkeypatch.setattr(S, "install_steps", lambda e, plan: (S.Venv(e.python), S.RunScript(S.AUDIT)))
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    r = verify(
        prepare(env),
        Interpreter(sys.executable, here),
        Options(
            index_url=SecretUrl("http://127.0.0.1:9/simple"),
            torch_index_url=SecretUrl("http://127.0.0.1:9/whl"),
            keep=tmp_path / "venv",
            skip_compose=True,
            imports=False,
        ),
    )
    assert (tmp_path / "venv" / "bin" / "python").exists()
    assert r.layers and all(x.get("empty") for x in r.layers)
    assert r.not_installed == [] and r.patches is None
    assert r.audit is not None and r.failures == [f for f in r.failures if f.startswith("precision audit")]


@pytest.mark.parametrize("profile", ["p40", "h100", "4090"])
def test_every_route_compiles_with_the_one_command(profile):
    """A Compile step's command is the component's, whichever route prints or runs it."""
    ctx = prepare(resolved(profile, **({"with_": ["flash-attn"]} if profile == "h100" else {})))
    env = ctx.env
    compiles = [s for s in S.install_steps(env, ctx.plan) if isinstance(s, S.Compile)]
    for step in compiles:
        argv = S.compile_argv(env, step, ["pip", "install"])
        assert "--no-build-isolation" in argv
        shell = S.compile_shell(env, step, "pip install")
        assert S.by_hand(env)[step.component] == shell
        for word in argv[1:]:
            assert word in shell or repr(word)[1:-1] in shell or f"'{word}'" in shell, word
