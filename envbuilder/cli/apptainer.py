"""`envbuild apptainer`: an Apptainer (Singularity) definition file of a profile's image, for
clusters that run Apptainer rather than Docker.

The definition installs nothing: it starts from the image `envbuild build` pushed, by digest
(`Bootstrap: docker`, a tag can move), or from an OCI archive of it (`Bootstrap: oci-archive`),
and adds what Apptainer keeps beside the image: labels, the run-time environment the image's ENV
sets, a %test that is the build's own smoke test, and a %runscript that starts the launch script.
It is one file written where the user says (default ./<profile>.def), never into a render's
folder, whose files are tracked by its record.
"""

from __future__ import annotations

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, file_out
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--image",
    metavar="REF@sha256:DIGEST",
    help="The pushed image, by digest (what `envbuild build --push` prints).",
)
@click.option(
    "--oci-archive",
    type=AbsPath(dir_okay=False),
    metavar="PATH",
    help="An OCI archive of the image (as `envbuild export-image` writes), instead.",
)
@click.option(
    "-o",
    "--out",
    type=AbsPath(dir_okay=False),
    callback=file_out,
    metavar="FILE",
    help="Where to write the definition (default ./PROFILE.def).",
)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="The mirror set the image was built through: "
    "its Hugging Face endpoint goes into %environment (as in the image).",
)
@click.option("--force", is_flag=True, help="Replace FILE even when envbuild did not write it.")
@override_options
def apptainer(
    profile: str,
    image: str | None,
    oci_archive: str | None,
    out: str | None,
    mirror: str | None,
    force: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Write an Apptainer definition of PROFILE's image, for clusters without Docker:
    `apptainer build PROFILE.sif PROFILE.def`, then `apptainer run --nv PROFILE.sif`."""
    from envbuilder.engines.apptainer import write_definition

    m = load_matrix(matrix_dirs)
    path = write_definition(
        m,
        profile,
        overrides,
        image=image,
        oci_archive=oci_archive,
        out=out,
        mirror=mirror,
        force=force,
        say=say,
    )
    click.echo(str(path))
