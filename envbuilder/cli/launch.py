"""`envbuild launch slurm|kuberay|ray`: the files (and commands) that start a profile's run on
several nodes, on Slurm, on Kubernetes with KubeRay, or on a Ray cluster made by hand. The logic
is envbuilder/engines/launch.py; this only parses, resolves and writes."""

from __future__ import annotations

import os
from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.cli.options import load_matrix, override_options
from envbuilder.errors import ActionError, UserError


def _resolve(profile, overrides, matrix_dirs):
    from envbuilder.model import mirrors as M
    from envbuilder.model.resolve import resolve

    env = resolve(load_matrix(matrix_dirs), profile, overrides)
    return M.split_credentials(env)[0]  # (no user:password@ in what is written)


def _ours(path: Path, header: str, line: int) -> bool:
    """Whether `path` is a file this command wrote: its line `line` (0-based) starts with
    `header`."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).split(b"\n")
    except OSError:
        return False
    return len(head) > line and head[line].startswith(header.encode())


def _write(path: Path, text: str, header: str, line: int, force: bool, what: str) -> None:
    from envbuilder.render.outdir import write_text_atomic

    if path.is_dir():
        raise UserError(f"{path} is a folder; -o names the {what} to write.")
    if (path.exists() or path.is_symlink()) and not force and not _ours(path, header, line):
        raise UserError(
            f"{path} exists and envbuild did not write it (no {header!r} line), so it "
            "is left as it is. Pass --force to replace it, or -o another file."
        )
    if not path.parent.is_dir():
        raise UserError(
            f"The folder of {path} does not exist. Create it, or -o a file in an existing folder."
        )
    umask = os.umask(0)
    os.umask(umask)
    try:
        write_text_atomic(path, text, 0o666 & ~umask, fsync=True)
    except OSError as e:
        raise ActionError(
            f"Cannot write {path}: {e.strerror}. Check the free space and "
            f"permissions of {path.parent}, or -o a file elsewhere; nothing was "
            "written."
        ) from None


def _out(out, kind, profile) -> Path:
    from envbuilder.cli.options import plain_name
    from envbuilder.engines.launch import default_out

    if out is not None and not out:
        raise UserError("-o is empty: give a file name.")
    return Path(out) if out else default_out(kind, plain_name(profile, "The profile name"))


@click.group()
def launch():
    """Start a profile's run on several nodes: an sbatch script (slurm), a KubeRay RayJob
    (kuberay), or `ray start` commands (ray). Resolve with the same overrides as the render the
    image was built from (--nodes, --gpus-per-node, --algo, ...)."""


@launch.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--sif",
    metavar="PATH",
    help="The Apptainer image every node runs (`envbuild "
    "apptainer`, then `apptainer build`), on a path every node reads.",
)
@click.option(
    "--image",
    metavar="REF",
    help="A docker image every node runs instead "
    "(REGISTRY/NAME@sha256:DIGEST, or a tag the nodes' engines hold).",
)
@click.option("--job-name", metavar="NAME", help="Slurm's job name (default envbuild-PROFILE).")
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Where to write the script (default ./PROFILE.sbatch).",
)
@click.option("--force", is_flag=True, help="Replace FILE even when envbuild did not write it.")
@override_options
def slurm(profile, sif, image, job_name, out, force, overrides, matrix_dirs):
    """An sbatch script: Ray's head on the first node, workers on the others (srun, in the
    image), a wait until Ray sees every GPU, then the image's run script on the head."""
    from envbuilder.engines import launch as L

    if (sif is None) == (image is None):
        raise UserError(
            "Pass the image the nodes run: --sif PATH (Apptainer) or --image REF (docker), one of them."
        )
    sif = L.sif_path(sif) if sif is not None else None
    image = L.image_reference(image, digest=False) if image is not None else None
    env = _resolve(profile, overrides, matrix_dirs)
    job = L.job_name(job_name, env.profile)
    path = _out(out, "slurm", env.profile)
    text = L.slurm_script(env, sif=sif, image=image, job=job)
    _write(path, text, L.SLURM_HEADER, 1, force, "sbatch script")
    if sif and not Path(sif).exists():
        click.echo(f"note: {sif} does not exist here; every node must read it there.", err=True)
    click.echo(
        f"wrote {path}: submit it with `sbatch {path}` (the image must be built with "
        f"`{L.build_command(env)}`)",
        err=True,
    )
    click.echo(str(path))


@launch.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--image",
    required=True,
    metavar="REF@sha256:DIGEST",
    help="The pushed image, by digest (what `envbuild build --push` prints).",
)
@click.option("--job-name", metavar="NAME", help="The RayJob's name (default envbuild-PROFILE).")
@click.option(
    "--cpus", type=click.IntRange(1, 4096), metavar="N", help="CPUs of each pod (default 8 per GPU)."
)
@click.option(
    "--memory-gib",
    type=click.IntRange(1, 65536),
    metavar="GIB",
    help="Memory of each pod in GiB (default 32 per GPU).",
)
@click.option(
    "--shm-gib",
    type=click.IntRange(1, 65536),
    metavar="GIB",
    help="/dev/shm of each pod in GiB, a memory-backed emptyDir (default 30%% of the "
    "memory, what Ray's object store takes).",
)
@click.option(
    "--data-pvc",
    metavar="CLAIM",
    help="A ReadWriteMany PersistentVolumeClaim mounted "
    "at /data on every pod for the data set and the model cache (verl reads the data "
    "on whichever node its driver task lands).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Where to write the manifest (default ./PROFILE.rayjob.yaml).",
)
@click.option("--force", is_flag=True, help="Replace FILE even when envbuild did not write it.")
@override_options
def kuberay(
    profile, image, job_name, cpus, memory_gib, shm_gib, data_pvc, out, force, overrides, matrix_dirs
):
    """A KubeRay RayJob manifest: a head pod and N-1 worker pods of G GPUs each, the image by
    digest, /dev/shm sized for Ray, the run script as the entrypoint."""
    from envbuilder.engines import launch as L

    image = L.image_reference(image, digest=True)
    env = _resolve(profile, overrides, matrix_dirs)
    L.job_name(job_name, env.profile, kubernetes=True)
    path = _out(out, "kuberay", env.profile)
    text = L.rayjob_yaml(
        env, image, job=job_name, cpus=cpus, memory_gib=memory_gib, shm_gib=shm_gib, data_pvc=data_pvc
    )
    _write(path, text, L.KUBERAY_HEADER, 0, force, "manifest")
    if env.cluster.nodes > 1 and not data_pvc:
        click.echo(
            "note: verl reads the data set on the node its driver task lands on; give "
            "every pod the same data (--data-pvc CLAIM, or DATA_DIR on shared storage).",
            err=True,
        )
    click.echo(f"wrote {path}: start it with `kubectl apply -f {path}`", err=True)
    click.echo(str(path))


@launch.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--head-ip",
    metavar="ADDRESS",
    help="The head node's address the others reach (default: a HEAD_IP variable you set).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=6379,
    show_default=True,
    help="The head's Ray (GCS) port.",
)
@override_options
def ray(profile, head_ip, port, overrides, matrix_dirs):
    """Print `ray start` commands for a Ray cluster made by hand, and the run on its head."""
    from envbuilder.engines import launch as L

    head_ip = L.head_address(head_ip) if head_ip is not None else None
    env = _resolve(profile, overrides, matrix_dirs)
    click.echo(L.ray_commands(env, head_ip=head_ip, port=port), nl=False)
