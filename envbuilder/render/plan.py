"""The install plan of a resolved environment, as the Dockerfile's pip layers run it: each
layer's requirements, the requirements.in a lock solves, and the constraints (BuildContext.constraints,
the pins context.prepare took from a lock: lock/constraints.py, handed to `install_plan`) that
pin everything beyond the top-level pins.
Pure and light: `render` imports it; it reads no lock.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from envbuilder.record import Record
from envbuilder.model.resolved import Constraints, Overrides, ResolvedEnv

# Dockerfile install layers, most expensive first; each installs what its roots pull in that no
# earlier layer installed.
LAYERS = ("torch", "vllm", "sglang", "verl-deps", "verl", "megatron")
# What the builder stage installs beside torch to compile apex / flash-attn; locked with the rest
# so a locked or offline build pins them too. Installed in the builder only, never at run time.
BUILD_TOOLS = ("packaging", "ninja", "wheel", "setuptools", "psutil")
# a pinned requirement (name[extras]==version), as the plan and a lock write them
REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
_LOCAL = re.compile(r"\+cu\d+$")
CONSTRAINTS = "constraints/{layer}.txt"  # one file per install layer (render writes them)


@functools.lru_cache(maxsize=None)
def normalize(name: str) -> str:
    """PEP 503 (text.canonical_name), cached: a render of every profile asks it thousands of
    times."""
    from envbuilder.text import canonical_name

    return canonical_name(name)


def layer_roots(env: ResolvedEnv) -> dict[str, list[str]]:
    """The requirements each install layer asks for (its own top-level pins), in order. The
    sglang step only where the rollout is SGLang (a lock of any other plan names no such step)."""
    roots = {
        "torch": list(env.torch.packages),
        "vllm": [f"vllm=={env.vllm.version}"] if env.vllm else [],
        # SGLang and its kernel wheel, both pinned (the kernel's ops are built against the torch)
        "sglang": [env.sglang.requirement, env.sglang.kernel] if env.sglang else [],
        "verl-deps": [f"{name}=={version}" for name, version in env.verl.pins.items()],
        "verl": [f"verl=={env.verl.version}"],
        # verl's Megatron engine: megatron-core, the bridge, TransformerEngine's core wheel and what
        # its PyTorch extension (compiled, installed with --no-deps) imports
        "megatron": [f"{name}=={version}" for name, version in env.megatron.packages.items()]
        if env.megatron
        else [],
    }
    if not env.sglang:
        del roots["sglang"]
    if not env.megatron:
        del roots["megatron"]
    return roots


class Layer(Record):
    """One pip step: what it asks for and what it fixes for itself and every later step.
    name: torch, vllm, sglang, verl-deps, verl; `build` for the builder stage's tools. requirements: its
    own top-level pins. pins: name==version, its own pins and the lock's pins of what it
    installs. arg: a build ARG that can override its package's version (VERL_VERSION)."""

    name: str
    requirements: tuple[str, ...]
    pins: tuple[str, ...]
    arg: str | None = None

    @property
    def constraints_file(self) -> str:
        return CONSTRAINTS.format(layer=self.name)


class InstallPlan(Record):
    """How a resolved environment is installed, once, for every consumer: the Dockerfile's
    stages and steps, requirements.txt, environment.yml, the lock's requirements.in, verify.
    torch_index: where +cuXXX builds come from (PyPI second). layers: the runtime stage's pip
    steps in order (empty ones left out). builder: the builder stage's torch and tools, None when
    nothing is compiled. conda_specs: what environment.yml asks conda for. pinned_from: the lock
    whose pins the layers carry (None: top-level pins only). torch_swapped: that lock was solved
    with PyPI's torch, so torch's own pins are the profile's."""

    pypi: str
    torch_index: str | None
    layers: tuple[Layer, ...]
    builder: Layer | None
    conda_specs: tuple[str, ...]
    pinned_from: str | None
    torch_swapped: str | None

    def upto(self, name: str) -> tuple[Layer, ...]:
        """The runtime layers up to and including `name`: a step installs within all of them."""
        names = [layer.name for layer in self.layers]
        return self.layers[: names.index(name) + 1]

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(r for layer in self.layers for r in layer.requirements)


