"""The install plan of a resolved environment, as the Dockerfile's pip layers run it: each
layer's requirements, the requirements.in a lock solves, and the constraints that pin
everything beyond the top-level pins. Pure and light: `render` imports it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuilder.record import Record, frozen
from envbuilder.model.resolved import Constraints, Overrides, ResolvedEnv

if TYPE_CHECKING:
    from collections.abc import Iterable

# Dockerfile install layers, most expensive first; each installs what its roots pull in that no
# earlier layer installed.
LAYERS = ("torch", "vllm", "sglang", "verl-deps", "verl")
# What the builder stage installs beside torch to compile apex / flash-attn; locked with the rest
# so a locked or offline build pins them too. Installed in the builder only, never at run time.
BUILD_TOOLS = ("packaging", "ninja", "wheel", "setuptools", "psutil")
# Packages whose files differ between torch's CUDA builds (torch's own, and the CUDA runtime
# wheels it pulls in): a lock solved with PyPI's build of a torch version pins none of them for
# another build of that version.
TORCH_BUILD_PACKAGES = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*)$")
REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
# a pinned version as a lock may hold it: PEP 440 (epoch!, local +label) in one plain token
PIN_VERSION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.+!_-]{0,62}[A-Za-z0-9])?")
_HASH_LINE = re.compile(r"^[ \t]+--hash=[^\n]*\n?", re.M)
_LOCAL = re.compile(r"\+cu\d+$")
CONSTRAINTS = "constraints/{layer}.txt"  # one file per install layer (render writes them)


class Locked(Record):
    """A package's pin in a lock: version, hashes, and parents (the packages that pull it in;
    "" = asked for directly)."""

    version: str
    hashes: tuple[str, ...]
    parents: frozenset[str]


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
    }
    if not env.sglang:
        del roots["sglang"]
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


def install_plan(env: ResolvedEnv) -> InstallPlan:
    """The plan of `env` (with its `constraints`, plan.with_constraints, where a lock fits)."""
    c = env.constraints
    locked = c.layers if c else {}

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
        c.from_ if c else None,
        c.torch_swapped if c else None,
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


def plan_sha256(env: ResolvedEnv) -> str:
    """What a pip solution depends on: the requirements, the target Python and the CUDA image
    (its glibc), and a host other than x86_64 (an aarch64 solution pins other files; x86_64's
    text stays what its locks recorded). Not the index URLs (a mirror serves the same files)
    nor the templates."""
    text = f"{requirements_in(env)}\0python={env.python}\0cuda={env.cuda.version}\n"
    if env.gpu.machine != "x86_64":
        text += f"machine={env.gpu.machine}\n"
    return hashlib.sha256(text.encode()).hexdigest()


def parse(text: str, with_hashes: bool = True) -> dict[str, Locked]:
    """requirements.lock (uv's format, annotated) -> {normalized name: Locked}. Without
    `with_hashes` (what constraints need), the hash lines, most of a lock, are skipped unread."""
    out: dict[str, Locked] = {}
    name: str | None = None
    version = ""  # (read only once a name is)
    hashes: list[str] = []
    parents: set[str] = set()
    in_via = False

    def flush() -> None:
        if name:
            out[name] = Locked(version, tuple(hashes), frozenset(parents))

    if not with_hashes:  # one pass in C rather than a Python test per hash line
        text = _HASH_LINE.sub("", text)
    for line in text.splitlines():
        m = REQ.match(line)
        if m:
            flush()
            name, version, hashes, parents, in_via = normalize(m[1]), m[2], [], set(), False
            if not PIN_VERSION.fullmatch(version):
                from envbuilder.errors import UserError
                from envbuilder.text import shorten

                raise UserError(
                    f"requirements.lock pins {name} at {shorten(version, 60)!r}, which is not a "
                    "version (one token of letters, digits, '.', '+', '!', '_', '-'): it would "
                    "reach the pip files as it is. Re-lock with `envbuild lock`."
                )
            if with_hashes:
                hashes += HASH.findall(line)
            continue
        stripped = line.strip()
        if with_hashes:
            hashes += HASH.findall(stripped)
        if stripped.startswith("# via"):
            rest = stripped[len("# via") :].strip()
            in_via = not rest
            if rest:
                parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif in_via and stripped.startswith("#   "):
            rest = stripped[4:].strip()
            parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif not stripped.startswith("#"):
            in_via = False
    flush()
    return out


def layers(env: ResolvedEnv, locked: dict[str, Locked]) -> dict[str, list[str]]:
    """Each layer's packages: the closure of its roots over the lock's dependency edges, minus
    what an earlier layer installs. Anything left over goes into the last layer. The builder's
    `build` layer is the closure of the build tools on its own (it may overlap the others)."""
    children: dict[str, set[str]] = {}
    for name, entry in locked.items():
        for parent in entry.parents:
            children.setdefault(parent, set()).add(name)

    def closure(roots: Iterable[str], skip: frozenset[str] | set[str] = frozenset()) -> set[str]:
        todo = [normalize(m[1]) if (m := REQ.match(r)) else normalize(r) for r in roots]
        mine: set[str] = set()
        while todo:
            n = todo.pop()
            if n in skip or n in mine or n not in locked:
                continue
            mine.add(n)
            todo += children.get(n, ())
        return mine

    done: set[str] = set()
    out: dict[str, list[str]] = {}
    for layer, roots in layer_roots(env).items():
        mine = closure(roots, frozenset(done))
        done |= mine
        out[layer] = sorted(mine)
    build = closure(BUILD_TOOLS) if env.needs_builder else set()
    out[LAYERS[-1]] = sorted(set(out[LAYERS[-1]]) | (set(locked) - done - build))
    if env.needs_builder:
        out["build"] = sorted(build)
    return out


def constraint_layers(
    env: ResolvedEnv, requirements_lock: str | bytes, torch_swapped: bool, lock_sha256: str | None = None
) -> dict[str, list[str]]:
    """{layer: `name==version` of the packages that layer installs} (pip constraints take no
    extras and no hashes). One set per layer, so that a changed verl pin leaves the torch
    layer's set, and with it Docker's cache of that layer, as it was. From a lock solved with
    PyPI's torch: none of the packages that differ between torch builds.

    Kept as a sealed cache entry (paths.sealed_text) by the sha256 of the lock (`lock_sha256` where
    the caller has it), of what decides the layers (their roots, the builder, the swap) and of
    this file's code: a render of every profile reads a few MB of locks, and parsing and
    layering them was a third of `render --all`. A cache that can't be read or written is
    worked out afresh."""
    from envbuilder.paths import sealed_text, source

    def fresh() -> str:
        text = requirements_lock
        locked = parse(text.decode("utf-8") if isinstance(text, bytes) else text, with_hashes=False)
        return json.dumps(
            {
                layer: [
                    f"{n}=={locked[n].version}"
                    for n in names
                    if not (torch_swapped and TORCH_BUILD_PACKAGES.match(n))
                ]
                for layer, names in layers(env, locked).items()
            }
        )

    try:
        h = hashlib.sha256(source(__file__))
    except OSError:
        return json.loads(fresh())  # type: ignore[no-any-return]
    if lock_sha256 is None:
        data = requirements_lock.encode() if isinstance(requirements_lock, str) else requirements_lock
        lock_sha256 = hashlib.sha256(data).hexdigest()
    h.update(lock_sha256.encode())
    h.update(json.dumps([layer_roots(env), env.needs_builder, torch_swapped]).encode())
    return json.loads(sealed_text("lock", h.hexdigest(), fresh))  # type: ignore[no-any-return]


def lock_candidates(profile: str) -> list[tuple[str, Path]]:
    """Where a render looks for a lock of `profile`: the user's ./lockfiles, then the shipped."""
    from envbuilder.paths import data_dir

    from envbuilder.paths import LOCK_ROOT

    out = [(f"{LOCK_ROOT}/{profile}", LOCK_ROOT / profile)]
    try:
        out.append((f"envbuild's shipped lockfiles/{profile}", data_dir("lockfiles") / profile))
    except FileNotFoundError:
        pass
    return out


def find_constraints(env: ResolvedEnv, only: tuple[str, Path] | None = None) -> Constraints | None:
    """The constraints of the first lock whose plan is this environment's, read only when its
    requirements.lock hashes to what lock.json records; None when no lock fits. `only`: (what to
    call it, where it is) of the lock a `--locked DIR` or `--wheelhouse` render named, the one
    lock it may take pins from, named in the files by that and its input_sha256 (its
    Dockerfile's layers and SBOM pin that lock's versions: requirements.txt, environment.yml,
    pixi.toml and constraints/ must pin the same)."""
    from envbuilder.model import schema as S
    from envbuilder.errors import UserError
    from envbuilder.limits import MAX_INPUT_BYTES, read_limited
    from envbuilder.model.readers import read

    # what is read of lock.json here (the one bounded reader; lock --check reads the rest)
    shape = {
        "plan_sha256": S.SHA256,
        "files": {"requirements.lock": S.SHA256, "*": Any},
        "torch_swapped?": (S.Text(300), None),
        "*": Any,
    }
    want = plan_sha256(env)
    candidates = [only] if only is not None else lock_candidates(env.name)
    for label, lock_dir in candidates:
        if "/" in env.name or env.name in ("", ".", ".."):
            return None  # a profile name never leaves lockfiles/
        try:
            meta = read(lock_dir / "lock.json", "lock.json", shape=shape, missing_ok=True)
            if meta is None or meta["plan_sha256"] != want:  # (no lock, or not this plan's)
                continue
            # (decoded only to be parsed; never waited on: a FIFO is NotRegularFile, a ValueError)
            data = read_limited(lock_dir / "requirements.lock", MAX_INPUT_BYTES)
        except (OSError, ValueError, UserError):
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != meta["files"]["requirements.lock"]:
            continue
        swapped = meta.get("torch_swapped")
        if only is not None and isinstance(meta.get("input_sha256"), str):  # (no path: it moves)
            label = f"{label} (input_sha256 {meta['input_sha256'][:16]})"
        try:
            layers_ = constraint_layers(env, data, bool(swapped), digest)
        except UnicodeDecodeError:
            continue
        return Constraints(from_=label, torch_swapped=swapped, plan_sha256=want, layers=frozen(layers_))
    return None


def with_constraints(env: ResolvedEnv, only: tuple[str, Path] | None = None) -> ResolvedEnv:
    """`env` with `constraints`: the pins of the lock whose plan it is (`only`: of that lock
    alone), or None (it floats)."""
    return env._replace(constraints=find_constraints(env, only))


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
            f"{k}{','.join(v) if isinstance(v, list) else v}"
            for k, v in overrides.to_dict().items()
            if v is not True
        )
    )
    return (
        f"`envbuild lock {sh(profile)}{flags} -o {lock_dir}` makes one, and `envbuild render "
        f"{sh(profile)}{flags} --locked {lock_dir}" + (f" -o {sh(str(out))}" if out else "") + "` uses it"
    )


def finish_command(env: ResolvedEnv) -> str:
    """What finishes an environment installed without Docker, run in the rendered folder with its
    Python: the recorded patches of verl for this GPU (where there are any), then the precision
    audit, as the Dockerfile's build does after the installs (README, requirements.txt,
    environment.yml, pixi's patch task and preflight's fix all name this one command)."""
    return ("python apply_patches.py && " if env.patches else "") + "python audit_precision.py"
