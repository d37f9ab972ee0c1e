"""`envbuild export-image` and `envbuild import-image`: built images across an air gap as OCI
archives with a sidecar digest (skopeo does the copying; loads only when used)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import click

from envbuilder.cli.callbacks import AbsPath
from envbuilder.cli.options import load_matrix


def _say(msg: str) -> None:
    click.echo(msg, err=True)


@click.command("export-image")
@click.argument("image")
@click.option(
    "-o",
    "--out",
    type=AbsPath(dir_okay=False),
    required=True,
    metavar="FILE.tar",
    help="The OCI archive to write; its sidecar goes to FILE.tar.json.",
)
@click.option("--force", is_flag=True, help="Replace FILE.tar (and its sidecar) if they exist.")
@click.option("--json", "as_json", is_flag=True, help="Print the sidecar's data as JSON.")
def export_image(image: str, out: str, force: bool, as_json: bool) -> None:
    """Write IMAGE (an image in the Docker engine, e.g. envbuild/p40:abc, or HOST[:PORT]/NAME:TAG
    in a registry) as an OCI archive with its digest, to carry across an air gap with a
    wheelhouse; prints the manifest digest."""
    from envbuilder.errors import need_extra
    from envbuilder.engines.export import export_image as export
    from envbuilder.engines.archive import sidecar_path

    need_extra("export-image", "actions")  # (the engine's SDK, the registry client: exit 2, first)
    data = export(image, out, force, _say)  # (`out` as typed: an empty one is refused there)
    dest = Path(out)
    _say(
        f"wrote {dest} ({data['archive_size'] / 2**20:.1f} MiB, sha256 {data['archive_sha256']}) "
        f"and {sidecar_path(dest)}; load it with: envbuild import-image {dest}"
    )
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(data["manifest_digest"])


@click.command("import-image")
@click.argument("archive", type=AbsPath())
@click.option(
    "--registry",
    default="local",
    show_default=True,
    metavar="REGISTRY",
    help="`local`, a name from your config's `registries:`, or HOST[:PORT].",
)
@click.option(
    "--name", metavar="NAME:TAG", help="Repository and tag there (default: the name the archive recorded)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def import_image(archive: str, registry: str, name: str | None, as_json: bool) -> None:
    """Check ARCHIVE (from export-image) against its sidecar's sha256 and load it into a
    registry; prints REGISTRY/NAME@sha256:DIGEST."""
    from envbuilder.model.config import local_registry, registry_for
    from envbuilder.errors import need_extra
    from envbuilder.engines.archive import import_image as load

    need_extra("import-image", "actions", ("requests",))

    m = load_matrix(())
    host = registry_for(registry, local_registry(m))
    result = load(cast(Path, archive), host, name, _say)  # (as typed: the engine refuses '')
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        click.echo(result["reference"])
