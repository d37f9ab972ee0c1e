"""`envbuild render`: the files of one profile, every profile, or a replayed envbuild.json."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.cli.options import implied_profile, load_matrix, override_options, plain_name, resolve_all
from envbuilder.render.prepare import locked_context, prepare
from envbuilder.errors import UserError


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Render every profile, each into OUT/<profile>/.")
@click.option(
    "--from",
    "from_",
    type=click.Path(path_type=Path),
    help="Replay an envbuild.json (from a render or an image's /etc/envbuild.json).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
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
    type=click.Path(path_type=Path),
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
def render(profile, all_, from_, out, locked_dir, wheelhouse, mirror, force, overrides, matrix_dirs):
    """Write Dockerfile, environment.yml, requirements.txt, run script, preflight.py, envbuild.json."""
    from envbuilder.render import files as R
    from envbuilder.model.resolve import ResolvedEnv

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
        from envbuilder.limits import read_text_bounded

        text = read_text_bounded(Path(from_), "--from file")
        # every value's kind and the whole shape checked, all problems named at once, before
        # any template reads it
        env = ResolvedEnv.from_json(text, str(from_))
        target = Path(out or "out") / plain_name(env.name, "the profile named in " + str(from_))
        locked = locked_context(env, locked_dir, wheelhouse)
        files = R.render_files(env, locked)  # (a failure past the check is a bug: a traceback)
        R.write_dir(target, files, (locked or {}).get("links"), force=force)
        click.echo(f"rendered {env.name} from {from_} -> {target}/")
        return
    m = load_matrix(matrix_dirs)
    if not (profile or all_):
        profile = implied_profile(m, "render", click.get_current_context().obj)
    names = list(m.profiles) if all_ else [profile]
    base = out or Path("out")
    if base.exists() and not base.is_dir():
        raise UserError(
            f"{base} exists and is not a folder; -o names the folder that gets one "
            "folder per profile. Pass a folder."
        )
    # resolve every profile first: an --all that cannot resolve one of them writes nothing
    envs = resolve_all(m, names, overrides, "nothing was written")
    choice = None
    if mirror:
        from envbuilder.model import mirrors as M

        choice = M.choice(mirror, M.get_set(m, mirror))
    for env in envs:
        target = base / plain_name(env.name, "a profile")
        # its lock against the upstream spec (what the lock recorded), then the mirror
        p = prepare(env, lock_dir=locked_dir, wheelhouse=wheelhouse, mirror=choice)
        if not p.locked and not p.env.constraints:
            from envbuilder.render.plan import lock_hint

            how = lock_hint(env.name, overrides, out)
            click.echo(
                f"  note: {env.name} is not pinned beyond its top-level pins (no lock matches it): {how}.",
                err=True,
            )
        env = p.env
        R.render(env, target, p.locked, force=force)
        click.echo(f"rendered {env.name} -> {target}/")
        for w in env.warnings:
            click.echo(f"  WARNING: {w}")
