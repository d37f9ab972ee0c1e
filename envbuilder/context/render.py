"""`envbuild render` as a library: profiles resolved (all of them first: one that does not
resolve writes nothing), each prepared (context.prepare: its lock, then a mirror set) and written
into OUT/<profile>/; or a saved envbuild.json replayed. Callable without click:

    render_profiles(m, ["p40"], Overrides(), Path("out"), say=print, echo=print)
    render_replay(Path("out/p40/envbuild.json"), Path("again"))

It sits in context/, beside `prepare`, above lock/ and render/: every render is prepared against
its lock first, and render/ knows no lock.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from envbuilder.errors import UserError
from envbuilder.context.prepare import prepare, replayed
from envbuilder.lock.locate import lock_used
from envbuilder.render.outdir import folder_name
from envbuilder.model.resolve import picked_for_driver

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv


def render_replay(
    from_: Path,
    out: Path | None = None,
    locked_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> tuple[ResolvedEnv, Path]:
    """The files of the environment an envbuild.json (`from_`) holds, written into
    OUT/<its profile>/; returns (the environment, the folder)."""
    from envbuilder.limits import read_text_bounded
    from envbuilder.model.runplan import saved_from_json
    from envbuilder.render import files as R

    text = read_text_bounded(Path(from_), "--from file")
    # every value's kind and the whole shape checked, all problems named at once, before any
    # template reads it; the pins it records go to the context, beside the environment
    env, pins = saved_from_json(text, str(from_))
    target = Path(out or "out") / folder_name(env.asked, "the profile named in " + str(from_))
    ctx = replayed(env, pins, locked_dir, wheelhouse)
    if ctx.lock_path is not None:
        say(f"  {env.name}: pins from the lock {lock_used(ctx.lock_path, env)}")
    R.render(ctx, target, force=force)  # (a failure past the check is a bug: a traceback)
    return env, target


def render_profiles(
    m: Matrix,
    names: list[str],
    overrides: Overrides,
    out: Path | None = None,
    *,
    locked_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
    mirror: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
    echo: Callable[[str], None] = print,
) -> list[Path]:
    """Each named profile rendered into OUT/<profile>/ (default out/): `locked_dir` ("-" for
    lockfiles/) or `wheelhouse` pins it, `mirror` (a mirror set's name) points it at that set's
    first endpoints. What was written and its warnings go to `echo`, notes to `say`."""
    from envbuilder.model.components import flash_attn as FA
    from envbuilder.model.profiles import resolve_all
    from envbuilder.render import files as R

    base = out or Path("out")
    if base.exists() and not base.is_dir():
        raise UserError(
            f"{base} exists and is not a folder; -o names the folder that gets one "
            "folder per profile. Pass a folder."
        )
    # resolve every profile first: an --all that cannot resolve one of them writes nothing
    envs = resolve_all(m, names, overrides, "nothing was written", say=say)
    choice = None
    if mirror:
        from envbuilder.model import mirrors as M

        choice = M.choice(mirror, M.get_set(m, mirror))
    written = []
    for env in envs:
        target = base / folder_name(env.asked, "a profile")
        picked = picked_for_driver(env, overrides)
        if picked:
            say(f"  note: {env.name}: {picked} (as --verl {env.overrides.verl})")
        # its lock against the upstream spec (what the lock recorded), then the mirror
        ctx = prepare(env, lock_dir=locked_dir, wheelhouse=wheelhouse, mirror=choice)
        if not ctx.locked and not ctx.constraints:
            from envbuilder.render.plan import lock_hint

            how = lock_hint(env.name, env.overrides, out)
            say(f"  note: {env.name} is not pinned beyond its top-level pins (no lock matches it): {how}.")
        if ctx.lock_path is not None:
            say(f"  {env.name}: pins from the lock {lock_used(ctx.lock_path, ctx.env)}")
        env = ctx.env
        R.render(ctx, target, force=force)
        written.append(target)
        echo(f"rendered {env.asked} -> {target}/")
        for note in FA.announcements(env):
            say(f"  note: {note}")
        for w in env.warnings:
            echo(f"  WARNING: {w}")
    return written
