"""`envbuild diagnose`: read an environment envbuild did not build (or did), without running
its code, say what is wrong on this machine with a fix for each, and name the nearest profile
(envbuilder/machine/diagnose.py). Exit 0 clean, 1 findings, 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from envbuilder.cli.callbacks import AbsPath

from envbuilder.cli import complete
from envbuilder.cli.machine import probes_for
from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option

if TYPE_CHECKING:
    from envbuilder.machine.detect import Machine
    from envbuilder.machine.diagnose import Diagnosis
    from envbuilder.model.matrix import Matrix


@click.command()
@click.option(
    "--python",
    "python",
    type=AbsPath(path_type=Path, dir_okay=False),
    metavar="PATH",
    help="The environment's interpreter (PREFIX/bin/python); it is not run.",
)
@click.option(
    "--prefix",
    type=AbsPath(path_type=Path, file_okay=False),
    metavar="DIR",
    help="The environment's folder (a venv or a conda prefix).",
)
@click.option(
    "--image",
    metavar="REF",
    help="An image: the Docker engine's by that name, else the registry's (REGISTRY/NAME:TAG); its "
    "layers are read, each checked against its digest; nothing is pulled or run.",
)
@click.option(
    "--profile",
    shell_complete=complete.profiles,
    metavar="NAME",
    help="Judge against this profile (default: the one envbuild installed there, else the one "
    "for this machine's GPU that needs the fewest changes).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@matrix_dir_option
@click.pass_context
def diagnose(
    ctx: click.Context,
    python: Path | None,
    prefix: Path | None,
    image: str | None,
    profile: str | None,
    as_json: bool,
    matrix_dirs: Dirs,
) -> None:
    """What is wrong with an environment on this machine, the fix for each finding, and the
    nearest profile. Reads METADATA, torch's version.py and the extensions' ELF files; runs
    nothing of the environment. Exit 0 clean, 1 findings, 2 bad input.

    \b
    Examples:
      envbuild diagnose --python ~/venvs/rl/bin/python
      envbuild diagnose --prefix /opt/conda/envs/verl --profile p40 --json
    """
    from envbuilder.errors import ActionError, UserError, need_extra
    from envbuilder.machine.detect import detect
    from envbuilder.machine.diagnose import diagnose as judge, report_json, report_lines
    from envbuilder.machine.target import prefix_of, read_target
    from envbuilder.model.names import profile_named

    if sum(x is not None for x in (python, prefix, image)) != 1:
        raise UserError(
            "diagnose reads one environment: pass one of --python PATH (its bin/python), --prefix "
            "DIR (its folder) or --image REF (an image in the engine or a registry)."
        )
    if image is not None:
        need_extra("diagnose --image", "actions", ("requests",))  # (the registry client's)
    m = load_matrix(matrix_dirs)
    if profile is not None:
        named = profile_named(m, profile)
        if named is None:
            raise UserError(f"--profile {profile!r} is no profile of the matrix; `envbuild list` shows them.")
        profile = named.profile
    probes = probes_for(ctx, "diagnose")
    machine = detect(m, probes.nvml, probes.run)
    if image is not None:
        d = _image(m, image, machine, profile)
    else:
        where = prefix_of(python) if python is not None else Path(prefix or ".").absolute()
        d = judge(m, read_target(where), machine, profile)
    if as_json:
        click.echo(json.dumps(report_json(d), indent=2))
    else:
        for line in report_lines(d):
            click.echo(line)
    if d.findings:
        raise ActionError(
            f"{len(d.findings)} finding(s) in {d.target.image or d.target.where}: "
            + ", ".join(dict.fromkeys(f.rule for f in d.findings))
            + "; each names its fix above."
        )


def _image(m: Matrix, image: str, machine: Machine, profile: str | None) -> Diagnosis:
    """The image's files unpacked into a folder of ours (removed after), then judged as a prefix."""
    import shutil
    import tempfile

    from envbuilder.cli.options import say
    from envbuilder.machine.diagnose import diagnose as judge, read_host
    from envbuilder.machine.target import image_prefix, read_target, unpack_image
    from envbuilder.oci.registry import parse_image

    from envbuilder.errors import UserError
    from envbuilder.oci.reference import match

    if match(image) is None:  # (a malformed reference is refused before anything is fetched)
        raise UserError(
            f"--image {image!r} is not an image reference: give [REGISTRY/]NAME[:TAG][@sha256:DIGEST] "
            "(lowercase name components), e.g. --image 127.0.0.1:5000/envbuild/h200:TAG or the name "
            "of an image in the local engine."
        )
    parse_image(image)
    work = Path(tempfile.mkdtemp(prefix="envbuild-diagnose-"))
    try:
        root = work / "root"
        root.mkdir()
        origins = unpack_image(image, root, say)
        prefix = image_prefix(root)
        shown = "/" + str(prefix.relative_to(root))
        target = read_target(prefix)._replace(where=shown, origins=origins, image=image)
        return judge(m, target, machine, profile, read_host(prefix, root))
    finally:
        shutil.rmtree(work, ignore_errors=True)
