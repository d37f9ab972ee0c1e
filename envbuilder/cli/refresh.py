"""`envbuild refresh`: the matrix against PyPI's JSON API, and the fetching it needs (loads only
when used; requests is imported inside). The comparison itself is envbuilder/upstream/refresh.py.

Per release, the metadata comes from `/pypi/<name>/<version>/json`; where an index serves only
the project page (`/pypi/<name>/json`, as some mirrors and proxies do), from the release's
wheel: its `*.dist-info/METADATA`, read with HTTP range requests (a few hundred KB of a
400 MB wheel: the zip's directory and that one member), as pip's lazy wheel does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from envbuilder.cli.options import load_matrix, matrix_dir_option
from envbuilder.errors import EnvbuildError, UserError
from envbuilder.text import redact as redacted
from envbuilder.upstream.overlay import check_overlay_dir, sources_of, write_overlay
from envbuilder.upstream.pypi import DEFAULT_INDEX, PyPIJson  # noqa: F401  (cli.refresh.PyPIJson)


def _index_url(ctx, param, value):
    if value is not None and not value.strip():  # (a careless "$MIRROR" is no default)
        raise click.BadParameter(
            "is empty. Pass the root of an index that serves PyPI's JSON "
            f"API, or leave --index-url out for {DEFAULT_INDEX}."
        )
    value = (value or DEFAULT_INDEX).strip()
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise click.BadParameter(
            f"{value!r} is not an http(s) URL. Pass the root of an index "
            f"that serves PyPI's JSON API, e.g. {DEFAULT_INDEX}."
        )
    value = value.rstrip("/")
    return value[: -len("/simple")] if value.endswith("/simple") else value


@click.command()
@click.option(
    "--index-url",
    default=DEFAULT_INDEX,
    show_default=True,
    callback=_index_url,
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
    type=click.Path(path_type=Path),
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
def refresh(index_url, as_json, markdown, overlay_dir, newest, timeout, matrix_dirs):
    """What PyPI says now about torch, vllm, verl, flash-attn, transformers and ray, against the
    matrix: new releases, changed pins, contradicted facts. Prints the drift; edits nothing."""
    from envbuilder.upstream import refresh as R

    import importlib.util

    if importlib.util.find_spec("packaging") is None:  # (PyPI's requirement strings)
        raise UserError(
            "envbuild refresh reads PyPI's requirement strings (PEP 508) with the "
            "'packaging' package, which is not installed here. Install it: "
            "`pip install packaging`."
        )
    if as_json and markdown:
        raise UserError("--json and --markdown are two forms of the one report; pass one.")
    if overlay_dir is not None:
        check_overlay_dir(Path(overlay_dir), matrix_dirs)
    m = load_matrix(matrix_dirs)
    index = PyPIJson(index_url, timeout)
    shown = redacted(index_url)  # (an index URL's user:password@ is printed as ***@)
    say = (lambda text: None) if as_json else (lambda text: click.echo(text, err=True))
    say(f"reading {shown}/pypi/<name>/json for {', '.join(R.PACKAGES)} ...")
    projects = index.projects(R.PACKAGES)
    wanted = R.wanted_metadata(m, projects, newest)
    say(f"reading the metadata of {sum(map(len, wanted.values()))} releases ...")
    metadata = index.metadata_of(wanted, projects)
    report = {"index": shown, **R.compare(m, projects, metadata, where=m.where)}
    if overlay_dir is not None:
        path = write_overlay(Path(overlay_dir), R.overlay_text(report, m, sources_of(m)), matrix_dirs)
        report["overlay"] = str(path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(R.markdown(report) if markdown else R.text(report), nl=False)


@click.command()
@click.argument("overlay", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The profiles and what changed, as JSON.")
@matrix_dir_option
def affected(overlay, as_json, matrix_dirs):
    """The profiles whose environment the matrix overlay OVERLAY changes (refresh's pull request
    runs `check --resolve` and `verify` on these): each profile resolved with and without it, and
    again with `--verl X` for every stack (stacks.yaml), compared field by field. A profile the
    overlay breaks is affected too. One name a line; nothing when the overlay changes nothing."""
    from envbuilder.model.resolve import Overrides, resolve

    base, over = load_matrix(matrix_dirs), load_matrix((*matrix_dirs, overlay))
    stacks = sorted({*(base.sections.get("stacks") or {}), *(over.sections.get("stacks") or {})})
    found: dict[str, list[str]] = {}
    for name in over.profiles:
        for verl in (None, *stacks):
            ov = Overrides(verl=verl) if verl else Overrides()
            got = []
            for m in (base, over):
                try:
                    got.append(resolve(m, name, ov).to_dict() if name in m.profiles else None)
                except EnvbuildError as e:
                    got.append(f"refused: {str(e).splitlines()[0]}")
            if got[0] != got[1]:
                what = (
                    sorted(k for k in got[1] if got[0].get(k) != got[1].get(k))
                    if all(isinstance(g, dict) for g in got)
                    else [str(got[1])]
                )
                found.setdefault(name, []).append(
                    f"{'--verl ' + verl if verl else 'as shipped'}: {', '.join(what)}"
                )
    if as_json:
        click.echo(json.dumps({"overlay": str(overlay), "affected": found}, indent=2, sort_keys=True))
        return
    for name in found:
        click.echo(name)


# -- the overlay file ------------------------------------------------------------------------


# -- PyPI's JSON API -----------------------------------------------------------------------------
