"""`envbuild lock`: lockfiles for a profile (or all), and `--check` for CI."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.cli.options import load_matrix, override_options, split_names
from envbuilder.errors import ActionError, EnvbuildError, UserError
from envbuilder.oci.http import no_empty_url

from envbuilder.paths import LOCK_ROOT


def lock_dir_for(name: str, out: Path | None, check: bool = False) -> Path:
    """-o DIR holds one folder per profile, DIR/<profile>/, with one profile as with --all
    (default lockfiles/). `--check -o DIR` also takes DIR as one lock (it holds lock.json);
    locking replaces DIR's own lock only when it is this profile's."""
    from envbuilder.lock.lockfile import lock_dir_in

    return lock_dir_in(LOCK_ROOT if out is None else Path(out), name, writing=not check)


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Lock every profile into lockfiles/<profile>/.")
@click.option(
    "--check",
    is_flag=True,
    help="Make nothing; exit 1 when a lock is missing, incomplete or stale against the "
    "current matrices and templates (no network needed).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    help="Folder of locks: the lock goes into DIR/<profile>/ (default lockfiles/).",
)
@click.option(
    "--index-url",
    callback=no_empty_url,
    metavar="URL",
    help="PyPI index to use instead of the profile's (a mirror, a local pypiserver).",
)
@click.option(
    "--torch-index-url",
    callback=no_empty_url,
    metavar="URL",
    help="PyTorch index to use instead of the profile's (for +cuXXX builds).",
)
@click.option(
    "--channel",
    "channels",
    multiple=True,
    callback=no_empty_url,
    metavar="URL",
    help="Conda channel instead of the profile's (repeatable, in priority order).",
)
@click.option(
    "--registry-mirror",
    callback=no_empty_url,
    metavar="HOST[/PREFIX]",
    help="Read image digests from this registry (images under PREFIX/) instead of each image's own registry.",
)
@click.option(
    "--github-url",
    callback=no_empty_url,
    metavar="URL",
    help="A prefix that replaces https://github.com when fetching files from GitHub "
    "(apex's source archive, flash-attn's release wheels) to pin their sha256.",
)
@click.option(
    "--mirror",
    "mirror_set",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="Take the indexes, channels and registries from this mirror set "
    "(`envbuild mirrors list`); the flags above override it.",
)
@click.option(
    "--solver",
    type=click.Choice(["rattler", "conda-lock"]),
    default="rattler",
    show_default=True,
    help="Conda solver; conda-lock needs conda/mamba/micromamba on PATH.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="PARTS",
    help="Lock (or --check) only these parts: conda, pip, sources, images "
    "(comma-separated). A partial lock is reported as incomplete by a full --check.",
)
@click.option(
    "--torch-from-pypi",
    is_flag=True,
    help="Solve the pip part with PyPI's build of the profile's torch version when the "
    "PyTorch index is out of reach: the lock then pins everything else (a plain "
    "render's constraints) but not the +cuXXX torch, so --locked refuses it.",
)
@override_options
def lock(
    profile,
    all_,
    check,
    out,
    index_url,
    torch_index_url,
    channels,
    registry_mirror,
    github_url,
    mirror_set,
    solver,
    only,
    torch_from_pypi,
    overrides,
    matrix_dirs,
):
    """Pin PROFILE's conda part, pip part and base images for its target machine.

    The override options lock a variant of the profile (give it its own -o); `render --locked`
    and `wheelhouse` then take the same overrides."""
    from envbuilder.lock import lockfile as L
    from envbuilder.model.resolve import resolve

    if bool(profile) == bool(all_):
        raise UserError("Name one profile, or --all (exactly one). `envbuild list` shows them.")
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
    m = load_matrix(tuple(matrix_dirs))
    names = list(m.profiles) if all_ else [profile]
    mirror = None
    if mirror_set:
        from envbuilder.model import mirrors as M

        mirror = M.choice(mirror_set, M.get_set(m, mirror_set))
    bad: list[str] = []
    codes: list[int] = []
    for name in names:
        target = lock_dir_for(name, out, check)
        try:
            env = resolve(m, name, overrides)
            if check:
                found = L.problems(env, target, parts)
                for p in found:
                    click.echo(f"{name}: {p}")
                if found:
                    bad.append(name)
                else:
                    meta = L.read_meta(target) or {}
                    note = (
                        f"; torch {meta['torch_swapped']}: constraints only, not --locked"
                        if meta.get("torch_swapped")
                        else ""
                    )
                    click.echo(f"{name}: ok ({target}/){note}")
                continue
            from envbuilder.lock import lock_profile, sources_for, target_glibc

            src = sources_for(env, index_url, torch_index_url, channels, registry_mirror, mirror, github_url)
            lock_profile(
                env,
                target_glibc(m, env),
                src,
                target,
                parts=parts,
                solver=solver,
                swap_torch=torch_from_pypi,
                say=lambda s: click.echo(s, err=True),
            )
            click.echo(f"locked {name} -> {target}/")
        except EnvbuildError as e:
            if not all_:
                raise
            bad.append(name)
            codes.append(e.exit_code)
            click.echo(f"envbuild: {name}: {e}", err=True)
    if check and bad:
        raise ActionError(f"{len(bad)} of {len(names)} lock(s) need `envbuild lock`: {', '.join(bad)}.")
    if bad:
        cls = UserError if 2 in codes else ActionError
        raise cls(f"{len(bad)} of {len(names)} profiles were not locked: {', '.join(bad)}.")
