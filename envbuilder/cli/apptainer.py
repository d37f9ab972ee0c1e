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

import os
import re
from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.cli.options import load_matrix, override_options
from envbuilder.engines.apptainer import (
    HEADER,
    archive_digest,
    archive_path,
    definition,
    image_reference,
    ours,
)
from envbuilder.errors import ActionError, UserError
from envbuilder.render.outdir import write_text_atomic


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--image",
    metavar="REF@sha256:DIGEST",
    help="The pushed image, by digest (what `envbuild build --push` prints).",
)
@click.option(
    "--oci-archive",
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="An OCI archive of the image (as `envbuild export-image` writes), instead.",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
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
def apptainer(profile, image, oci_archive, out, mirror, force, overrides, matrix_dirs):
    """Write an Apptainer definition of PROFILE's image, for clusters without Docker:
    `apptainer build PROFILE.sif PROFILE.def`, then `apptainer run --nv PROFILE.sif`."""
    from envbuilder.model import mirrors as M
    from envbuilder.cli.options import plain_name
    from envbuilder.model.resolve import resolve

    # (as typed: Path('') would be '.', the current folder)
    for option, value in (("-o", out), ("--oci-archive", oci_archive)):
        if value is not None and not value:
            raise UserError(
                f"{option} is empty: give a file name"
                + (" (e.g. PROFILE.def)." if option == "-o" else " (the .tar `envbuild export-image` wrote).")
            )
    out = Path(out) if out is not None else None
    oci_archive = Path(oci_archive) if oci_archive is not None else None
    if bool(image) == bool(oci_archive):
        raise UserError(
            "Pass the image to start from: --image REF@sha256:DIGEST (what `envbuild "
            "build PROFILE --push REGISTRY` printed) or --oci-archive PATH (not "
            "both)."
        )
    if image:
        source, digest = image_reference(image)
        bootstrap = "docker"
    else:
        bootstrap = "oci-archive"
        full = archive_path(oci_archive)
        digest = archive_digest(full)
        source = str(full)
        if not full.exists():
            click.echo(f"note: {full} does not exist yet; `apptainer build` needs it there.", err=True)
    m = load_matrix(matrix_dirs)
    env = M.split_credentials(resolve(m, profile, overrides))[0]  # (no user:password@ in it)
    if mirror:
        env = M.apply_to_env(env, M.choice(mirror, M.get_set(m, mirror)))
    path = out if out is not None else Path(f"{plain_name(env.name, 'The profile name')}.def")
    if path.is_dir():
        raise UserError(
            f"{path} is a folder; -o names the definition file to write (e.g. {path / (env.name + '.def')})."
        )
    if (path.exists() or path.is_symlink()) and not force and not ours(path):
        raise UserError(
            f"{path} exists and envbuild did not write it (its first line is not "
            f"{HEADER!r}...), so it is left as it is. Pass --force to replace it, or "
            "-o another file."
        )
    if image and not re.search(rf"(^|/){re.escape(env.name)}(:[^/@]*)?@", source):
        click.echo(
            f"note: {source} is not named after profile {env.name}; the labels and "
            f"%environment describe {env.name} as resolved here. Check it is that image.",
            err=True,
        )
    text = definition(env, source, bootstrap, digest, path.name)
    if not path.parent.is_dir():
        raise UserError(
            f"The folder of {path} does not exist. Create it, or -o a file in an existing folder."
        )
    umask = os.umask(0)
    os.umask(umask)
    try:
        write_text_atomic(path, text, 0o666 & ~umask, fsync=True)  # (the mode `open` would give)
    except OSError as e:  # (its temporary file is gone again: nothing half-written stays)
        raise ActionError(
            f"Cannot write {path}: {e.strerror}. Check the free space and "
            f"permissions of {path.parent}, or -o a file elsewhere; nothing was "
            "written."
        ) from None
    sif = f"{path.stem}.sif"
    click.echo(
        f"wrote {path}: build it with `apptainer build {sif} {path}`, run it with `apptainer run --nv {sif}`",
        err=True,
    )
    click.echo(str(path))
