"""`envbuild list` and `envbuild show`: the profiles, and one resolved environment (its memory
plan term by term with --memory)."""

from __future__ import annotations

import json

import click

from envbuilder.cli import complete

from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option, override_options
from envbuilder.model.resolved import Overrides


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@matrix_dir_option
def list_(as_json: bool, matrix_dirs: Dirs) -> None:
    """Profiles with GPU, compute capability, CUDA, torch and rollout, one line each."""
    from envbuilder.render.summary import list_rows, list_table

    rows = list_rows(load_matrix(matrix_dirs))
    click.echo(json.dumps(rows, indent=2) if as_json else list_table(rows))


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option("--json", "as_json", is_flag=True, help="The resolved environment as JSON.")
@click.option(
    "--memory",
    is_flag=True,
    help="The memory budget per GPU, term by term, and the "
    "batch sizes it gives (with --json: the plan as JSON).",
)
@override_options
def show(profile: str, as_json: bool, memory: bool, overrides: Overrides, matrix_dirs: Dirs) -> None:
    """The resolved environment of PROFILE."""
    from envbuilder.render.summary import show_text

    click.echo(
        show_text(load_matrix(matrix_dirs), profile, overrides, memory=memory, as_json=as_json), nl=False
    )
