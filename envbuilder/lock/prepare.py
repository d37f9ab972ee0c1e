"""The one order a resolved environment goes through before it is rendered, built, baked or
verified: its lock is found against the upstream environment (what `envbuild lock` recorded),
then the lock's pins become its constraints, then a mirror set's endpoints replace the
upstream ones. Every command that renders files calls `prepare`, so none can do it in
another order. It sits in lock/, above render/: it reads the lock (lockfile.for_render) that
render/ knows only as the LockedContext it is handed.

    prepared = prepare(env, lock_dir="lockfiles", mirror=choice)
    render(prepared.env, out, prepared.locked)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.errors import UserError
from envbuilder.record import Record
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.paths import LOCK_ROOT
from envbuilder.render.locked import LockedContext
from envbuilder.render.outdir import folder_name

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice
    from envbuilder.render.outdir import Checked

__all__ = ["LockedContext", "Prepared", "find_lock", "lock_used", "locked_context", "folder_name", "prepare"]


class Prepared(Record):
    """What rendering needs: the environment with its constraints (and mirror), and the
    `locked` context of the templates (lock.lockfile.for_render: base images by digest, the
    hashed requirement files, a wheelhouse's files), None when not --locked."""

    env: ResolvedEnv
    locked: LockedContext | None
    # the lock folder whose pins it took (named, or the one whose plan fits), None when none
    lock_path: Path | None = None

    @property
    def links(self) -> Mapping[str, Checked] | None:
        """The files a wheelhouse render places into the folder (outdir.Checked)."""
        return self.locked.links if self.locked else None


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


def prepare(
    env: ResolvedEnv,
    *,
    lock_dir: str | Path | None = None,
    wheelhouse: str | Path | None = None,
    mirror: MirrorChoice | None = None,
) -> Prepared:
    """`env` ready to render: the lock (against the upstream environment), its constraints,
    then the mirror set (`mirrors.MirrorChoice`), in that order."""
    from envbuilder.lock.constraints import with_constraints

    locked = locked_context(env, lock_dir, wheelhouse, mirror)
    # (requirements.txt and environment.yml, also when locked: then from that lock alone)
    where = named_lock(env, lock_dir, wheelhouse)
    what = "the wheelhouse's lock" if wheelhouse is not None else "the lock --locked names"
    env = with_constraints(env, (what, where) if where is not None else None)
    if where is None and env.constraints is not None:
        from envbuilder.lock.constraints import lock_candidates

        where = next((d for label, d in lock_candidates(env.name) if label == env.constraints.from_), None)
    if mirror is not None:
        from envbuilder.model.mirrors import apply_to_env

        env = apply_to_env(env, mirror)
    return Prepared(env, locked, where if env.constraints is not None or locked else None)
