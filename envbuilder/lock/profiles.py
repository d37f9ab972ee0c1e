"""`envbuild lock` as a library: several profiles locked (or checked, `--check`) one after
another, each into DIR/<profile>/, a failure of one not stopping the others with --all.
Callable without click: the command line parses, calls `lock_profiles`, and prints what the
callbacks hand it.

    parts = lock_parts(("pip",), "rattler", check=False)
    lock_profiles(m, ["p40"], Overrides(), None, LockFlags(), parts, say=print, echo=print)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from envbuilder.errors import ActionError, EnvbuildError, UserError
from envbuilder.paths import LOCK_ROOT
from envbuilder.record import Record
from envbuilder.secret import SecretUrl

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides


class LockFlags(Record):
    """Where the lock is solved from (each replaces the profile's own; the mirror set's
    endpoints come first, the URLs given override them), with which solver, and whether the pip
    part takes PyPI's torch (`--torch-from-pypi`)."""

    index_url: SecretUrl | None = None
    torch_index_url: SecretUrl | None = None
    channels: tuple[str, ...] = ()
    registry_mirror: str | None = None
    github_url: str | None = None
    mirror_set: str | None = None
    solver: str = "rattler"
    swap_torch: bool = False


def lock_dir_for(name: str, out: Path | None, check: bool = False) -> Path:
    """-o DIR holds one folder per profile, DIR/<profile>/, with one profile as with --all
    (default lockfiles/). `--check -o DIR` also takes DIR as one lock (it holds lock.json), and
    `--check` alone checks the lock every command finds (prepare.find_lock: ./lockfiles, else the
    shipped one); locking replaces DIR's own lock only when it is this profile's."""
    from envbuilder.lock.lockfile import lock_dir_in

    if check:  # (the lock render, sbom and wheelhouse find: ./lockfiles, else the shipped one)
        from envbuilder.lock.locate import find_lock

        return find_lock(name, out)
    return lock_dir_in(LOCK_ROOT if out is None else Path(out), name, writing=True)


def lock_parts(only: Iterable[str], solver: str, check: bool) -> tuple[str, ...]:
    """The parts --only names (comma-separated or repeated; all when none), refused when one is
    unknown, or when conda-lock is to solve the conda part and no conda is on PATH."""
    from envbuilder.lock import lockfile as L
    from envbuilder.model.profiles import split_names

    parts = split_names(only) or tuple(L.PARTS)
    unknown = [p for p in parts if p not in L.PARTS]
    if unknown:
        raise UserError(f"Unknown part {', '.join(unknown)} for --only; parts are {', '.join(L.PARTS)}.")
    if solver == "conda-lock" and "conda" in parts and not check:
        from envbuilder.lock.conda import conda_exe

        if conda_exe() is None:
            raise UserError(
                "--solver conda-lock runs conda-lock, which needs conda, mamba or "
                "micromamba on PATH to solve the conda part; none is. Install one, or "
                "use --solver rattler (the default: py-rattler needs no conda)."
            )
    return parts


def check_line(name: str, target: Path) -> str:
    """`lock --check`'s line for a lock that holds: where, and a torch swap if it has one."""
    from envbuilder.lock import lockfile as L

    meta = L.read_meta(target)
    swapped = meta.torch_swapped if meta is not None else None
    note = f"; torch {swapped}: constraints only, not --locked" if swapped else ""
    return f"{name}: ok ({target}/){note}"


def lock_profiles(
    m: Matrix,
    names: list[str],
    overrides: Overrides | None,
    out: Path | None,
    flags: LockFlags,
    parts: tuple[str, ...],
    *,
    check: bool = False,
    keep_going: bool = False,
    say: Callable[[str], None] = print,
    echo: Callable[[str], None] = print,
) -> None:
    """Lock (or with `check`, check) each named profile into lock_dir_for(name, out): progress
    and failures through `say`, the result of each through `echo`. With `keep_going` (--all)
    one profile's failure is said and the next one runs; at the end one error names those that
    failed: exit 1 (ActionError) for stale locks or failed actions, 2 when one was bad input."""
    from envbuilder.lock import lockfile as L
    from envbuilder.model.resolve import resolve

    mirror = None
    if flags.mirror_set:
        from envbuilder.model import mirrors as M

        mirror = M.choice(flags.mirror_set, M.get_set(m, flags.mirror_set))
    bad: list[str] = []
    codes: list[int] = []
    for name in names:
        target = lock_dir_for(name, out, check)
        try:
            env = resolve(m, name, overrides)
            if check:
                if (target / L.META).is_file():
                    from envbuilder.lock.locate import lock_used

                    say(f"{name}: the lock {lock_used(target)}")
                found = L.problems(env, target, parts)
                for p in found:
                    echo(f"{name}: {p}")
                if found:
                    bad.append(name)
                else:
                    echo(check_line(name, target))
                continue
            from envbuilder.lock import lock_profile, sources_for
            from envbuilder.lock.pip import target_glibc

            src = sources_for(
                env,
                flags.index_url,
                flags.torch_index_url,
                flags.channels,
                flags.registry_mirror,
                mirror,
                flags.github_url,
            )
            glibc = target_glibc(m, env)
            lock_profile(
                env,
                glibc,
                src,
                target,
                parts=parts,
                solver=flags.solver,
                swap_torch=flags.swap_torch,
                say=say,
            )
            echo(f"locked {name} -> {target}/")
        except EnvbuildError as e:
            if not keep_going:
                raise
            bad.append(name)
            codes.append(e.exit_code)
            say(f"envbuild: {name}: {e}")
    if check and bad:
        raise ActionError(f"{len(bad)} of {len(names)} lock(s) need `envbuild lock`: {', '.join(bad)}.")
    if bad:
        cls = UserError if 2 in codes else ActionError
        raise cls(f"{len(bad)} of {len(names)} profiles were not locked: {', '.join(bad)}.")
