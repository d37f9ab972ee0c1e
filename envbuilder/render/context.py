"""What every renderer and action takes: a `BuildContext`, made once by
`envbuilder.context.prepare` (above lock/ and render/) from what the resolver gave. It holds the
resolved environment as the resolver gave it, the pins the lock gives (`constraints`), the mirror
set chosen, the lock's `locked` context and folder, and the environment the files print (`env`:
the resolved one with the mirror set's endpoints; the pins stay in `constraints`, which the
install plan and envbuild.json take). Its own module in render/,
below the lock package: only the types of the layers below render are in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.record import Record
from envbuilder.model.resolved import Constraints, ResolvedEnv
from envbuilder.render.locked import LockedContext

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice
    from envbuilder.render.outdir import Checked
    from envbuilder.render.plan import InstallPlan

__all__ = ["BuildContext"]


class BuildContext(Record):
    """resolved: the resolver's output, untouched. env: what the files print and the install
    runs (resolved, with `mirror`'s endpoints). constraints: the pins of the
    lock whose plan this is (or the one --locked / --wheelhouse names), None when no lock fits.
    mirror: the mirror set chosen, None for the upstream endpoints. locked: the `locked` context
    of the templates (lock.lockfile.for_render: base images by digest, the hashed requirement
    files, a wheelhouse's files), None when not --locked. lock_path: the lock folder whose pins
    it took, None when none."""

    resolved: ResolvedEnv
    env: ResolvedEnv
    constraints: Constraints | None
    mirror: MirrorChoice | None
    locked: LockedContext | None
    lock_path: Path | None = None

    @classmethod
    def of(cls, env: ResolvedEnv, locked: LockedContext | None = None) -> BuildContext:
        """`env` rendered as it is: no lock looked for (no pins), no mirror set."""
        return cls(env, env, None, None, locked, None)

    @property
    def plan(self) -> InstallPlan:
        """The install plan within the lock's pins (render/plan.py)."""
        from envbuilder.render.plan import install_plan

        return install_plan(self.env, self.constraints)

    @property
    def links(self) -> Mapping[str, Checked] | None:
        """The files a wheelhouse render places into the folder (outdir.Checked)."""
        return self.locked.links if self.locked else None
