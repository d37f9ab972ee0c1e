"""`envbuild refresh`: the matrix against PyPI's JSON API, and the fetching it needs (loads only
when used; requests is imported inside). The comparison itself is envbuilder/upstream/refresh.py.

Per release, the metadata comes from `/pypi/<name>/<version>/json`; where an index serves only
the project page (`/pypi/<name>/json`, as some mirrors and proxies do), from the release's
wheel: its `*.dist-info/METADATA`, read with HTTP range requests (a few hundred KB of a
400 MB wheel: the zip's directory and that one member), as pip's lazy wheel does.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from envbuilder.cli.callbacks import AbsPath, json_api_root
from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option, say
from envbuilder.errors import UserError
from envbuilder.upstream.pypi import DEFAULT_INDEX, PyPIJson  # noqa: F401  (cli.refresh.PyPIJson)


@click.command()
@click.option(
    "--index-url",
    default=DEFAULT_INDEX,
    show_default=True,
    callback=json_api_root,
    metavar="URL",
    help="Root of PyPI's JSON API (<URL>/pypi/<name>/json); a trailing /simple is dropped.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option(
    "--markdown",
    is_flag=True,
    help="The report as one Markdown code block (the "
    "refresh workflow's pull request body): nothing the index wrote renders there.",
)
@click.option(
    "--write-overlay",
    "overlay_dir",
    type=AbsPath(path_type=Path),
    metavar="DIR",
    help="Write DIR/refresh.yaml: a --matrix-dir overlay of the mechanical fixes, the "
    "rest as a commented TODO report, for review. matrices/ is never edited.",
)
@click.option(
    "--newest",
    default=3,
    show_default=True,
    type=click.IntRange(0, 50),
    help="Read the metadata of this many of the newest releases past the matrix's "
    "(torch, vllm, verl, flash-attn); older new ones are listed by version only.",
)
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1, 600),
    help="Seconds to wait for each answer of the index.",
)
@matrix_dir_option
def refresh(
    index_url: str,
    as_json: bool,
    markdown: bool,
    overlay_dir: Path | None,
    newest: int,
    timeout: float,
    matrix_dirs: Dirs,
) -> None:
    """What PyPI says now about torch, vllm, verl, flash-attn, transformers and ray, against the
    matrix: new releases, changed pins, contradicted facts. Prints the drift; edits nothing."""
    from envbuilder.upstream import refresh as R
    from envbuilder.upstream.commands import refresh_report

    if as_json and markdown:
        raise UserError("--json and --markdown are two forms of the one report; pass one.")
    report = refresh_report(
        load_matrix(matrix_dirs),
        index_url,
        newest=newest,
        timeout=timeout,
        overlay_dir=overlay_dir,
        matrix_dirs=matrix_dirs,
        say=(lambda t: None) if as_json else say,
    )
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(R.markdown(report) if markdown else R.text(report), nl=False)


@click.command()
@click.argument("overlay", type=AbsPath(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The profiles and what changed, as JSON.")
@matrix_dir_option
def affected(overlay: Path, as_json: bool, matrix_dirs: Dirs) -> None:
    """The profiles whose environment the matrix overlay OVERLAY changes (refresh's pull request
    runs `check --resolve` and `verify` on these): each profile resolved with and without it, and
    again with `--verl X` for every stack (stacks.yaml), compared field by field. A profile the
    overlay breaks is affected too. One name a line; nothing when the overlay changes nothing."""
    from envbuilder.upstream.commands import affected as changed

    found = changed(load_matrix(matrix_dirs), load_matrix((*matrix_dirs, overlay)))
    if as_json:
        click.echo(json.dumps({"overlay": str(overlay), "affected": found}, indent=2, sort_keys=True))
        return
    for name in found:
        click.echo(name)
