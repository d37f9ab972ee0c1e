"""The install as one ordered list of steps, the same for every route (hpccm's building blocks,
cog's ordered steps): make the venv, install each pip layer within the pins of the layers up to
it, compile what has no wheel for the card, then run verl's recorded patches and the precision
audit. `install_steps` is a pure function of the resolved environment and its install plan;
each route only says how a step is done there:

  Dockerfile        render/dockerfile.py   (the builder stage compiles, the runtime stage installs)
  apptainer.def     render/sif.py          (%post, one shell line per step)
  install.sh        offline/wheelhouse.py  (the lock whole from the wheelhouse, then the scripts)
  by hand           plan.finish_command    (what the rendered files tell a user to run last)
  install, verify   machine/verify.py      (the one executor: it runs each step in turn)

A step added, dropped or moved here moves in every route (tests/test_steps.py plants one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from envbuilder.record import Record
from envbuilder.render.plan import InstallPlan, Layer

if TYPE_CHECKING:
    from envbuilder.model.resolved import ResolvedEnv

APEX, FLASH_ATTN, TRANSFORMER_ENGINE = "apex", "flash-attn", "transformer-engine"
PATCHES, AUDIT = "apply_patches.py", "audit_precision.py"
FINISH = (PATCHES, AUDIT)  # the scripts an install ends with, in order (patches where verl has any)


class Venv(Record):
    """The environment every later step installs into, made from a Python of version `python`
    (another version is refused: the pins and wheels are for this one)."""

    python: str


class PipLayer(Record):
    """One pip layer (render/plan.Layer), installed within the pins of `within`: the layers up
    to and including it, as the Dockerfile's cumulative `-c` files do."""

    layer: Layer
    within: tuple[Layer, ...]


class Compile(Record):
    """An extension with no wheel for the card, compiled against the torch installed above:
    `component` apex or flash-attn, at `version`, for `arch` (sm_XY)."""

    component: str
    version: str
    arch: str


class RunScript(Record):
    """A script of the rendered folder run with the environment's Python: verl's recorded
    patches, then the precision audit (a failure of either stops the install)."""

    script: str


Step = Union[Venv, PipLayer, Compile, RunScript]


def install_steps(env: ResolvedEnv, plan: InstallPlan) -> tuple[Step, ...]:
    """Every step of `env`'s install, in order."""
    steps: list[Step] = [Venv(env.python)]
    steps += [PipLayer(layer, plan.upto(layer.name)) for layer in plan.layers]
    if env.apex:
        steps.append(Compile(APEX, env.apex.version, env.gpu.sm))
    if env.flash_attn:
        steps.append(Compile(FLASH_ATTN, env.flash_attn.version, env.flash_attn.arch or env.gpu.sm))
    if env.megatron:  # (TransformerEngine's PyTorch extension: an sdist only)
        steps.append(Compile(TRANSFORMER_ENGINE, env.megatron.transformer_engine, env.megatron.te_arch))
    steps += [RunScript(script) for script in FINISH if script != PATCHES or env.patches]
    return tuple(steps)


def compile_argv(env: ResolvedEnv, step: Compile, pip: list[str]) -> list[str]:
    """THE command that compiles `step`'s extension into the environment `pip` installs into
    (its words: ["python", "-m", "pip", "install"], or `pip wheel ... -w DIR`), as argv: `env`,
    the component's variables, pip, its options and requirement. The components' own blocks
    (model/components/apex.py, flash_attn.py) spell each one's flags."""
    from envbuilder.model.components import transformer_engine as te
    from envbuilder.model.components.registry import by_name

    c = by_name(step.component)  # (TransformerEngine comes with the Megatron engine: no registered one)
    return c.build_argv(env, pip) if c else ["env", *te.build_argv(env, pip)]


def compile_shell(env: ResolvedEnv, step: Compile, pip: str) -> str:
    """The same command as one shell line (`pip`: the installer's words as the shell reads
    them), as the rendered files print it. (apex's build is always verbose: its compile log is
    the only sign of what nvcc built.)"""
    from envbuilder.model.components import transformer_engine as te
    from envbuilder.model.components.registry import by_name

    if c := by_name(step.component):
        return c.build_shell(env, pip)
    # (CPATH from the same Python: `X -m pip ...` names it, else the one on PATH)
    return te.build_command(env, pip, pip.split(" -m pip")[0] if " -m pip" in pip else "python")


def by_hand(env: ResolvedEnv) -> dict[str, str]:
    """{component: the command that compiles it into an environment by hand} for the
    install's Compile steps (what requirements.txt, environment.yml, pixi.toml and preflight's
    record print; the builder stage and apptainer.def run the same command)."""
    from envbuilder.render.plan import install_plan

    # (a lock's pins reach only the pip layers, never a Compile step: no pins needed)
    steps = install_steps(env, install_plan(env, None))
    return {s.component: compile_shell(env, s, "pip install") for s in steps if isinstance(s, Compile)}


def finish_command(env: ResolvedEnv) -> str:
    """What finishes an environment installed without Docker, run in the rendered folder with
    its Python: the install's RunScript steps (the recorded patches of verl for this GPU where
    there are any, then the precision audit), as the Dockerfile's build runs them after the
    installs. README, requirements.txt, environment.yml, pixi's patch task and preflight's fix
    all name this one command."""
    from envbuilder.render.plan import install_plan

    # (a lock's pins reach only the pip layers, never a RunScript step: no pins needed)
    steps = install_steps(env, install_plan(env, None))
    return " && ".join(f"python {s.script}" for s in steps if isinstance(s, RunScript))
