"""What pixi.toml says, as data, from the same install plan as environment.yml and
requirements.txt: the conda part (plan.conda_specs) as pixi's [dependencies], the pinned pip set
(every layer's pins: the lock's whole set where one fits) as [pypi-dependencies], torch's own
packages from the PyTorch index where the profile needs it, the CUDA the driver must offer, and
the rendered scripts as tasks. Pure: templates/pixi.toml.j2 writes it, every value through the
`toml` filter (quoting.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import re

from envbuilder.model.resolved import ResolvedEnv

if TYPE_CHECKING:
    from collections.abc import Iterable

    from envbuilder.render.plan import InstallPlan

# the pixi platform of the profile's host: x86_64, or aarch64 for the Grace systems (GH200, GB200:
# only the stacks PyPI serves for aarch64 resolve there, rules._rule_machine)
PLATFORMS = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}
# and its OCI platform (an image's, BuildKit's --platform)
OCI_PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
# one conda spec of plan.conda_specs: `name` or `name=version` (conda's `=` means version.*)
_CONDA_SPEC = re.compile(r"([a-z0-9][a-z0-9._-]*)(?:=([0-9][0-9A-Za-z._+]*))?")
# a requirement of a layer: name[extras]==version
_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?==(\S+)")


def conda_dependencies(specs: Iterable[str]) -> list[tuple[str, str]]:
    """[(name, pixi version spec)] of conda specs: `python=3.10` -> ("python", "3.10.*"), `pip`
    -> ("pip", "*"). A spec of another shape is a ValueError (the matrix schema lets none in)."""
    out = []
    for spec in specs:
        m = _CONDA_SPEC.fullmatch(spec)
        if not m:
            raise ValueError(
                f"{spec!r} is not a conda spec envbuild writes into pixi.toml (name or name=version)"
            )
        out.append((m[1], f"{m[2]}.*" if m[2] else "*"))
    return out


def pypi_dependencies(env: ResolvedEnv, plan: InstallPlan) -> list[str]:
    """pixi.toml's [pypi-dependencies] lines, sorted by name: every pin of every runtime layer
    (the top-level pins and, with a lock, everything they pull in), with the extras the
    top-level requirement asks for, and `index` (the PyTorch index) for torch's own packages
    where the profile installs a +cuXXX build from it. Each value quoted for TOML here."""
    from envbuilder.render.plan import normalize

    extras: dict[str, tuple[str, ...]] = {}
    for req in plan.requirements:
        m = _REQUIREMENT.fullmatch(req)
        if m and m[2]:
            extras[normalize(m[1])] = tuple(e.strip() for e in m[2].split(",") if e.strip())
    torch_own = set()
    if plan.torch_index:
        torch_own = {normalize(m[1]) for m in map(_REQUIREMENT.fullmatch, env.torch.packages) if m}
    pins: dict[str, str] = {}
    for layer in plan.layers:
        for pin in layer.pins:
            name, _, version = pin.partition("==")
            pins.setdefault(normalize(name), version)
    lines = []
    for name, version in sorted(pins.items()):  # (hundreds a locked profile)
        own = extras.get(name, ())
        index = plan.torch_index if name in torch_own else None
        if not own and not index and _BARE_NAME.fullmatch(name) and _PLAIN_VERSION.fullmatch(version):
            lines.append(f'{name} = "=={version}"')  # (what toml() and tomlkey() would write)
        else:
            lines.append(_pypi_line(name, f"=={version}", own, index))
    return lines


# a normalised name that is a bare TOML key, a version that is a TOML string as it stands
_BARE_NAME = re.compile(r"[a-z0-9-]{1,100}", re.ASCII)
_PLAIN_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,100}", re.ASCII)


def _pypi_line(name: str, version: str, extras: tuple[str, ...], index: str | None) -> str:
    """`name = "==1.0"`, or `name = { version = "==1.0", extras = [...], index = "..." }`."""
    from envbuilder.render.quoting import toml, tomlkey

    if not (extras or index):
        return f"{tomlkey(name)} = {toml(version)}"
    parts = [f"version = {toml(version)}"]
    if extras:
        parts.append(f"extras = [{', '.join(toml(e) for e in extras)}]")
    if index:
        parts.append(f"index = {toml(index)}")
    return f"{tomlkey(name)} = {{ {', '.join(parts)} }}"


def channels(env: ResolvedEnv) -> list[str]:
    """environment.yml's channels: nvidia's label of the profile's CUDA (through the mirror's
    conda_nvidia) where nvcc is installed, then the profile's channels."""
    out = []
    if env.needs_builder:
        nvidia = (env.mirror.conda_nvidia if env.mirror else None) or "nvidia"
        out.append(f"{nvidia}/label/cuda-{env.cuda.full_version}")
    return out + list(env.conda_channels)


def tasks(env: ResolvedEnv, run_script: str) -> list[dict[str, Any]]:
    """pixi's tasks, in the rendered folder (the workspace's root): preflight, prepare-data
    (where the profile trains on a dataset) and train. `pixi run train ARGS` passes ARGS on as
    the run script's extra Hydra overrides, which preflight checks."""
    from envbuilder.render.steps import finish_command

    out: list[dict[str, Any]] = [
        {
            "name": "patch",
            "cmd": finish_command(env),
            "description": "verl's recorded patches for this GPU, then the precision audit (as the image's build does)",
        },
        {
            "name": "preflight",
            "cmd": "python preflight.py",
            "description": "check the GPU, driver and the training path's imports",
            "depends_on": ["patch"],
        },
    ]
    if env.dataset:
        out.append(
            {
                "name": "prepare-data",
                "cmd": "python prepare_gsm8k.py --out $HOME/data/gsm8k",
                "description": "GSM8K in verl's layout, where the run script reads it",
            }
        )
    out.append(
        {
            "name": "train",
            "cmd": f"bash {run_script}",
            "description": "verl PPO with the memory plan's batch sizes; extra Hydra overrides follow",
            "env": {"ENVBUILD_HOME": "$PIXI_PROJECT_ROOT"},
            "depends_on": ["patch"],
        }
    )
    return out


def context(env: ResolvedEnv, plan: InstallPlan, run_script: str) -> dict[str, Any]:
    """What templates/pixi.toml.j2 writes."""
    return {
        "name": f"envbuild-{env.profile}",
        "channels": channels(env),
        "platforms": [PLATFORMS[env.gpu.machine]],
        "cuda": env.cuda.version,
        "conda": conda_dependencies(plan.conda_specs),
        "pypi": "".join(f"\n{line}" for line in pypi_dependencies(env, plan)),
        "index_url": plan.pypi,
        "tasks": tasks(env, run_script),
    }
