"""`envbuild bake`: the profile matrix as one docker-bake.hcl and its build contexts."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli.callbacks import AbsPath
from envbuilder.cli import complete
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profiles", nargs=-1, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Every profile.")
@click.option(
    "-o",
    "--out",
    type=AbsPath(path_type=Path),
    required=True,
    help="Folder for docker-bake.hcl and a build context per profile.",
)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="Point images and indexes at this mirror set's "
    "first endpoints (no probing: bake stays offline, like render --mirror).",
)
@click.option(
    "--registry",
    default="local",
    show_default=True,
    help="Where the targets push and "
    "keep their registry cache: `local`, a configured name, or HOST[:PORT] (the file's "
    "REGISTRY variable; override it when baking).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write into a folder envbuild did not write (it still deletes nothing it did not write).",
)
@override_options
def bake(
    profiles: tuple[str, ...],
    all_: bool,
    out: Path,
    mirror: str | None,
    registry: str,
    force: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Write a docker-bake.hcl with a target per profile (and each one's build context), so
    `docker buildx bake` builds the matrix on any BuildKit builder."""
    from envbuilder.engines.bake import BAKE_FILE, bake as write_bake
    from envbuilder.errors import UserError

    if bool(all_) == bool(profiles):
        raise UserError("Name the profiles to bake, or --all (not both). `envbuild list` shows them.")
    m = load_matrix(matrix_dirs)
    names = list(m.profiles) if all_ else list(dict.fromkeys(profiles))
    baked = write_bake(m, names, overrides, out, mirror=mirror, registry=registry, force=force, say=say)
    click.echo(
        f"wrote {baked.bake_file}: {len(baked.targets)} target(s) ({', '.join(baked.targets)}); "
        f"build them with: docker buildx bake -f {baked.bake_file}"
    )
    if baked.stripped:
        click.echo(
            f"note: {', '.join(baked.stripped)} carry user:password@, which "
            f"{BAKE_FILE} and the contexts name without; pass them as the endpoints "
            "secret (--set '*.secrets=id=endpoints,src=FILE', FILE of `export VAR='URL'` "
            "lines).",
            err=True,
        )
