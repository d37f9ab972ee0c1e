"""`envbuild lock`: lockfiles for a profile (or all), and `--check` for CI."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.secret import SecretUrl
from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, no_empty_url, secret_url
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.errors import UserError
from envbuilder.model.resolved import Overrides


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
    type=AbsPath(path_type=Path),
    help="Folder of locks: the lock goes into DIR/<profile>/ (default lockfiles/).",
)
@click.option(
    "--index-url",
    callback=secret_url,
    metavar="URL",
    help="PyPI index to use instead of the profile's (a mirror, a local pypiserver).",
)
@click.option(
    "--torch-index-url",
    callback=secret_url,
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
    profile: str | None,
    all_: bool,
    check: bool,
    out: Path | None,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    channels: tuple[str, ...],
    registry_mirror: str | None,
    github_url: str | None,
    mirror_set: str | None,
    solver: str,
    only: tuple[str, ...],
    torch_from_pypi: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Pin PROFILE's conda part, pip part and base images for its target machine.

    The override options lock a variant of the profile (give it its own -o); `render --locked`
    and `wheelhouse` then take the same overrides."""
    from envbuilder.lock.profiles import LockFlags, lock_parts, lock_profiles

    if bool(profile) == bool(all_):
        raise UserError("Name one profile, or --all (exactly one). `envbuild list` shows them.")
    parts = lock_parts(only, solver, check)
    if not check:  # what each part runs, named before anything is resolved or fetched
        from envbuilder.errors import need_extra

        mods = (("rattler", "conda_lock") if "conda" in parts else ()) + (
            ("requests",) if "images" in parts else ()
        )
        if mods:
            need_extra("lock", "lock", mods)
        if "pip" in parts:
            from envbuilder.tools.uv import uv_bin

            uv_bin("lock")
    m = load_matrix(tuple(matrix_dirs))
    names = [profile] if profile else list(m.profiles)  # (one of the two: checked above)
    flags = LockFlags(
        index_url, torch_index_url, channels, registry_mirror, github_url, mirror_set, solver, torch_from_pypi
    )
    lock_profiles(
        m, names, overrides, out, flags, parts, check=check, keep_going=all_, say=say, echo=click.echo
    )
