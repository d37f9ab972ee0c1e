"""The one order a resolved environment goes through before it is rendered, built, baked,
installed or verified: its lock is found against the upstream environment (what `envbuild
lock` recorded), then the lock's pins are taken (beside the environment, in the context: the
environment itself never carries them), then a mirror set's endpoints replace the upstream ones. Every command that renders or installs calls `prepare` and hands
the `BuildContext` it returns (render/context.py) to the renderers and actions, so none can do
it in another order. It sits above lock/ and render/: it reads the lock (lock.locate,
lock.constraints) that render/ knows only as the context it is handed.

    ctx = prepare(env, lock_dir="lockfiles", mirror=choice)
    render(ctx, out)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.lock.locate import locked_context, named_lock
from envbuilder.render.context import BuildContext

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice
    from envbuilder.model.resolved import Constraints, ResolvedEnv

__all__ = ["BuildContext", "prepare", "replayed"]


def prepare(
    env: ResolvedEnv,
    *,
    lock_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
    mirror: MirrorChoice | None = None,
    pins_from: tuple[str, Path] | None = None,
) -> BuildContext:
    """`env` (the resolver's output) ready to render, build or install: the lock (against the
    upstream environment), its constraints, then the mirror set (`mirrors.MirrorChoice`), in
    that order. `lock_dir` / `wheelhouse`: the lock a `--locked` / `--wheelhouse` render names
    (its `locked` context too); `pins_from`: (what to call it, where it is) of a lock whose
    pins alone are taken, with no `locked` context (`install --locked`, a wheelhouse's lock)."""
    from envbuilder.lock.constraints import find_constraints

    resolved = env
    locked = locked_context(env, lock_dir, wheelhouse, mirror)
    # (requirements.txt and environment.yml, also when locked: then from that lock alone)
    where = named_lock(env, lock_dir, wheelhouse)
    what = "the wheelhouse's lock" if wheelhouse is not None else "the lock --locked names"
    if pins_from is not None:
        what, where = pins_from
    constraints = find_constraints(env, (what, where) if where is not None else None)
    if where is None and constraints is not None:
        from envbuilder.lock.constraints import lock_candidates

        where = next((d for label, d in lock_candidates(env.name) if label == constraints.from_), None)
    # (the pins stay beside the environment, in the context: render/plan.py and envbuild.json
    # take them from there)
    if mirror is not None:
        from envbuilder.model.mirrors import apply_to_env

        env = apply_to_env(env, mirror)
    lock_path = where if constraints is not None or locked else None
    return BuildContext(resolved, env, constraints, mirror, locked, lock_path)


def replayed(
    env: ResolvedEnv,
    constraints: Constraints | None,
    lock_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
) -> BuildContext:
    """The context of what a saved envbuild.json holds (`render --from`,
    runplan.saved_from_json): the environment with its endpoints and the pins the file
    records beside it (`constraints`), as the file says them (no lock looked for), and the
    `locked` context of the lock a `--locked DIR` or `--wheelhouse DIR` names."""
    locked = locked_context(env, lock_dir, wheelhouse)
    where = named_lock(env, lock_dir, wheelhouse)
    return BuildContext(env, env, constraints, None, locked, where if locked is not None else None)
