"""Where a profile's lock is and what a render takes of it: `find_lock` (the one way every
command finds a lock), `named_lock` (the lock a `--locked DIR` or `--wheelhouse DIR` names),
`locked_context` (the `locked` context of the templates, lock.lockfile.for_render) and
`lock_used` (what a command says of the lock it used). The one order before anything is
rendered, built or installed is `envbuilder.context.prepare`, above this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.errors import UserError
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.paths import LOCK_ROOT
from envbuilder.render.locked import LockedContext
from envbuilder.render.outdir import folder_name

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice

__all__ = ["find_lock", "lock_used", "locked_context", "named_lock"]


def locked_context(
    env: ResolvedEnv,
    lock_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
    mirror: MirrorChoice | None = None,
) -> LockedContext | None:
    """The `locked` context of `env` (the upstream environment, as the lock recorded it) from
    the lock in `lock_dir` (ROOT/<profile>/, or the lock itself: lock.lockfile.lock_dir_in;
    "-" for lockfiles/) or from a wheelhouse's copy; None when neither is asked for."""
    where = named_lock(env, lock_dir, wheelhouse)
    if where is None:
        return None  # (and the lock module stays unimported on the plain render path)
    from envbuilder.lock.lockfile import for_render

    if wheelhouse is not None:
        if not (Path(wheelhouse) / "manifest.json").is_file():
            raise UserError(
                f"{wheelhouse} is not an envbuild wheelhouse (no manifest.json). Make "
                f"one with `envbuild wheelhouse {env.name} -o {wheelhouse}`."
            )
        return for_render(env, where, Path(wheelhouse), mirror)
    return for_render(env, where, mirror=mirror)


def find_lock(profile: str, lock_dir: str | Path | None = None) -> Path:
    """The one way every command finds a profile's lock: in `lock_dir` (ROOT/<profile>/, or ROOT
    when it is the lock: lock.lockfile.lock_dir_in); without one ("-" or None), ./lockfiles/<profile>,
    else the one shipped with envbuild (plan.lock_candidates), else ./lockfiles/<profile> (which
    the caller's error names). `lock --check`, `sbom`, `render --locked` and `wheelhouse` all ask
    here, so outside a checkout they all find the shipped locks."""
    from envbuilder.lock.lockfile import META, lock_dir_in
    from envbuilder.lock.constraints import lock_candidates

    if lock_dir is not None and lock_dir != "-":
        return lock_dir_in(Path(lock_dir), profile)
    candidates = lock_candidates(profile)
    return next((d for _, d in candidates if (d / META).is_file()), LOCK_ROOT / profile)


def lock_used(lock_path: Path, env: ResolvedEnv | None = None) -> str:
    """What a command says of the lock it used: its folder, verl and Python ("lockfiles/4090
    (verl 0.4.1, Python 3.10)"), read through the one reader of lock.json; '?' where a lock does
    not say. `env`: the environment the lock was checked to fit (its plan, verl pin and Python
    included), whose verl and Python it names without reading the lock again (render --all)."""
    import re

    from envbuilder.lock.lockfile import read_meta
    from envbuilder.text import printable

    if env is not None:
        return printable(f"{lock_path} (verl {env.verl.version}, Python {env.python})")
    verl, python = "?", "?"
    try:
        meta = read_meta(lock_path)
        python = str((meta.python if meta is not None else None) or "?")
        from envbuilder.limits import read_text_bounded

        pins = read_text_bounded(lock_path / "requirements.lock", "requirements.lock")
        found = re.search(r"^verl==([^\s;\\]+)", pins, re.M)
        verl = found.group(1) if found else "?"
    except (OSError, ValueError, UserError):
        pass
    return printable(f"{lock_path} (verl {verl}, Python {python})")


def named_lock(
    env: ResolvedEnv, lock_dir: str | Path | None = None, wheelhouse: str | Path | None = None
) -> Path | None:
    """The lock folder a `--locked [DIR]` or `--wheelhouse DIR` render names for `env`; None
    for a plain render (which takes the constraints of whichever lock fits its plan)."""
    if wheelhouse is None and lock_dir is None:
        return None
    name = folder_name(env.name, "a profile")
    if wheelhouse is not None:
        return Path(wheelhouse) / "locks" / name
    return find_lock(name, lock_dir)
