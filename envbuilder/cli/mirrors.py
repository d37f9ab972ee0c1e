"""`envbuild mirrors list` and `envbuild mirrors probe`: the mirror sets and whether their
endpoints answer."""

from __future__ import annotations

import json

import click

from envbuilder.cli import complete

from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option


@click.group()
def mirrors() -> None:
    """Mirror sets: what each rewrites, and how healthy their endpoints are."""


@mirrors.command("list")
@click.option("--json", "as_json", is_flag=True)
@matrix_dir_option
def mirrors_list(as_json: bool, matrix_dirs: Dirs) -> None:
    """Shipped and configured mirror sets and what each rewrites."""
    from envbuilder.model import mirrors as M
    from envbuilder.model.config import config_path

    sets = M.mirror_sets(load_matrix(matrix_dirs))
    if as_json:  # (a set's endpoints may carry user:password@: shown as ***@, as logs show them)
        click.echo(json.dumps(M.redacted_sets(sets), indent=2, sort_keys=True))
        return
    for line in M.sets_lines(sets):
        click.echo(line)
    click.echo(f"(your own sets go in {config_path()} under `mirrors:`)")


@mirrors.command("probe")
@click.option(
    "--mirror", "name", shell_complete=complete.mirror_sets, required=True, help="Mirror set to probe."
)
@click.option("--timeout", default=5.0, show_default=True, help="Seconds per endpoint.")
@click.option("--json", "as_json", is_flag=True)
@matrix_dir_option
def mirrors_probe(name: str, timeout: float, as_json: bool, matrix_dirs: Dirs) -> None:
    """Health and latency of every endpoint of a set, probed in parallel."""
    from envbuilder.model import mirrors as M
    from envbuilder.errors import need_extra

    need_extra("mirrors probe", "actions", ("requests",))

    from envbuilder.oci.probe import run

    probes = run(M.probe_jobs(M.get_set(load_matrix(matrix_dirs), name)), timeout=timeout)
    if as_json:
        click.echo(M.redacted(json.dumps([p._asdict() for p in probes], indent=2)))
    else:
        for line in M.probe_table(probes):
            click.echo(line)
    if probes and not any(p.ok for p in probes):
        raise SystemExit(1)
