"""`envbuild bake`: the profile matrix as one docker-bake.hcl and its build contexts."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli import complete
from envbuilder.cli.options import load_matrix, override_options, say


@click.command()
@click.argument("profiles", nargs=-1, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Every profile.")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
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
def bake(profiles, all_, out, mirror, registry, force, overrides, matrix_dirs):
    """Write a docker-bake.hcl with a target per profile (and each one's build context), so
    `docker buildx bake` builds the matrix on any BuildKit builder."""
    from envbuilder.engines import bake as K
    from envbuilder.model import mirrors as M
    from envbuilder.render.prepare import plain_name
    from envbuilder.config import local_registry, registry_for
    from envbuilder.errors import UserError
    from envbuilder.render.outdir import write_dir
    from envbuilder.model.profiles import resolve_all
    from envbuilder.render.files import EXECUTABLE, render_files
    from envbuilder.render.prepare import prepare

    m = load_matrix(matrix_dirs)
    names = list(m.profiles) if all_ else list(dict.fromkeys(profiles))
    if bool(all_) == bool(profiles):
        raise UserError("Name the profiles to bake, or --all (not both). `envbuild list` shows them.")
    host = registry_for(registry, local_registry(m))
    choice = M.choice(mirror, M.get_set(m, mirror)) if mirror else None
    # every profile resolves (each failure printed, as render --all does), or nothing is written
    envs = resolve_all(m, names, overrides, "nothing was baked", say=say)
    contexts, targets, shared = {}, [], None
    stripped: set[str] = set()
    for env in envs:
        # no user:password@ in the bake file or the contexts: bake has no secret to carry it
        env, _, secret = M.split_credentials(env)
        stripped |= set(secret)
        tag = K.default_tag(env)  # (the upstream spec: the same tag `envbuild build` gives it)
        env = prepare(env, mirror=choice).env
        contexts[plain_name(env.name, "a profile")] = render_files(env)
        targets.append(K.bake_target(env, tag))
        shared = shared or K.variables(env, host)
    files = {f"{name}/{path}": text for name, ctx in contexts.items() for path, text in ctx.items()}
    files[K.BAKE_FILE] = K.bake_file(targets, shared)
    write_dir(out, files, executable={f"{n}/{e}" for n in contexts for e in EXECUTABLE}, force=force)
    click.echo(
        f"wrote {out / K.BAKE_FILE}: {len(targets)} target(s) ({', '.join(contexts)}); "
        f"build them with: docker buildx bake -f {out / K.BAKE_FILE}"
    )
    if stripped:
        click.echo(
            f"note: {', '.join(sorted(stripped))} carry user:password@, which "
            f"{K.BAKE_FILE} and the contexts name without; pass them as the endpoints "
            "secret (--set '*.secrets=id=endpoints,src=FILE', FILE of `export VAR='URL'` "
            "lines).",
            err=True,
        )
