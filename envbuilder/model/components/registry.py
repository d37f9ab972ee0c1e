"""The optional compiled components as one registry: each is a `Component` (the name --with and
--without take, its matrix section, its refusals, its record in the resolved environment, its
build command and the modules the training path imports of it), and REGISTRY holds them in
the order the run imports them. The resolver (which components a profile gets, their rules and
records, the training path), --with/--without's choices and completion, the grid, the SBOM and
the offline checks loop over REGISTRY; none of them names a component.

The blocks here bind each component's own module (apex.py, flash_attn.py: the facts, the rules,
the build flags) to the resolver's Selection. TransformerEngine is no such component: it comes
with --engine megatron, not with --with, and its record is the Megatron layer's
(transformer_engine.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from envbuilder.errors import UserError
from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal
from envbuilder.model.components import apex as APEX
from envbuilder.model.components import flash_attn as FA
from envbuilder.model.names import suggest
from envbuilder.model.versions import in_range, version_key
from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.model.matrix import Entry, Matrix
    from envbuilder.model.resolved import ResolvedEnv
    from envbuilder.model.selection import Selection

T = TypeVar("T")


class Source(Record):
    """What the SBOM says of a file of sources.lock a component is built from: the package it is
    (`kind`: the purl's type, github or pypi, and its namespace), and whether it is compiled for
    the card (the SBOM's compiled-for)."""

    name: str
    version: str
    kind: str
    namespace: str = ""
    compiled: bool = False


class Component(Protocol):
    """One optional compiled component, as the resolver and every list of components use it."""

    @property
    def name(self) -> str:
        """Its name as users type it in --with/--without and profiles list it: "flash-attn"."""
        ...

    @property
    def section(self) -> str:
        """Its section of the matrix (extensions.yaml): "flash_attn"."""
        ...

    def entry(self, m: Matrix) -> Entry:
        """Its matrix section as read (the grid's links take its `source:`)."""
        ...

    def modules(self, m: Matrix) -> list[str]:
        """The modules the training path imports of it (its section's training_path)."""
        ...

    def newest(self, m: Matrix, torch_v: str) -> str | None:
        """The release --with adds for torch `torch_v`; None where the matrix has no section for it."""
        ...

    def problems(self, m: Matrix, s: Selection) -> list[Refusal]:
        """The rules the selection breaks with it (or, left out, without it)."""
        ...

    def notes(self, m: Matrix, s: Selection) -> list[str]:
        """What the resolver says of it (the files' notes)."""
        ...

    def record(self, m: Matrix, s: Selection) -> Record | None:
        """Its part of the resolved environment; None where the selection leaves it out."""
        ...

    def part(self, env: ResolvedEnv) -> Record | None:
        """Its part of a resolved environment, None where it has none."""
        ...

    def source(self, env: ResolvedEnv, key: str, ref: str | None) -> Source | None:
        """What sources.lock's file `key` (at `ref`, where the lock pins one) is of it; None where
        it is none of its files or `env` has no such component."""
        ...

    def build_argv(self, env: ResolvedEnv, pip: list[str]) -> list[str]:
        """THE command that compiles it into the environment `pip` installs into, as argv."""
        ...

    def build_shell(self, env: ResolvedEnv, pip: str) -> str:
        """The same command as one shell line, as the rendered files print it."""
        ...


def required(section: T | None) -> T:
    """A section of the matrix that the selection's components need: a matrix without it has no
    release of them to name."""
    assert section is not None, "a component without its matrix section"
    return section


class FlashAttn:
    """flash-attn (flash_attn.py): a wheel from an index or the release, or a source build."""

    name = FA.NAME
    section = "flash_attn"

    def entry(self, m: Matrix) -> Entry:
        return m.flash_attn

    def modules(self, m: Matrix) -> list[str]:
        return required(m.typed.flash_attn)["training_path"]["modules"]

    def newest(self, m: Matrix, torch_v: str) -> str | None:
        fa = m.typed.flash_attn
        if not fa:
            return None
        fitting = [v for v, r in fa["versions"].items() if in_range(torch_v, r["torch"])]
        if not fitting:
            raise UserError(
                f"No flash-attn release in the matrix supports torch {torch_v}; "
                "pick another --torch or leave flash-attn out."
            )
        return max(fitting, key=version_key)

    def problems(self, m: Matrix, s: Selection) -> list[Refusal]:
        out: list[Refusal] = []
        if s.fa and s.fa_choice:
            fa = required(m.typed.flash_attn)
            out += FA.problems(fa, s.fa, torch_v=s.torch_v, cc=s.cc, gpu=s.card["name"], choice=s.fa_choice)
        if s.attention == "flash_attention_2" and s.fa is None:
            out.append(
                Refusal(
                    "attention",
                    "attention flash_attention_2 without the flash-attn package",
                    "the profile asks for it but flash-attn is not installed",
                    "use --with flash-attn, or set attention to sdpa",
                    hard=True,
                )
            )
        return out

    def notes(self, m: Matrix, s: Selection) -> list[str]:
        rec = self.record(m, s)
        if rec is None or s.fa_choice is None:
            return []
        return FA.notes(rec, s.fa_choice.reason, required(m.typed.flash_attn))

    def record(self, m: Matrix, s: Selection) -> R.FlashAttn | None:
        if not (s.fa and s.fa_choice):
            return None
        return FA.record(required(m.typed.flash_attn), s.fa, s.fa_choice)

    def part(self, env: ResolvedEnv) -> R.FlashAttn | None:
        return env.flash_attn

    def source(self, env: ResolvedEnv, key: str, ref: str | None) -> Source | None:
        fa = self.part(env)
        if not key.startswith(self.name) or fa is None:
            return None
        return Source(self.name, fa.version, "pypi")  # (its release wheels, one per ABI)

    def build_argv(self, env: ResolvedEnv, pip: list[str]) -> list[str]:
        return ["env", *FA.source_build_argv(env, pip)]

    def build_shell(self, env: ResolvedEnv, pip: str) -> str:
        return FA.source_build_command(env, pip)


class Apex:
    """NVIDIA's apex (apex.py): its source archive compiled for the card's arch. (Its build is
    always verbose: its compile log is the only sign of what nvcc built.)"""

    name = APEX.NAME
    section = "apex"

    def entry(self, m: Matrix) -> Entry:
        return m.apex

    def modules(self, m: Matrix) -> list[str]:
        return required(m.typed.apex)["training_path"]["modules"]

    def newest(self, m: Matrix, torch_v: str) -> str | None:
        apex = m.typed.apex
        return max(apex["versions"], key=version_key) if apex else None

    def problems(self, m: Matrix, s: Selection) -> list[Refusal]:
        if not s.apex_v:
            return []
        nvcc = APEX.nvcc_problem(required(m.typed.apex), s.build["cuda"], s.cuda_v)
        return [nvcc] if nvcc else []

    def notes(self, m: Matrix, s: Selection) -> list[str]:
        return []

    def record(self, m: Matrix, s: Selection) -> R.Apex | None:
        if not (s.apex_v and s.apex_rec):
            return None
        return APEX.record(required(m.typed.apex), s.apex_v, s.apex_rec, s.cc)

    def part(self, env: ResolvedEnv) -> R.Apex | None:
        return env.apex

    def source(self, env: ResolvedEnv, key: str, ref: str | None) -> Source | None:
        apex = self.part(env)
        if key != self.name or apex is None:
            return None
        return Source(
            self.name, str(ref or apex.ref), "github", "NVIDIA", compiled=True
        )  # (its source archive)

    def build_argv(self, env: ResolvedEnv, pip: list[str]) -> list[str]:
        apex = self.part(env)
        assert apex is not None  # (a build of apex exists only where the profile has it)
        return APEX.build_argv(apex, [*pip, "-v"], f"apex @ {apex.url}")

    def build_shell(self, env: ResolvedEnv, pip: str) -> str:
        apex = self.part(env)
        assert apex is not None
        return APEX.shell_command(apex, f"{pip} -v")


FLASH_ATTN, APEX_ = FlashAttn(), Apex()
# the optional compiled components, in the order the training path imports them
REGISTRY: tuple[Component, ...] = (FLASH_ATTN, APEX_)


def names() -> list[str]:
    """The components' names as the messages, --with/--without's help and completion list them."""
    return sorted(c.name for c in REGISTRY)


def listed() -> str:
    """The names as a sentence's list: "apex, flash-attn"."""
    return ", ".join(names())


def by_name(name: str) -> Component | None:
    """The registered component of that name, None where none is."""
    return next((c for c in REGISTRY if c.name == name), None)


def select(
    m: Matrix,
    components: dict[str, str],
    optional: dict[str, str],
    with_: tuple[str, ...],
    without: tuple[str, ...],
    torch_v: str,
) -> dict[str, str]:
    """A profile's compiled components (`components`; `optional`: those it names a release of
    for --with) with --with / --without applied."""
    out = dict(components)
    for name in with_:
        if name in out:
            continue
        c = by_name(name)
        newest = c.newest(m, torch_v) if c and name not in optional else None
        if name in optional:
            out[name] = optional[name]
        elif newest is not None:
            out[name] = newest
        else:
            raise UserError(f"Unknown component {name!r} for --with; components are {listed()}.")
    for name in without:
        if by_name(name) is None:
            raise UserError(
                f"Unknown component {name!r} for --without; {suggest(name, names())}components are {listed()}."
            )
        out.pop(name, None)
    return out


def problems(m: Matrix, s: Selection) -> list[Refusal]:
    """Every component's refusals, in the registry's order, then the one they share: an nvcc
    that cannot build for the card."""
    out = [x for c in REGISTRY for x in c.problems(m, s)]
    if any(c.name in s.components for c in REGISTRY) and s.cc not in s.cuda["nvcc_archs"]:
        out.append(
            Refusal(
                "nvcc-arch",
                f"nvcc {s.cuda_v} cannot build for sm_{s.cc.replace('.', '')}",
                f"it targets {', '.join(s.cuda['nvcc_archs'])}",
                f"use another --cuda, or --without {','.join(names())}",
                hard=True,
            )
        )
    return out


def notes(m: Matrix, s: Selection) -> list[str]:
    """What the resolver says of the components (the files' notes)."""
    return [n for c in REGISTRY for n in c.notes(m, s)]


def training_modules(m: Matrix, components: tuple[str, ...]) -> list[list[str]]:
    """The training-path modules of each of `components`, in the registry's order."""
    return [c.modules(m) for c in REGISTRY if c.name in components]


def built(env: ResolvedEnv) -> list[Component]:
    """The components `env` has, by name (as the messages list them)."""
    return sorted((c for c in REGISTRY if c.part(env) is not None), key=lambda c: c.name)
