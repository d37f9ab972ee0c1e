"""`envbuild grid`: which choices resolve on which GPU, every cell the resolver's own verdict
(as `envbuild check` gives it), in the terminal or as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, driver_version, file_out
from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option


@click.command()
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="GPU",
    shell_complete=complete.gpus,
    help="Only this GPU (a key of the matrix's gpus, e.g. 4090, or a profile); repeat for more.",
)
@click.option(
    "--driver",
    metavar="VERSION",
    callback=driver_version,
    help="Check every cell against this NVIDIA driver version, e.g. 550.54.14.",
)
@click.option(
    "--html",
    "html_file",
    type=AbsPath(dir_okay=False),
    callback=file_out,
    metavar="FILE",
    help="Write the grid as one self-contained HTML page (no network: it can live on an "
    "air-gapped wiki), with a GPU and driver picker and each cell's rule, reason, sources "
    "and render command.",
)
@click.option(
    "--details",
    is_flag=True,
    help="Below the tables, each ~ cell's render command and each \u2717 cell's reason.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace the --html FILE even when envbuild did not write it or it was edited since.",
)
@matrix_dir_option
def grid(
    gpus: tuple[str, ...],
    driver: str | None,
    html_file: str | None,
    details: bool,
    force: bool,
    matrix_dirs: Dirs,
) -> None:
    """GPUs (rows) x the choices render's flags make (torch/CUDA, rollout and vLLM, verl,
    flash-attn, apex): \u2713 resolves, ~ resolves with a named override, \u2717 refused."""
    from envbuilder.render import grid as G

    m = load_matrix(matrix_dirs)
    if html_file is not None:
        # the page holds the verdicts without a driver; its picker applies one (--driver fills it in)
        found = G.build(m, tuple(gpus))
        write_page(Path(html_file), G.html(m, tuple(gpus), found, driver), force)
        n = sum(c.state in ("ok", "fix") for c in found.cells[None].values())
        click.echo(
            f"wrote {html_file}: {len(found.rows)} GPU rows x {len(found.columns)} choices, "
            f"{n} cells that resolve (as asked or with a named override)"
        )
        return
    found = G.build(m, tuple(gpus), (driver,))
    click.echo(G.text(found, driver))
    if details:
        click.echo("")
        for line in G.details(found, driver):
            click.echo(line)


def write_page(path: Path, text: str, force: bool = False) -> None:
    """The page whole or not at all, through the one owned-file writer (outdir.py): never
    through a link or over a device, a user's file or an edited page (unless --force)."""
    from envbuilder.render.outdir import write_owned_file

    write_owned_file(path, text, force=force, what="--html page", mark="no record of its bytes")
