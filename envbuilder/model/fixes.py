"""Every fix a refusal offers works: each `--flag value` alternative of a violation's fix is
applied to the user's own overrides and resolved again, and kept only when the profile then
resolves (a fix that trades one refusal for another is the trap of "suggested fixes that lead
to new errors"). Where none of a violation's alternatives survive, the matrix is searched for
the smallest change that resolves the profile (one of the user's flags dropped, a stack, one
flag, then a torch with a CUDA it is built for), and that is offered instead. Advice that names
a flag without a value ("a --torch that supports Python 3.10") is replaced; prose that names no
flag (an overlay to write, another image) stays.

Only the error path pays for this: a few resolutions per refusal, a search of about a hundred
(some hundred milliseconds) where a fix has to be found."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from envbuilder.errors import UserError
from envbuilder.model import flags as F
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.resolved import Overrides, ResolvedEnv
from envbuilder.model.versions import is_driver_version, version_key

if TYPE_CHECKING:
    from typing_extensions import Self

    from envbuilder.model.matrix import Matrix

# a change of the user's flags: flag (as typed, "gpus-per-node") -> its value, None to drop it
Change = dict[str, "str | None"]


class Fixable(Protocol):
    """A broken rule with its fix (rules.Violation)."""

    @property
    def rule(self) -> str: ...

    @property
    def fix(self) -> str: ...

    def _replace(self, **changes: object) -> Self: ...


V = TypeVar("V", bound=Fixable)

# a flag a fix may offer (model/flags.py), with the value a user would type after it (values
# may be comma lists: apex,flash-attn)
FIX_FLAG = re.compile(
    r"--(" + "|".join(sorted((f.flag[2:] for f in F.FLAGS if f.fix), key=len, reverse=True)) + r")\b"
    r"(?:[ =]([^\s,;()]+(?:,[^\s,;()]+)*))?"
)
ROLLOUTS = F.BY_FIELD["rollout"].choices
_FLAG = {f.flag[2:]: f for f in F.FLAGS}  # "gpus-per-node" -> its declaration


def _valid(m: Matrix, flag: str, value: str | None) -> bool:
    if value is None:
        return False
    value = value.rstrip(".")
    decl = _FLAG[flag]
    if decl.kind == F.INT and decl.bounds:  # (a whole number within the declaration's bounds)
        lo, hi = decl.bounds
        return value.isdigit() and lo <= int(value) <= hi
    return {
        "cuda": lambda: value in m.cuda,
        "torch": lambda: value in m.torch,
        "verl": lambda: value in m.verl,
        "vllm": lambda: value in m.vllm,
        "rollout": lambda: value in ROLLOUTS,
        "python": lambda: re.fullmatch(r"3\.\d+", value) is not None,
        "with": lambda: all(COMPONENTS.by_name(c) for c in value.split(",")),
        "without": lambda: all(COMPONENTS.by_name(c) for c in value.split(",")),
        "driver": lambda: is_driver_version(value),
        "ecc": lambda: value in ("on", "off"),
        "model": lambda: value in m.models,
        "algo": lambda: value in m.algorithms,
        "interconnect": lambda: value in (m.sections.get("interconnects") or {}),
        "offload": lambda: all(w in F.OFFLOAD for w in value.split(",")),
    }[flag]()


DROP = re.compile(r"\bdrop --([a-z]+)")


def concrete(m: Matrix, alternative: str) -> Change | None:
    """The overrides an alternative names ({"torch": "2.9.0", "cuda": "12.6"}; "drop --vllm":
    {"vllm": None}); None when it names a flag without a value the matrix knows ("a --torch
    that supports Python 3.10") or names none."""
    drops: list[str] = DROP.findall(alternative)
    dropped: Change = dict.fromkeys(drops)
    found: list[tuple[str, str]] = FIX_FLAG.findall(DROP.sub("", alternative))
    if not (found or dropped) or not all(_valid(m, f, v) for f, v in found):
        return None
    return {**dropped, **{f: v.rstrip(".") for f, v in found}}


def applied(ov: Overrides, flags: Mapping[str, str | None]) -> Overrides:
    """The user's overrides with these flags set (a flag replaces the user's value of it; None
    drops it)."""
    changes: dict[str, object] = {}
    for flag, value in flags.items():
        decl = _FLAG[flag]
        if decl.kind == F.NAMES:  # (tuples: "drop --with" is the empty one, never None)
            changes[decl.field] = tuple(value.split(",")) if value else ()
        elif value is not None and decl.kind == F.INT:
            changes[decl.field] = int(value)
        else:
            changes[decl.field] = value
    return ov._replace(**changes)


def alternatives(fix: str) -> list[str]:
    """A fix's alternatives, as its text offers them: "use --torch 2.9.0 or --vllm 0.8.5"."""
    return [
        a.strip() for a in re.split(r"\s+or\s+(?=(?:use\s+|add\s+|pass\s+|drop\s+)?--)", fix) if a.strip()
    ]


def render_flags(flags: Mapping[str, str | None]) -> str:
    """A change as a fix offers it ("--torch 2.6.0 drop --vllm"), each flag as declared."""
    return " ".join(
        F.spell(_FLAG[f].field, v) if v is not None else f"drop {_FLAG[f].flag}" for f, v in flags.items()
    )


class _Attempts:
    """Resolutions of the profile under overrides, each run once: None when it resolves, the
    set of broken rules when it is refused, {"!"} when the input itself is refused. `run`
    returns the resolved environment or the broken rules."""

    def __init__(self, run: Callable[[Overrides], object]):
        self.run = run
        self.seen: dict[Overrides, set[str] | None] = {}
        self.envs: dict[Overrides, ResolvedEnv] = {}

    def __call__(self, ov: Overrides) -> set[str] | None:
        if ov not in self.seen:
            try:
                got = self.run(ov)
            except UserError:
                got = {"!"}
            if isinstance(got, set):
                self.seen[ov] = got
            else:
                self.seen[ov] = None
                if isinstance(got, ResolvedEnv):
                    self.envs[ov] = got
        return self.seen[ov]


# what a flag's value is in a resolved environment (to name the value a dropped flag falls
# back to: `--cuda 13.0` refused on a P40 -> "use --cuda 11.8")
VALUE_OF: dict[str, Callable[[ResolvedEnv], str | None]] = {
    "cuda": lambda e: e.cuda.version,
    "torch": lambda e: e.torch.version,
    "verl": lambda e: e.verl.version,
    "rollout": lambda e: e.rollout,
    "vllm": lambda e: e.vllm.version if e.vllm else None,
    "python": lambda e: e.python,
}


def _given(ov: Overrides, flags: Iterable[str]) -> dict[str, str]:
    """The values the user gave of these flags (of VALUE_OF's), by flag."""
    values = {"cuda": ov.cuda, "torch": ov.torch, "verl": ov.verl, "rollout": ov.rollout}
    values.update(vllm=ov.vllm, python=ov.python)
    return {f: v for f in flags if (v := values[f]) is not None}


def completions(m: Matrix, ov: Overrides) -> Iterator[dict[str, str | None]]:
    """Changes that keep every stack flag the user gave and fill in the others: a vLLM release
    (newest first), the torch it pins and a CUDA that torch is built for (`--verl 0.5.0` ->
    `--vllm 0.8.5 --torch 2.6.0 --cuda 12.4`). Nothing when the user gave no stack flag."""
    given = _given(ov, ("verl", "vllm", "torch", "cuda"))
    if not given or ov.rollout not in (None, "vllm"):
        return

    def newest(xs: Iterable[str]) -> list[str]:
        return sorted(xs, key=version_key, reverse=True)

    for vllm in newest(m.vllm):
        torch: str = m.vllm[vllm]["torch"]
        builds: Mapping[str, Mapping[str, str]] = (m.torch.get(torch) or {}).get("builds") or {}
        for cuda in newest({b["cuda"] for b in builds.values() if b["cuda"] in m.cuda}):
            full = {"vllm": vllm, "torch": torch, "cuda": cuda}
            if any(given.get(f, v) != v for f, v in full.items()):
                continue
            yield {f: v for f, v in full.items() if f not in given}


def _candidates(m: Matrix, profile: str, ov: Overrides) -> Iterator[dict[str, str | None]]:
    """Changes to try, smallest and most coherent first: one of the user's own flags dropped
    (None: the profile's value), a whole stack (stacks.yaml), one flag (rollout, cuda, torch,
    verl, vllm; newest first), then a torch with a CUDA it is built for."""

    def newest(xs: Iterable[str]) -> list[str]:
        return sorted(xs, key=version_key, reverse=True)

    mine = list(_given(ov, VALUE_OF))
    yield from completions(m, ov)
    for flag in mine:
        yield {flag: None}
    if len(mine) > 1:
        yield dict.fromkeys(mine)  # the profile as shipped
    stacks: Mapping[str, object] = m.sections.get("stacks") or {}
    for v in newest(stacks):
        yield {"verl": v}
    for r in ROLLOUTS:
        yield {"rollout": r}
    for flag, table in (("cuda", m.cuda), ("torch", m.torch), ("verl", m.verl), ("vllm", m.vllm)):
        for v in newest(table):
            yield {flag: v}
    for t in newest(m.torch):
        builds: Mapping[str, Mapping[str, str]] = m.torch[t]["builds"]
        for c in newest({b["cuda"] for b in builds.values()}):
            if c in m.cuda:
                yield {"torch": t, "cuda": c}


# refusals no candidate change can lift (the machine's driver: --driver, detect): a fix is judged
# by what it leaves besides these
FIXED_BY_MACHINE = frozenset({"driver"})


def _resolves(after: set[str] | None, before: set[str] | frozenset[str]) -> bool:
    return after is None or (after <= FIXED_BY_MACHINE and after <= before)


def whole_fix(
    m: Matrix,
    profile: str,
    ov: Overrides,
    attempt: _Attempts,
    before: set[str] | frozenset[str] = frozenset(),
) -> Change | None:
    """The first candidate change under which the profile resolves, each flag with the value
    it then has; else the first under which it resolves but for the machine's own refusals (a
    stack the driver runs beats an upgrade); None when none does."""
    for whole in (True, False):
        for flags in _candidates(m, profile, ov):
            if any(_value(ov, _FLAG[f].field) == v for f, v in flags.items()):
                continue  # the user already has it
            changed = applied(ov, flags)
            after = attempt(changed)
            if after is None if whole else _resolves(after, before):
                env = attempt.envs.get(changed)
                if env is None:
                    if any(v is None for v in flags.values()):
                        continue  # (a dropped flag's value is read from the resolved environment)
                    return dict(flags)
                return {f: v if v is not None else VALUE_OF[f](env) for f, v in flags.items()}
    return None


def _value(ov: Overrides, field: str) -> object:
    """The user's value of one of Overrides' fields."""
    value: object = getattr(ov, field)
    return value


def checked(
    m: Matrix, profile: str, ov: Overrides, violations: list[V], run: Callable[[Overrides], object]
) -> list[V]:
    """`violations` with every fix checked (module docstring): each keeps the alternatives under
    which the profile resolves; one with none gets the change that resolves it, when there is
    one. Prose without flags (an overlay to write, another image) stays as it is."""
    c = _Checker(m, profile, ov, violations, run)
    return [c.check(v) for v in violations]


class _Checker:
    """The fixes of one refusal's violations, each tried (`attempt`): `before`, the rules the
    profile broke; `mine`, the user's own stack flags; `keeping`, a change that keeps them all
    (when one resolves): a fix that changes one of them gives way to it."""

    def __init__(
        self,
        m: Matrix,
        profile: str,
        ov: Overrides,
        violations: Sequence[Fixable],
        run: Callable[[Overrides], object],
    ):
        self.m, self.profile, self.ov = m, profile, ov
        self.attempt = _Attempts(run)
        self.before = {v.rule for v in violations}
        self.whole: list[Change | None] = []  # computed once, when first needed
        self.mine = _given(ov, VALUE_OF)
        self.keeping = next((c for c in completions(m, ov) if self.attempt(applied(ov, c)) is None), None)

    def drops_mine(self, a: str) -> bool:
        flags = concrete(self.m, a) or {}
        return any(f in self.mine and self.mine[f] != value for f, value in flags.items())

    def check(self, v: V) -> V:
        m, ov = self.m, self.ov
        alts = [a.rstrip(" ,;") for a in alternatives(v.fix)]
        results = {a: self.attempt(applied(ov, flags)) for a in alts if (flags := concrete(m, a)) is not None}
        prose = [a for a in alts if concrete(m, a) is None and not FIX_FLAG.search(a)]
        if v.rule in FIXED_BY_MACHINE:
            fix = self.machine_fix(results, prose)
            return v._replace(fix=fix) if fix and fix != v.fix else v
        fix = self.rule_fix(results, prose)
        return v._replace(fix=fix) if fix != v.fix else v

    def machine_fix(self, results: dict[str, set[str] | None], prose: list[str]) -> str:
        """The machine's: its upgrade stands, each stack offered resolves."""
        stacks = [a for a, after in results.items() if after is None]
        if self.keeping and any(self.drops_mine(a) for a in stacks):
            stacks = [f"use {render_flags(self.keeping)}"] + [a for a in stacks if not self.drops_mine(a)]
        return " or ".join(prose + stacks)

    def rule_fix(self, results: dict[str, set[str] | None], prose: list[str]) -> str:
        """Alternatives that resolve whole first, then those that leave only the driver after
        them; none: the smallest change that resolves the profile (whole_fix), if any."""
        kept = [a for a, after in results.items() if after is None]
        kept += [a for a, after in results.items() if after is not None and _resolves(after, self.before)]
        if self.keeping and any(self.drops_mine(a) for a in kept):
            keeps = ", ".join(f"{f} {v}" for f, v in self.mine.items())
            kept = [f"use {render_flags(self.keeping)} (keeps your {keeps})"] + [
                a for a in kept if not self.drops_mine(a)
            ]
        if not kept:
            kept = self.whole_change()
        if kept and not re.match(r"(use|add|pass|drop)\b", kept[0]):
            kept[0] = f"use {kept[0]}"
        return " or ".join(kept + prose) or (
            "no one change of --verl, --rollout, --cuda, --torch, --vllm, nor a torch with a CUDA "
            f"it is built for, makes {self.profile} resolve: `envbuild list` shows the profiles"
        )

    def whole_change(self) -> list[str]:
        if not self.whole:
            self.whole.append(whole_fix(self.m, self.profile, self.ov, self.attempt, self.before))
        change = self.whole[0]
        if not change:
            return []
        but = ", but for the driver)" if self.attempt(applied(self.ov, change)) else ")"
        return [f"{render_flags(change)} (with it {self.profile} resolves{but}"]


def smallest_change(
    m: Matrix, profile: str, ov: Overrides, run: Callable[[Overrides], object]
) -> Change | None:
    """The smallest change of `ov` under which `profile` resolves (whole_fix's search), each
    flag with the value it then has; None when none does. `run` as for `checked`. For callers
    that start from what is installed (diagnose) rather than from a refusal."""
    return whole_fix(m, profile, ov, _Attempts(run))
