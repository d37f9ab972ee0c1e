"""`envbuild launch slurm|kuberay|ray`: the files (and commands) that start a profile's run on
several nodes, on Slurm, on Kubernetes with KubeRay, or on a Ray cluster made by hand. The logic
is envbuilder/engines/launch.py; this only parses, resolves and writes."""

from __future__ import annotations

from typing import Any

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, file_out, not_empty
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.engines.launch import ray_text, write_kuberay, write_slurm
from envbuilder.model.resolved import Overrides


@click.group()
def launch() -> None:
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
    type=AbsPath(dir_okay=False),
    callback=file_out,
    metavar="FILE",
    help="Where to write the script (default ./PROFILE.sbatch).",
)
@click.option("--force", is_flag=True, help="Replace FILE even when envbuild did not write it.")
@override_options
def slurm(
    profile: str,
    sif: str | None,
    image: str | None,
    job_name: str | None,
    out: str | None,
    force: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """An sbatch script: Ray's head on the first node, workers on the others (srun, in the
    image), a wait until Ray sees every GPU, then the image's run script on the head."""
    m = load_matrix(matrix_dirs)
    path = write_slurm(
        m, profile, overrides, sif=sif, image=image, job=job_name, out=out, force=force, say=say
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
    callback=not_empty,
    help="A ReadWriteMany PersistentVolumeClaim mounted "
    "at /data on every pod for the data set and the model cache (verl reads the data "
    "on whichever node its driver task lands).",
)
@click.option(
    "-o",
    "--out",
    type=AbsPath(dir_okay=False),
    callback=file_out,
    metavar="FILE",
    help="Where to write the manifest (default ./PROFILE.rayjob.yaml).",
)
@click.option("--force", is_flag=True, help="Replace FILE even when envbuild did not write it.")
@override_options
def kuberay(
    profile: str,
    image: str,
    job_name: str | None,
    cpus: int | None,
    memory_gib: int | None,
    shm_gib: int | None,
    data_pvc: str | None,
    out: str | None,
    force: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """A KubeRay RayJob manifest: a head pod and N-1 worker pods of G GPUs each, the image by
    digest, /dev/shm sized for Ray, the run script as the entrypoint."""
    m = load_matrix(matrix_dirs)
    kw: dict[str, Any] = dict(job=job_name, cpus=cpus, memory_gib=memory_gib, shm_gib=shm_gib)
    kw.update(image=image, out=out, force=force, say=say, data_pvc=data_pvc)
    click.echo(str(write_kuberay(m, profile, overrides, **kw)))


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
def ray(profile: str, head_ip: str | None, port: int, overrides: Overrides, matrix_dirs: Dirs) -> None:
    """Print `ray start` commands for a Ray cluster made by hand, and the run on its head."""
    click.echo(ray_text(load_matrix(matrix_dirs), profile, overrides, head_ip=head_ip, port=port), nl=False)
