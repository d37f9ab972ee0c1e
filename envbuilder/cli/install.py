"""`envbuild install`: the profile's environment without Docker, patched, audited and smoke-tested
(loads only when used)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from envbuilder.secret import SecretUrl, secret
from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, index_url
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.errors import ActionError, UserError
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--prefix",
    type=AbsPath(path_type=Path),
    required=True,
    help="Where the environment goes: a new or empty directory (from a wheelhouse also an "
    "environment of the lock's Python, installed into).",
)
@click.option(
    "--from-wheelhouse",
    "wheelhouse",
    type=AbsPath(path_type=Path),
    metavar="WH",
    help="Install offline from this wheelhouse (`envbuild wheelhouse PROFILE -o WH`): no index, "
    "every file hash-checked.",
)
@click.option(
    "--interpreter",
    metavar="PATH",
    help="The Python interpreter to make the environment from (of the profile's --python version).",
)
@click.option("--index-url", metavar="URL", callback=index_url, help="Python package index (online route).")
@click.option(
    "--torch-index-url",
    metavar="URL",
    callback=index_url,
    help="PyTorch index for +cuXXX builds (online route).",
)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="Install through this mirror set's PyPI and PyTorch endpoints (online route).",
)
@click.option(
    "--locked",
    type=AbsPath(path_type=Path),
    metavar="DIR",
    help="Pin every step to this lock (DIR/<profile>/ or the lock itself), as `render --locked` "
    "does (online route; default: the lock whose plan fits, as a plain render).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace files in PREFIX/envbuild/ that envbuild did not write or that were edited since.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@override_options
def install(
    profile: str,
    prefix: Path,
    wheelhouse: Path | None,
    interpreter: str | None,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    mirror: str | None,
    locked: Path | None,
    force: bool,
    as_json: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Install PROFILE without Docker into a venv (or a conda environment, from a wheelhouse
    with micromamba/mamba/conda on PATH), the way `build` makes the image: the install layers
    with the lock's pins, verl's recorded patches for the GPU, the precision audit, then
    preflight's smoke test. The rendered folder goes to PREFIX/envbuild/.

    Exit 0 when every step passes, 1 when one fails, 2 for bad input."""
    from envbuilder.machine.install import install as run_install
    from envbuilder.machine.install import summary
    from envbuilder.context.prepare import prepare
    from envbuilder.model.resolve import resolve

    if wheelhouse is None:
        from envbuilder.tools.uv import uv_bin

        uv_bin("install")  # (the online route installs with uv: said before anything is made)
    if wheelhouse is not None and (index_url or torch_index_url or mirror or locked):
        raise UserError(
            "--from-wheelhouse installs offline from the wheelhouse's own lock: drop "
            "--index-url, --torch-index-url, --mirror and --locked."
        )
    m = load_matrix(matrix_dirs)
    env = resolve(m, profile, overrides)
    pins_from = None
    if locked is not None:  # every step within that lock's pins alone, as render --locked
        from envbuilder.lock.lockfile import lock_dir_in, pip_part

        pins_from = lock_dir_in(locked, env.name)
        pip_part(env, pins_from)  # (a missing, damaged or stale lock refused before anything is made)
    choice = None
    if mirror:
        from envbuilder.model import mirrors as M

        choice = M.choice(mirror, M.get_set(m, mirror))
    # the lock's pins (--locked's alone), then the mirror set's endpoints, as build has them
    ctx = prepare(env, pins_from=("the lock --locked names", pins_from) if pins_from else None, mirror=choice)
    if ctx.mirror is not None:
        # the endpoints as a build's RUN steps get them (credentials too, which the files never
        # name): the PyTorch index's {variant} filled in
        endpoints = ctx.mirror.endpoints(ctx.resolved)
        index_url = index_url or secret(endpoints.get("PIP_INDEX_URL"))
        torch_index_url = torch_index_url or secret(endpoints.get("TORCH_INDEX_URL"))
    report = run_install(
        ctx,
        prefix,
        wheelhouse=wheelhouse,
        python=interpreter,
        index_url=index_url,
        torch_index_url=torch_index_url,
        force=force,
        say=say,
    )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(summary(report))
    if not report.ok:
        failed = next((s["step"] for s in report.steps if not s.get("ok")), "preflight --smoke")
        raise ActionError(
            f"envbuild install {profile} did not finish: {failed} failed (the report above says "
            "why and what fixes it)."
        )
