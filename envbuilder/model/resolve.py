"""Profile + overrides -> ResolvedEnv, or the list of rules the combination breaks.

Pure: reads only the Matrix. The path is four steps, each in its own module:
`stages.ask` (the profile a name means, as --verl stacks it), `stages.select` (the selection:
stages that each return a new frozen record, composed into a `Selection`, model/selection.py),
`rules.judge` (every rule over the selection: the violations, and the notes the rules add), and
`assemble.assemble` (the `ResolvedEnv` of a selection every rule accepted), with its run plan
(`assemble.with_run_plan`). Here: that path (`_run`), and the entry points around it: `resolve`
(with the fixes of a refusal checked), `stack_for_driver`, `held_back`. A Violation says what,
why and a concrete fix; `hard` ones stay errors under --allow-unsupported (the combination
cannot work at all), the others become warnings that are written into the rendered files.
"""

from __future__ import annotations

from envbuilder.errors import UserError
from envbuilder.model.assemble import (  # noqa: F401  (re-exported: what other modules import from here)
    TORCH_DTYPE,
    assemble,
    training_path,
    uv_pin,
    with_run_plan,
)
from envbuilder.model.components.cuda import stacks_for_driver
from envbuilder.model.components.verl import INSTALLABLE_ROLLOUTS  # noqa: F401  (the rollouts a profile may name)
from envbuilder.model.matrix import Matrix
from envbuilder.model.matrix_schema import AUDIT_CHECKS  # noqa: F401  (re-exported)
from envbuilder.model.resolved import SCHEMA_VERSION, Overrides, ResolvedEnv  # noqa: F401  (re-exported)
from envbuilder.model.rules import RULES, Violation, judge  # noqa: F401  (re-exported)
from envbuilder.model.sizing import PLANS as _PLANS  # noqa: F401  (the tests clear it: a fresh process)
from envbuilder.model.sizing import card_size  # noqa: F401  (re-exported)
from envbuilder.model.stages import ask, legacy_trainer, rounded_batch, select  # noqa: F401  (re-exported)
from envbuilder.model.versions import version_key

# what other modules import from here (the path's names live in its modules)
__all__ = [
    "AUDIT_CHECKS",
    "INSTALLABLE_ROLLOUTS",
    "PTX_LIMIT",
    "RULES",
    "SCHEMA_VERSION",
    "STACK_FLAGS",
    "TORCH_DTYPE",
    "Overrides",
    "ResolveError",
    "ResolvedEnv",
    "Violation",
    "card_size",
    "held_back",
    "legacy_trainer",
    "picked_for_driver",
    "resolve",
    "rounded_batch",
    "stack_for_driver",
    "training_path",
    "uv_pin",
    "with_run_plan",
]


class ResolveError(UserError):
    def __init__(self, profile: str, violations: list[Violation]):
        self.profile = profile
        self.violations = violations
        lines = [f"Profile {profile!r} cannot be resolved as asked:"]
        lines += [f"  - [{v.rule}] {v.text()}" for v in violations]
        if not any(v.hard for v in violations):
            lines.append("  (--allow-unsupported renders anyway and writes these warnings into the files.)")
        super().__init__("\n".join(lines))


def _run(m: Matrix, profile: str, ov: Overrides) -> ResolvedEnv:
    """One resolution: ask, select, judge, assemble (a ResolveError where a rule refuses it)."""
    a = ask(m, profile, ov)
    s = select(a)
    found = judge(a, s)
    hard = [v for v in found.v if v.hard]
    if hard or (found.v and not ov.allow_unsupported):
        raise ResolveError(a.name, found.v)
    return with_run_plan(assemble(a, s, found.notes, [v.text() for v in found.v]))


# the flags that choose a stack: given any, the user chose it and the driver rule only refuses
STACK_FLAGS = ("cuda", "torch", "python", "verl", "rollout", "vllm")
PTX_LIMIT = "no PTX JIT: only kernels built for the card run, none compiled from PTX at load"


