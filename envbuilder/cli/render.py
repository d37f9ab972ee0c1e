"""`envbuild render`: the files of one profile, every profile, or a replayed envbuild.json."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli.callbacks import AbsPath
from envbuilder.cli import complete
from envbuilder.cli.options import Dirs, implied_profile, load_matrix, override_options, passed_probes, say
from envbuilder.errors import UserError
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Render every profile, each into OUT/<profile>/.")
@click.option(
    "--from",
    "from_",
    type=AbsPath(path_type=Path),
    help="Replay an envbuild.json (from a render or an image's /etc/envbuild.json).",
)
@click.option(
    "-o",
    "--out",
    type=AbsPath(path_type=Path),
    help="Output folder: the files go into OUT/<profile>/, with one profile as with --all (default out/).",
)
@click.option(
    "--locked",
    "locked_dir",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[DIR]",
    help="FROM image@sha256 and pip layers with --require-hashes, from "
    "the lock in DIR/<profile>/ (default lockfiles/), or DIR when it is one lock.",
)
@click.option(
    "--wheelhouse",
    type=AbsPath(path_type=Path),
    metavar="DIR",
    help="Install from this wheelhouse (envbuild wheelhouse) with no index at all; "
    "implies --locked with the wheelhouse's copy of the lock.",
)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="Point images, indexes, channels and endpoints at "
    "this mirror set's first endpoints (no probing: render stays offline).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Overwrite files in the output directory that "
    "envbuild did not write or that were edited since (it still deletes nothing it did "
    "not write).",
)
@override_options
def render(
    profile: str | None,
    all_: bool,
    from_: Path | None,
    out: Path | None,
    locked_dir: str | None,
    wheelhouse: Path | None,
    mirror: str | None,
    force: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Write Dockerfile, environment.yml, requirements.txt, run script, preflight.py, envbuild.json."""
    from envbuilder.context.render import render_profiles, render_replay

    if sum(bool(x) for x in (profile, all_, from_)) > 1:
        raise UserError(
            "Name one profile, or --all, or --from envbuild.json (exactly one). "
            "`envbuild list` shows the profiles."
        )
    if locked_dir is not None and wheelhouse is not None:
        raise UserError(
            "--locked and --wheelhouse both say where the lock comes from: a "
            "wheelhouse carries its own copy of the lock. Pass one of them."
        )
    if from_:
        env, target = render_replay(from_, out, locked_dir, wheelhouse, force, say=say)
        click.echo(f"rendered {env.name} from {from_} -> {target}/")
        return
    m = load_matrix(matrix_dirs)
    if not (profile or all_):
        profile = implied_profile(m, "render", passed_probes())
    names = [profile] if profile else list(m.profiles)  # (one of the two: checked above)
    render_profiles(
        m,
        names,
        overrides,
        out,
        locked_dir=locked_dir,
        wheelhouse=wheelhouse,
        mirror=mirror,
        force=force,
        say=say,
        echo=click.echo,
    )
