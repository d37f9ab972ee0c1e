"""`envbuild build`: render a profile, build it with BuildKit or podman/buildah (through a
mirror), smoke-test and push it (docker and requests load lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from envbuilder.cli.callbacks import AbsPath
from envbuilder.cli import complete
from envbuilder.cli.options import Dirs, load_matrix, override_options, passed_probes, say
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets_or_auto,
    help="Mirror set (or `auto`: the configured/first set whose registry answers).",
)
@click.option("--push", "push_to", metavar="REGISTRY", help="`local`, a configured name, or HOST[:PORT].")
@click.option("--tag", help="Image name:tag (default envbuild/<profile>:<spec hash>).")
@click.option(
    "--ca-cert",
    type=AbsPath(path_type=Path),
    help="CA bundle for TLS-intercepting networks (BuildKit secret).",
)
@click.option(
    "--pip-conf",
    type=AbsPath(path_type=Path),
    help="pip.conf for the build's pip "
    "steps (BuildKit secret): the builder stage and uv's own install; the runtime "
    "stage's uv steps take their indexes from --mirror.",
)
@click.option("--smoke/--no-smoke", default=True, show_default=True, help="Run imports in the built image.")
@click.option("--context", "keep_context", type=AbsPath(path_type=Path), help="Keep the build context here.")
@click.option("-v", "--verbose", is_flag=True, help="Show the whole build log.")
@click.option(
    "--wheelhouse",
    type=AbsPath(path_type=Path),
    metavar="DIR",
    help="pip installs only from this wheelhouse (envbuild wheelhouse): no index at all.",
)
@click.option(
    "--no-probe",
    is_flag=True,
    help="Do not probe the registries, indexes and GitHub "
    "before building (base images only the engine has, a network only the engine's "
    "proxy reaches).",
)
@click.option(
    "--builder",
    "builder",
    type=click.Choice(["auto", "docker", "podman", "buildah"]),
    default="auto",
    envvar=["ENVBUILD_BUILDER", "ENVBUILD_ENGINE"],
    show_default=True,
    help="What builds: docker (BuildKit), or daemonless podman or buildah. auto: docker "
    "when its client has BuildKit and the daemon answers, else podman, else buildah. "
    "(--engine is verl's training engine: fsdp or megatron.)",
)
@click.option(
    "--platform",
    "platforms",
    metavar="OS/ARCH[,...]",
    callback=lambda _ctx, _param, value: tuple(value.split(",")) if value is not None else (),
    help="Build for these OCI platforms (the profile's host's: linux/amd64, or linux/arm64 for "
    "GH200/GB200; another CPU's under QEMU) and push one manifest list by digest (needs --push).",
)
@override_options
def build(
    profile: str | None, no_probe: bool, overrides: Overrides, matrix_dirs: Dirs, **options: Any
) -> None:
    """Render PROFILE, build it with BuildKit or podman/buildah (through a mirror), smoke-test
    and push it.

    Without PROFILE: inside a rendered folder, the environment its envbuild.json holds (as
    `docker build .` takes the folder); elsewhere the profile `envbuild detect` picks for this
    machine."""
    from envbuilder.machine.build import BuildOptions, build_image, target_env
    from envbuilder.errors import need_extra

    need_extra("build", "actions")
    # (each option's parameter is named as its BuildOptions field: the options, listed once)
    opts = BuildOptions(**options, probe=not no_probe)
    m = load_matrix(matrix_dirs)
    env = target_env(m, profile, overrides, opts.wheelhouse, passed_probes(), say)
    click.echo(build_image(m, env, opts, say))
