"""`envbuild wheelhouse`: export a lock's files for offline installs (requests loads lazily)."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, secret_url
from envbuilder.secret import SecretUrl
from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option


@click.command()
@click.argument("profiles", nargs=-1, required=True, shell_complete=complete.profiles)
@click.option(
    "-o",
    "--out",
    type=AbsPath(path_type=Path),
    required=True,
    help="Wheelhouse directory; several profiles exported into one share their files.",
)
@click.option(
    "--lock-dir",
    type=AbsPath(path_type=Path),
    help="The lock to export: DIR/<profile>/ as `envbuild lock -o DIR` writes it, or DIR "
    "itself when it is the lock (default lockfiles/<profile>); one profile only.",
)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    help="Try this mirror set's endpoints before the lock's own URLs.",
)
@click.option(
    "--url-map",
    multiple=True,
    metavar="FROM=TO",
    help="Try URL prefix TO before FROM (repeatable), e.g. an internal artifact proxy.",
)
@click.option(
    "--build-index-url",
    metavar="URL",
    envvar="ENVBUILD_BUILD_INDEX_URL",
    callback=secret_url,
    help="Index to fetch build backends (setuptools, ...) from when a lock's sdist is "
    "built into a wheel (default: --mirror's PyPI endpoint, else the index the "
    "lock was made from).",
)
@click.option("-j", "--jobs", default=8, show_default=True, help="Parallel downloads.")
@click.option("--tar", "make_tar", is_flag=True, help="Also pack OUT into OUT.tar to carry across.")
@click.option(
    "--accept-pypi-torch",
    is_flag=True,
    help="Export a lock solved with PyPI's torch "
    "in place of the profile's +cuXXX build (the PyTorch index was out of reach when it "
    "was made), knowing the wheelhouse then carries PyPI's torch and its CUDA.",
)
@click.option(
    "--accept-partial",
    is_flag=True,
    help="Export a lock that lacks a part the "
    "profile needs (the conda part, apex's or flash-attn's source), knowing the far "
    "side must fetch it.",
)
@matrix_dir_option
def wheelhouse(
    profiles: tuple[str, ...],
    out: Path,
    lock_dir: Path | None,
    mirror: str | None,
    url_map: tuple[str, ...],
    build_index_url: SecretUrl | None,
    jobs: int,
    make_tar: bool,
    accept_pypi_torch: bool,
    accept_partial: bool,
    matrix_dirs: Dirs,
) -> None:
    """Fetch every file PROFILE's lock pins (wheels, conda packages), verified, for offline installs.

    Every sdist the lock pins is built into a wheel for the lock's target here, so the far side
    builds nothing."""
    from envbuilder.errors import need_extra
    from envbuilder.offline.checks import url_maps
    from envbuilder.offline.wheelhouse import export_profiles

    from envbuilder.tools.uv import uv_bin

    # the `lock` extra, as the README says: requests fetches, uv builds the lock's sdists (both
    # checked before any file is fetched)
    need_extra("wheelhouse", "lock", ("requests",))
    uv_bin("wheelhouse")
    maps = url_maps(url_map)  # (a bad --url-map is refused before the matrix loads)
    m = load_matrix(matrix_dirs)
    report = export_profiles(
        m,
        list(profiles),
        out,
        say=lambda s: click.echo(s, err=True),
        lock_dir=lock_dir,
        mirror=mirror,
        url_map=maps,
        build_index=build_index_url,
        jobs=jobs,
        tar=make_tar,
        accept_pypi_torch=accept_pypi_torch,
        accept_partial=accept_partial,
    )
    click.echo(
        f"wheelhouse {out}/: {report.files} file(s), {len(report.downloaded)} downloaded "
        f"({report.bytes_transferred / 1e6:.1f} MB), {len(report.skipped)} already there, "
        f"{len(report.built)} wheel(s) built from sdists"
    )
    if report.tar:
        click.echo(f"packed {report.tar}")