def stack_for_driver(m: Matrix, profile: str, ov: Overrides, refused: ResolveError) -> ResolvedEnv | None:
    """Pick the newest stack the machine runs, not the newest there is: where the profile's own
    stack is refused for --driver alone and no stack flag was given, the newest stack whose CUDA
    the driver runs (natively or under minor-version compatibility) and whose kernels cover the
    card, if one resolves; its notes say what it is and what a driver upgrade would add."""
    if ov.driver is None or any(getattr(ov, f) is not None for f in STACK_FLAGS):
        return None
    if "driver" not in {v.rule for v in refused.violations}:
        return None
    for v, how in stacks_for_driver(m, ov.driver):
        try:
            env = _run(m, profile, ov._replace(verl=v))
        except ResolveError:
            continue
        mode = env.driver.mode
        note = (
            f"driver {ov.driver} runs CUDA {env.driver.for_cuda} "
            + ("natively" if mode == "native" else f"under minor-version compatibility ({PTX_LIMIT})")
            + f": verl {v}'s stack (torch {env.torch.version}+{env.torch.variant}"
            + (f", vLLM {env.vllm.version}" if env.vllm else "")
            + "), the newest this driver runs"
        )
        try:
            newest = _run(m, profile, ov._replace(driver=None))
            note += (
                f"; with driver >= {newest.driver.min_driver}: verl {newest.verl.version}"
                + (f", vLLM {newest.vllm.version}" if newest.vllm else "")
                + f" (CUDA {newest.driver.for_cuda})"
            )
        except ResolveError:
            pass
        return env._replace(notes=(note, *env.notes))
    return None


def picked_for_driver(env: ResolvedEnv, asked: Overrides | None) -> str | None:
    """The note of a stack stack_for_driver picked (env took a --verl the user did not give)."""
    if env.overrides.driver and env.overrides.verl and not (asked and asked.verl) and env.notes:
        return env.notes[0]
    return None


def resolve(
    m: Matrix,
    profile: str,
    overrides: Overrides | None = None,
    check_fixes: bool = True,
    pick_stack: bool = True,
) -> ResolvedEnv:
    """The environment of `profile` under `overrides`; a refusal's fixes are all checked to work
    (fixes.checked), so none leads to a new refusal. `check_fixes=False` skips that walk (the
    verdict is the same; only the fixes' text is as each rule wrote it): for callers that ask
    many combinations and show no fixes (the grid). With --driver and no stack flag, a profile
    whose stack the driver cannot run takes the newest stack it can (stack_for_driver), unless
    `pick_stack` is False (the grid: each column is one stack, as it is)."""
    ov = overrides or Overrides()
    try:
        return _run(m, profile, ov)
    except ResolveError as e:
        picked = stack_for_driver(m, profile, ov, e) if pick_stack else None
        if picked is not None:
            return picked
        if not check_fixes:
            raise
        from envbuilder.model import fixes

        def broken(o: Overrides) -> object:
            try:
                return _run(m, profile, o)
            except ResolveError as again:
                return {v.rule for v in again.violations}

        raise ResolveError(profile, fixes.checked(m, profile, ov, e.violations, broken)) from None


def held_back(m: Matrix, profile: str, overrides: Overrides | None = None) -> list[str]:
    """Why the profile does not run the newest stack (stacks.yaml): what the resolver says of
    `--verl NEWEST` on it, the hard refusals first. Empty when it already runs that verl."""
    stacks = m.typed.stacks
    ov = overrides or Overrides()
    if not stacks or profile not in m.profiles:
        return []
    newest = max(stacks, key=version_key)
    current = ov.verl or m.profiles[profile]["verl"]
    if version_key(current) >= version_key(newest):
        return []
    st = stacks[newest]
    what = (
        f"verl {newest} (torch {st['torch']}, CUDA {st['cuda']}"
        + (f", vLLM {st['vllm']}" if st.get("vllm") else "")
        + ")"
    )
    try:
        resolve(m, profile, Overrides(verl=newest, driver=ov.driver, ecc=ov.ecc))
    except ResolveError as e:
        found = sorted(e.violations, key=lambda v: not v.hard)
        return [f"{what} is not for this GPU: {v.what} ({v.why})" for v in found[:1]]
    if ov.verl:
        return [
            f"{what} also resolves here: envbuild render {profile} (the profile's default) or --verl {newest}"
        ]
    return [
        f"{what} also resolves here: envbuild render {profile} --verl {newest}; the "
        f"profile stays on verl {current}, the stack its GPU tier and field reports cover"
    ]