def conda_specs(env: ResolvedEnv) -> list[str]:
    """What environment.yml asks conda for: python, pip, and nvcc when something is compiled."""
    out = [f"python={env.python}", "pip"]
    if env.needs_builder:
        v = env.cuda.version
        out += [env.cuda.conda_nvcc, f"cuda-cudart-dev={v}", f"cuda-libraries-dev={v}"]
    return out


def install_plan(env: ResolvedEnv, constraints: Constraints | None) -> InstallPlan:
    """The plan of `env` within `constraints`: the pins of the lock context.prepare found for it
    (BuildContext.constraints), None where none fits."""
    locked = constraints.layers if constraints else {}

    def pins(name: str, own: list[str]) -> tuple[str, ...]:
        """(a constraint names no extras: ray[default]==2.46.0 pins ray==2.46.0)"""
        mine = {}
        for r in own:
            m = REQ.match(r)
            if m:
                mine[normalize(m[1])] = f"{normalize(m[1])}=={m[2]}"
        for pin in locked.get(name, ()):
            mine.setdefault(normalize(pin.split("==")[0]), pin)
        return tuple(sorted(mine.values()))

    layers = [
        Layer(name, tuple(own), pins(name, own), "VERL_VERSION" if name == "verl" else None)
        for name, own in layer_roots(env).items()
        if own
    ]
    builder = None
    if env.needs_builder:
        own = [env.torch.packages[0], *BUILD_TOOLS]
        builder = Layer("build", tuple(own), pins("build", [env.torch.packages[0]]))
    return InstallPlan(
        env.indexes.pypi,
        env.indexes.torch,
        tuple(layers),
        builder,
        tuple(conda_specs(env)),
        constraints.from_ if constraints else None,
        constraints.torch_swapped if constraints else None,
    )


def requirements_in(env: ResolvedEnv, swap_torch: bool = False) -> str:
    """What a lock solves. `swap_torch`: PyPI's build of the same torch version in place of a
    `+cuXXX` one (for when the PyTorch index is out of reach)."""
    reqs = [r for layer in layer_roots(env).values() for r in layer]
    if env.needs_builder:
        reqs += list(BUILD_TOOLS)
    if swap_torch:
        reqs = [_LOCAL.sub("", r) for r in reqs]
    return "".join(f"{r}\n" for r in reqs)


def torch_swap(env: ResolvedEnv) -> str | None:
    """'2.6.0+cu118 -> 2.6.0' when the profile's torch is a +cuXXX build PyPI does not serve."""
    t = env.torch
    if not t.index_url:
        return None
    return f"{t.version}+{t.variant} -> {t.version} (PyPI's build)"


def override_flags(overrides: Overrides) -> str:
    """The override flags as the user would type them again (" --verl 0.5.0 --with apex"): the
    words of model/flags.py, each quoted for the shell."""
    from envbuilder.model.flags import words
    from envbuilder.render.quoting import sh

    return "".join(f" {sh(w)}" for w in words(overrides))


def lock_hint(profile: str, overrides: Overrides, out: str | Path | None = None) -> str:
    """How to pin a render that no lock fits: for the profile as shipped `envbuild lock
    PROFILE` (render finds lockfiles/PROFILE); for a variant, `lock -o DIR` into a folder of
    locks of its own (it writes DIR/PROFILE/; -o lockfiles would replace the profile's
    lockfiles/PROFILE) and the `render --locked DIR` (which reads DIR/PROFILE/), with the
    user's -o, that uses it."""
    from envbuilder.render.quoting import sh

    flags = override_flags(overrides)
    if not flags:
        return f"`envbuild lock {sh(profile)}` makes one"
    lock_dir = sh(
        f"lockfiles/{profile}-"
        + "-".join(
            f"{k}{','.join(v) if isinstance(v, list) else str(v).replace('/', '_')}"
            for k, v in overrides.to_dict().items()
            if v is not True
        )
    )
    return (
        f"`envbuild lock {sh(profile)}{flags} -o {lock_dir}` makes one, and `envbuild render "
        f"{sh(profile)}{flags} --locked {lock_dir}" + (f" -o {sh(str(out))}" if out else "") + "` uses it"
    )
